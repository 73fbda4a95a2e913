//! Label selectors as the drain rules read them: Kubernetes' semantics
//! (`matchLabels` and `matchExpressions` with `In`, `NotIn`, `Exists`,
//! `DoesNotExist`, every requirement must hold; an empty selector matches
//! everything), checked once when a rule is read, with each mistake named
//! by its field path so the webhook's denial can say where it is.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// One mistake in a rule: the field's path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub why: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.why)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    DoesNotExist,
}

/// A checked label selector.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    requirements: Vec<(String, Op)>,
}

impl Selector {
    /// Checks `selector` (found at `field`); absent is the empty selector.
    pub fn parse(
        selector: Option<&LabelSelector>,
        field: &str,
    ) -> Result<Selector, Vec<FieldError>> {
        let Some(s) = selector else {
            return Ok(Selector::default());
        };
        let mut errors = Vec::new();
        let mut requirements = Vec::new();
        for (key, value) in s.match_labels.iter().flatten() {
            let at = format!("{field}.matchLabels[{key:?}]");
            check_key(key, &at, &mut errors);
            check_value(value, &at, &mut errors);
            requirements.push((key.clone(), Op::In(BTreeSet::from([value.clone()]))));
        }
        for (i, e) in s.match_expressions.iter().flatten().enumerate() {
            let at = format!("{field}.matchExpressions[{i}]");
            check_key(&e.key, &format!("{at}.key"), &mut errors);
            let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
            for v in &values {
                check_value(v, &format!("{at}.values"), &mut errors);
            }
            let op = match (e.operator.as_str(), values.is_empty()) {
                ("In", false) => Op::In(values),
                ("NotIn", false) => Op::NotIn(values),
                ("Exists", true) => Op::Exists,
                ("DoesNotExist", true) => Op::DoesNotExist,
                ("In" | "NotIn", true) => {
                    errors.push(error(
                        &format!("{at}.values"),
                        "operator In and NotIn need at least one value",
                    ));
                    continue;
                }
                ("Exists" | "DoesNotExist", false) => {
                    errors.push(error(
                        &format!("{at}.values"),
                        "operator Exists and DoesNotExist take no values",
                    ));
                    continue;
                }
                (other, _) => {
                    errors.push(error(
                        &format!("{at}.operator"),
                        &format!(
                            "unknown operator {other:?}: use In, NotIn, Exists or DoesNotExist"
                        ),
                    ));
                    continue;
                }
            };
            requirements.push((e.key.clone(), op));
        }
        if errors.is_empty() {
            Ok(Selector { requirements })
        } else {
            Err(errors)
        }
    }

    /// Whether `labels` meet every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|(key, op)| match op {
            Op::In(values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Op::NotIn(values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Op::Exists => labels.contains_key(key),
            Op::DoesNotExist => !labels.contains_key(key),
        })
    }
}

fn error(field: &str, why: &str) -> FieldError {
    FieldError {
        field: field.to_string(),
        why: why.to_string(),
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at
/// most 63 characters (alphanumerics, `-`, `_`, `.`, alphanumeric at both ends).
fn check_key(key: &str, field: &str, errors: &mut Vec<FieldError>) {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    if !prefix_ok || name.is_empty() || !is_label_name(name) {
        errors.push(error(
            field,
            &format!(
                "{key:?} is not a valid label key: an optional DNS prefix and '/', then at most 63 \
                 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
            ),
        ));
    }
}

fn check_value(value: &str, field: &str, errors: &mut Vec<FieldError>) {
    if !value.is_empty() && !is_label_name(value) {
        errors.push(error(
            field,
            &format!(
                "{value:?} is not a valid label value: at most 63 letters, digits, '-', '_' or '.', \
                 starting and ending with a letter or digit"
            ),
        ));
    }
}

fn is_label_name(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    s.len() <= 63
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
        && s.starts_with(alnum)
        && s.ends_with(alnum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn sel(labels: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_labels: (!labels.is_empty()).then(|| {
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            match_expressions: (!exprs.is_empty()).then_some(exprs),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn matching() {
        let app_web = labels(&[("app", "web"), ("tier", "front")]);
        // (case, selector, labels, matches)
        type Row = (
            &'static str,
            Option<LabelSelector>,
            BTreeMap<String, String>,
            bool,
        );
        let cases: Vec<Row> = vec![
            ("absent matches all", None, labels(&[]), true),
            (
                "empty matches all",
                Some(sel(&[], vec![])),
                app_web.clone(),
                true,
            ),
            (
                "matchLabels hit",
                Some(sel(&[("app", "web")], vec![])),
                app_web.clone(),
                true,
            ),
            (
                "matchLabels miss",
                Some(sel(&[("app", "db")], vec![])),
                app_web.clone(),
                false,
            ),
            (
                "In",
                Some(sel(&[], vec![expr("app", "In", &["db", "web"])])),
                app_web.clone(),
                true,
            ),
            (
                "In, key absent",
                Some(sel(&[], vec![expr("x", "In", &["a"])])),
                app_web.clone(),
                false,
            ),
            (
                "NotIn",
                Some(sel(&[], vec![expr("app", "NotIn", &["web"])])),
                app_web.clone(),
                false,
            ),
            (
                "NotIn, key absent",
                Some(sel(&[], vec![expr("x", "NotIn", &["a"])])),
                app_web.clone(),
                true,
            ),
            (
                "Exists",
                Some(sel(&[], vec![expr("tier", "Exists", &[])])),
                app_web.clone(),
                true,
            ),
            (
                "DoesNotExist",
                Some(sel(&[], vec![expr("tier", "DoesNotExist", &[])])),
                app_web.clone(),
                false,
            ),
            (
                "every requirement must hold",
                Some(sel(&[("app", "web")], vec![expr("tier", "In", &["back"])])),
                app_web.clone(),
                false,
            ),
        ];
        for (name, s, l, want) in cases {
            let parsed =
                Selector::parse(s.as_ref(), "spec").unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!(parsed.matches(&l), want, "{name}");
        }
    }

    #[test]
    fn mistakes_are_named_by_field() {
        // (case, selector, the field and words of the first error)
        let cases: Vec<(&str, LabelSelector, &str, &str)> = vec![
            (
                "unknown operator",
                sel(&[], vec![expr("a", "Equals", &["x"])]),
                "spec.matchExpressions[0].operator",
                "unknown operator \"Equals\"",
            ),
            (
                "In without values",
                sel(&[], vec![expr("a", "In", &[])]),
                "spec.matchExpressions[0].values",
                "need at least one value",
            ),
            (
                "Exists with values",
                sel(&[], vec![expr("a", "Exists", &["x"])]),
                "spec.matchExpressions[0].values",
                "take no values",
            ),
            (
                "bad key",
                sel(&[], vec![expr("-a", "Exists", &[])]),
                "spec.matchExpressions[0].key",
                "not a valid label key",
            ),
            (
                "bad prefix",
                sel(&[("Example.com/a", "x")], vec![]),
                "spec.matchLabels[\"Example.com/a\"]",
                "not a valid label key",
            ),
            (
                "bad value",
                sel(&[("a", "x y")], vec![]),
                "spec.matchLabels[\"a\"]",
                "not a valid label value",
            ),
            (
                "second expression",
                sel(&[], vec![expr("a", "Exists", &[]), expr("b", "In", &[])]),
                "spec.matchExpressions[1].values",
                "need at least one value",
            ),
        ];
        for (name, s, field, words) in cases {
            let errors = Selector::parse(Some(&s), "spec").expect_err(name);
            assert_eq!(errors[0].field, field, "{name}: {errors:?}");
            assert!(errors[0].why.contains(words), "{name}: {errors:?}");
        }
        let good = sel(
            &[("example.com/pool", "storage"), ("empty", "")],
            vec![expr("k8s.io/x", "NotIn", &["a.b_c-d"])],
        );
        assert!(Selector::parse(Some(&good), "spec").is_ok());
    }
}
