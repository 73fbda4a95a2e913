//! Go `flag` command-line syntax on top of clap, so the argument lists written
//! for upstream's controller-runtime binaries work unchanged.
//!
//! Go accepts `-name` as well as `--name`, `-name=value` and `-name value` for
//! non-boolean flags, `--flag`, `--flag=true` and `--flag=false` for booleans
//! (never `--flag false`: a boolean only takes a value after `=`), and the last
//! occurrence of a repeated flag wins. clap does the parsing; [`normalize`]
//! rewrites single-dash long names to double-dash first, boolean flags are
//! declared with [`GoBoolFlag::go_bool_default`] (see the example on it) and
//! every `Config` sets `args_override_self = true`.
//!
//! Limit: a value that itself starts with `-` must be given as `--name=-value`
//! (Go would also take it after a space); none of our flags has such values.

use std::ffi::OsString;

use clap::{Arg, ArgAction};

/// Rewrite single-dash long flags (`-leader-elect`, `-zap-log-level=debug`)
/// to clap's double-dash form. Left alone: the program name, short flags
/// (`-h`), everything after `--`, and anything that is not a flag name
/// (`-1`, `-`, values).
pub fn normalize<I, T>(args: I) -> Vec<OsString>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let mut out = Vec::new();
    let mut rest_is_positional = false;
    for (i, arg) in args.into_iter().enumerate() {
        let arg: OsString = arg.into();
        if i == 0 || rest_is_positional {
            out.push(arg);
            continue;
        }
        if arg == "--" {
            rest_is_positional = true;
            out.push(arg);
            continue;
        }
        out.push(match arg.to_str() {
            Some(s) if is_single_dash_long(s) => OsString::from(format!("-{s}")),
            _ => arg,
        });
    }
    out
}

/// `-name` or `-name=value` with a name of two or more characters that
/// starts with a letter.
fn is_single_dash_long(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('-') else {
        return false;
    };
    if rest.starts_with('-') {
        return false;
    }
    let name = rest.split_once('=').map_or(rest, |(n, _)| n);
    name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// A boolean flag in Go's syntax, declared in one attribute:
///
/// ```ignore
/// use shared::serve::goflags::GoBoolFlag as _;
///
/// #[arg(long, env = "LEADER_ELECT", go_bool_default = false)]
/// pub leader_elect: bool,
/// ```
///
/// so `--leader-elect` (and `-leader-elect`, after [`normalize`]) means true,
/// `--leader-elect=false` false (any [`go_bool`] spelling after `=`), no
/// flag the default, and `--leader-elect false` is an error (Go would take
/// `false` as a positional argument). clap's derive applies the attribute
/// after its own settings for a `bool` field, so these win.
pub trait GoBoolFlag {
    /// Take a value only after `=`, parsed by [`go_bool`]; `true` when
    /// given bare, `default` when absent.
    fn go_bool_default(self, default: bool) -> Self;
}

impl GoBoolFlag for Arg {
    fn go_bool_default(self, default: bool) -> Self {
        self.default_value(if default { "true" } else { "false" })
            .value_parser(go_bool)
            .action(ArgAction::Set)
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value("true")
    }
}

/// Go's `strconv.ParseBool`, as a clap value parser (see [`GoBoolFlag`]).
pub fn go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        other => Err(format!(
            "{other:?} is not a boolean; use true or false (or 1, t, T, TRUE, True, 0, f, F, FALSE, False)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn norm(args: &[&str]) -> Vec<String> {
        normalize(args.iter().copied())
            .into_iter()
            .map(|a| a.into_string().expect("utf8"))
            .collect()
    }

    #[test]
    fn single_dash_long_names_become_double_dash() {
        assert_eq!(
            norm(&[
                "prog",
                "-leader-elect",
                "-zap-log-level=debug",
                "-metrics-bind-address",
                ":8443"
            ]),
            [
                "prog",
                "--leader-elect",
                "--zap-log-level=debug",
                "--metrics-bind-address",
                ":8443"
            ]
        );
    }

    #[test]
    fn short_flags_values_and_positionals_are_left_alone() {
        assert_eq!(
            norm(&["-prog", "-h", "--x", "-", "-1", "-5s", "--", "-after"]),
            ["-prog", "-h", "--x", "-", "-1", "-5s", "--", "-after"]
        );
        // Not a flag name: left for clap to reject with its own message.
        assert_eq!(norm(&["p", "-a b", "-=x"]), ["p", "-a b", "-=x"]);
    }

    #[test]
    fn go_bool_spellings() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(go_bool(t), Ok(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(go_bool(f), Ok(false), "{f}");
        }
        for bad in ["yes", "tRUE", "", "2", "on"] {
            let err = go_bool(bad).expect_err(bad);
            assert!(err.contains("true or false"), "{err}");
        }
    }

    #[derive(Parser, Debug)]
    #[command(args_override_self = true)]
    struct Demo {
        #[arg(long, go_bool_default = false)]
        flag: bool,
        #[arg(long, go_bool_default = true)]
        on_by_default: bool,
        #[arg(long, default_value = "a")]
        name: String,
    }

    fn demo(args: &[&str]) -> Result<Demo, clap::Error> {
        let mut full = vec!["demo"];
        full.extend_from_slice(args);
        Demo::try_parse_from(normalize(full))
    }

    #[test]
    fn every_go_syntax_parses() {
        let d = demo(&[]).expect("defaults");
        assert!(!d.flag && d.on_by_default && d.name == "a");
        assert!(demo(&["--flag"]).expect("bare").flag);
        assert!(demo(&["-flag"]).expect("single dash").flag);
        assert!(demo(&["--flag=true"]).expect("=true").flag);
        assert!(demo(&["-flag=T"]).expect("=T").flag);
        assert!(!demo(&["--flag=false"]).expect("=false").flag);
        assert!(!demo(&["--on-by-default=0"]).expect("=0").on_by_default);
        assert!(
            !demo(&["-on-by-default=false"])
                .expect("-x=false")
                .on_by_default
        );
        assert!(demo(&["--on-by-default"]).expect("bare").on_by_default);
        assert_eq!(demo(&["-name", "b"]).expect("-name v").name, "b");
        assert_eq!(demo(&["-name=c"]).expect("-name=v").name, "c");
        assert_eq!(demo(&["--name", "d"]).expect("--name v").name, "d");
    }

    #[test]
    fn the_last_occurrence_wins() {
        let d = demo(&["--flag", "--flag=false", "--name=x", "-name=y"]).expect("repeats");
        assert!(!d.flag);
        assert_eq!(d.name, "y");
        assert!(demo(&["--flag=false", "-flag"]).expect("repeats").flag);
    }

    #[test]
    fn a_boolean_takes_no_separate_value_and_bad_values_are_named() {
        // Go stops at "false" (a positional); clap rejects it: no silent "true".
        assert!(demo(&["--flag", "false"]).is_err());
        // Go's ParseBool("") fails too.
        assert!(demo(&["--flag="]).is_err());
        let err = demo(&["--flag=maybe"]).expect_err("bad bool").to_string();
        assert!(
            err.contains("--flag") && err.contains("true or false"),
            "{err}"
        );
    }
}
