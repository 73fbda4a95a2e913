//! `nmo-certs`: create a CA, issue webhook serving certificates from it, and
//! print the caBundle. Thin wrapper over the `certs` library.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use certs::{CA_CRT, CA_KEY, Ca, CertError, OLM_CRT, OLM_KEY, TLS_CRT, TLS_KEY};
use clap::{Parser, Subcommand, ValueEnum};

const DAY: Duration = Duration::from_secs(24 * 60 * 60);
const DEFAULT_CA_CN: &str = "nmo-webhook-ca";

#[derive(Parser)]
#[command(
    name = "nmo-certs",
    version,
    about = "Create a CA and webhook serving certificates for the Node Maintenance Operator",
    long_about = "Create a CA and webhook serving certificates for the Node Maintenance Operator.\n\n\
        Typical local setup:\n  \
        nmo-certs serving --ca-dir .certs/ca --out .certs/webhook --dns nmo-webhook.nmo-system.svc --ip 127.0.0.1\n  \
        nmo-certs ca-bundle --ca-dir .certs/ca\n\n\
        Running `serving` again on the same --out directory rotates the certificate the way \
        kubelet updates a mounted Secret."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a self-signed CA and write ca.crt and ca.key (plain files) to --out.
    Ca {
        /// Directory to write ca.crt and ca.key to (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Common name of the CA certificate.
        #[arg(long, value_name = "NAME", default_value = DEFAULT_CA_CN)]
        cn: String,
        /// How many days the CA is valid.
        #[arg(long, value_name = "N", default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36500))]
        days: u32,
        /// Replace a CA that already exists in --out. Without it an existing CA
        /// is kept, because replacing it invalidates every certificate it issued
        /// and every caBundle that names it.
        #[arg(long)]
        force: bool,
    },
    /// Issue a serving certificate (server auth) from the CA in --ca-dir and
    /// write it to --out. The CA is created there first if it does not exist.
    Serving {
        /// Directory holding ca.crt and ca.key; a new CA is created there if
        /// both are missing.
        #[arg(long, value_name = "DIR")]
        ca_dir: PathBuf,
        /// Directory to write the certificate to (created if missing). Writing
        /// to the same directory again rotates the certificate.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// DNS name to put in the certificate's SANs; repeat the flag or separate
        /// with commas. The first one is also the common name.
        #[arg(long = "dns", value_name = "NAME", num_args = 1.., value_delimiter = ',')]
        dns: Vec<String>,
        /// IP address to put in the certificate's SANs; repeat the flag or
        /// separate with commas. The common name when no --dns is given.
        #[arg(long = "ip", value_name = "IP", num_args = 1.., value_delimiter = ',')]
        ip: Vec<IpAddr>,
        /// How many days the serving certificate is valid.
        #[arg(long, value_name = "N", default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=36500))]
        days: u32,
        /// How to lay out the files in --out: `kubelet` writes tls.crt, tls.key
        /// and ca.crt as a mounted Secret looks (..data symlink swap); `olm`
        /// writes apiserver.crt and apiserver.key the same way; `plain` writes
        /// tls.crt, tls.key and ca.crt as regular files.
        #[arg(long, value_enum, default_value_t = Layout::Kubelet)]
        layout: Layout,
        /// Common name for the CA if one has to be created.
        #[arg(long, value_name = "NAME", default_value = DEFAULT_CA_CN)]
        ca_cn: String,
        /// Validity in days for the CA if one has to be created.
        #[arg(long, value_name = "N", default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36500))]
        ca_days: u32,
    },
    /// Print the base64 caBundle of the CA in --ca-dir (the value of a webhook
    /// configuration's clientConfig.caBundle).
    CaBundle {
        /// Directory holding ca.crt.
        #[arg(long, value_name = "DIR")]
        ca_dir: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Layout {
    /// tls.crt, tls.key, ca.crt in the kubelet secret-volume layout.
    Kubelet,
    /// apiserver.crt, apiserver.key in the kubelet secret-volume layout.
    Olm,
    /// tls.crt, tls.key, ca.crt as regular files.
    Plain,
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("nmo-certs: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<(), CertError> {
    match command {
        Command::Ca {
            out,
            cn,
            days,
            force,
        } => {
            if !force && out.join(CA_CRT).exists() {
                println!(
                    "kept existing CA {} (pass --force to replace it)",
                    out.join(CA_CRT).display()
                );
                return Ok(());
            }
            create_ca(&out, &cn, days)?;
            Ok(())
        }
        Command::Serving {
            ca_dir,
            out,
            dns,
            ip,
            days,
            layout,
            ca_cn,
            ca_days,
        } => {
            if dns.is_empty() && ip.is_empty() {
                return Err(CertError::NoSubjectNames);
            }
            let ca = load_or_create_ca(&ca_dir, &ca_cn, ca_days)?;
            let cert = ca.issue_serving(&dns, &ip, DAY * days)?;
            write_serving(&out, &ca, &cert, layout)
        }
        Command::CaBundle { ca_dir } => {
            let path = ca_dir.join(CA_CRT);
            let cert = read(&path)?;
            // Fail here rather than hand the API server a bundle it cannot use.
            certs::not_after(&cert).map_err(|e| match e {
                CertError::InvalidPem { reason, .. } => CertError::InvalidPem {
                    what: path.display().to_string(),
                    reason,
                    remedy: "point --ca-dir at a directory written by `nmo-certs ca`",
                },
                other => other,
            })?;
            println!("{}", certs::ca_bundle_base64(&cert));
            Ok(())
        }
    }
}

/// Write `cert` (issued by `ca`) into `out` in `layout`, saying each file.
fn write_serving(
    out: &Path,
    ca: &Ca,
    cert: &certs::ServingCert,
    layout: Layout,
) -> Result<(), CertError> {
    let names: &[&str] = match layout {
        Layout::Kubelet => {
            certs::write_serving_set(out, ca, cert)?;
            &[TLS_CRT, TLS_KEY, CA_CRT]
        }
        Layout::Olm => {
            certs::write_olm_set(out, cert)?;
            &[OLM_CRT, OLM_KEY]
        }
        Layout::Plain => {
            certs::write_plain_files(out, &certs::serving_files(ca, cert))?;
            &[TLS_CRT, TLS_KEY, CA_CRT]
        }
    };
    let how = match layout {
        Layout::Kubelet | Layout::Olm => " (kubelet layout, via ..data)",
        Layout::Plain => "",
    };
    for name in names {
        println!("wrote {}{how}", out.join(name).display());
    }
    Ok(())
}

fn create_ca(dir: &Path, cn: &str, days: u32) -> Result<Ca, CertError> {
    let ca = Ca::new(cn, DAY * days)?;
    certs::write_plain_files(
        dir,
        &[
            (CA_CRT, ca.cert_pem().as_bytes()),
            (CA_KEY, ca.key_pem().as_bytes()),
        ],
    )?;
    println!("wrote {}", dir.join(CA_CRT).display());
    println!("wrote {}", dir.join(CA_KEY).display());
    Ok(ca)
}

fn load_or_create_ca(dir: &Path, cn: &str, days: u32) -> Result<Ca, CertError> {
    let (crt, key) = (dir.join(CA_CRT), dir.join(CA_KEY));
    match (crt.exists(), key.exists()) {
        (true, true) => Ca::from_pem(&read(&crt)?, &read(&key)?),
        (false, false) => create_ca(dir, cn, days),
        (true, false) => Err(CertError::IncompleteCa {
            present: crt,
            missing: key,
        }),
        (false, true) => Err(CertError::IncompleteCa {
            present: key,
            missing: crt,
        }),
    }
    .map_err(|e| in_dir(e, dir))
}

/// Says which directory a CA that does not load came from.
fn in_dir(err: CertError, dir: &Path) -> CertError {
    match err {
        CertError::InvalidPem {
            what,
            reason,
            remedy,
        } => CertError::InvalidPem {
            what: format!("{what} in {}", dir.display()),
            reason,
            remedy,
        },
        other => other,
    }
}

fn read(path: &Path) -> Result<String, CertError> {
    std::fs::read_to_string(path).map_err(|source| CertError::Io {
        operation: "reading",
        path: path.to_owned(),
        source,
    })
}
