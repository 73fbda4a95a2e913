//! The one error type of this crate. Every message names what failed (a file,
//! a directory or an operation) and what to do about it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused to build or sign a certificate.
    #[error("{operation} failed: {source}; check the names and validity passed in")]
    Generate {
        operation: String,
        #[source]
        source: rcgen::Error,
    },

    /// A PEM blob given to us (CA certificate or key, or a certificate whose
    /// expiry was asked for) could not be used.
    #[error("{what} is not usable: {reason}; {remedy}")]
    InvalidPem {
        what: String,
        reason: String,
        remedy: &'static str,
    },

    /// Only one of ca.crt / ca.key exists; creating a new CA would orphan the other.
    #[error(
        "{present} exists but {missing} does not; restore {missing}, or remove {present} to let a new CA be created"
    )]
    IncompleteCa { present: PathBuf, missing: PathBuf },

    /// A serving certificate needs at least one subject name.
    #[error(
        "issuing a serving certificate needs at least one DNS name or IP address; pass --dns and/or --ip"
    )]
    NoSubjectNames,

    /// A DNS name that cannot go into a certificate SAN.
    #[error(
        "DNS name {name:?} cannot be put in a certificate: {reason}; use a plain DNS name such as nmo-webhook.nmo-system.svc"
    )]
    InvalidDnsName { name: String, reason: String },

    /// A validity that does not fit a certificate.
    #[error(
        "validity of {requested:?} for {what} is out of range; use between one minute and 100 years"
    )]
    InvalidValidity {
        what: String,
        requested: std::time::Duration,
    },

    /// A file name for the secret-volume layout that would escape the directory
    /// or clash with the layout's own entries.
    #[error("file name {name:?} cannot be used in a secret-volume layout: {reason}")]
    InvalidFileName { name: String, reason: String },

    /// A filesystem operation failed.
    #[error("{operation} {path}: {source}; check the path and its permissions")]
    Io {
        operation: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl CertError {
    pub(crate) fn io(
        operation: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> CertError {
        let path = path.into();
        move |source| CertError::Io {
            operation,
            path,
            source,
        }
    }
}
