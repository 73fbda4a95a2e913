//! The certificate authority and the serving certificates it issues.

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData as _, SanType,
};
use time::OffsetDateTime;

use crate::CertError;

/// Certificates start this long before "now", so a peer whose clock is a little
/// behind ours does not reject a freshly issued certificate.
const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(5 * 60);
const CA_REMEDY: &str =
    "pass the ca.crt/ca.key pair written together, or create a new CA with `nmo-certs ca --force`";
const MIN_VALIDITY: Duration = Duration::from_secs(60);
const MAX_VALIDITY: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// A self-signed CA that can issue serving certificates.
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A serving certificate and its private key, both PEM.
#[derive(Clone)]
pub struct ServingCert {
    pub cert_pem: String,
    pub key_pem: String,
}

// Keys stay out of logs and panic messages.
impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// Generates a new ECDSA P-256 CA valid for `validity` from now.
    pub fn new(common_name: &str, validity: Duration) -> Result<Ca, CertError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(common_name);
        // Path length 0: this CA signs leaf certificates only.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, "the CA", validity)?;

        let key = KeyPair::generate().map_err(generate_err("generating the CA key"))?;
        let cert = params
            .self_signed(&key)
            .map_err(generate_err("self-signing the CA certificate"))?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// Reloads a CA written earlier (for example by `nmo-certs ca`).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, CertError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| CertError::InvalidPem {
            what: "the CA key (ca.key)".into(),
            reason: e.to_string(),
            remedy: CA_REMEDY,
        })?;
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).map_err(|e| {
            CertError::InvalidPem {
                what: "the CA certificate (ca.crt)".into(),
                reason: format!("not a PEM certificate: {e}"),
                remedy: CA_REMEDY,
            }
        })?;
        let x509 = pem.parse_x509().map_err(|e| CertError::InvalidPem {
            what: "the CA certificate (ca.crt)".into(),
            reason: format!("not an X.509 certificate: {e}"),
            remedy: CA_REMEDY,
        })?;
        if !x509.is_ca() {
            return Err(CertError::InvalidPem {
                what: "the CA certificate (ca.crt)".into(),
                reason: "it is not a CA certificate (basicConstraints CA:FALSE or missing)".into(),
                remedy: CA_REMEDY,
            });
        }
        // A key that does not belong to the certificate would sign leaves no
        // client can verify; catch that here rather than at the first handshake.
        if x509.public_key().raw != key.subject_public_key_info().as_slice() {
            return Err(CertError::InvalidPem {
                what: "the CA key (ca.key)".into(),
                reason: "it does not match the public key in ca.crt".into(),
                remedy: CA_REMEDY,
            });
        }
        let issuer =
            Issuer::from_ca_cert_pem(cert_pem, key).map_err(|e| CertError::InvalidPem {
                what: "the CA certificate (ca.crt)".into(),
                reason: e.to_string(),
                remedy: CA_REMEDY,
            })?;
        Ok(Ca {
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            issuer,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Issues a serving (server auth) certificate with a fresh key. SANs are
    /// exactly `dns_names` and `ips`; the CN is the first DNS name, or the first
    /// IP when there is no DNS name.
    pub fn issue_serving(
        &self,
        dns_names: &[String],
        ips: &[IpAddr],
        validity: Duration,
    ) -> Result<ServingCert, CertError> {
        let common_name = match (dns_names.first(), ips.first()) {
            (Some(dns), _) => dns.clone(),
            (None, Some(ip)) => ip.to_string(),
            (None, None) => return Err(CertError::NoSubjectNames),
        };

        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(&common_name);
        params.subject_alt_names = dns_names
            .iter()
            .map(|name| {
                check_dns_name(name)?;
                name.clone()
                    .try_into()
                    .map(SanType::DnsName)
                    .map_err(|e: rcgen::Error| CertError::InvalidDnsName {
                        name: name.clone(),
                        reason: e.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        params
            .subject_alt_names
            .extend(ips.iter().copied().map(SanType::IpAddress));
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, "the serving certificate", validity)?;

        let key = KeyPair::generate().map_err(generate_err("generating the serving key"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(generate_err("signing the serving certificate with the CA"))?;
        Ok(ServingCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Base64 of the CA PEM: the value a webhook configuration's `caBundle` takes.
pub fn ca_bundle_base64(ca_pem: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes())
}

/// The notAfter time of the first certificate in `cert_pem`.
pub fn not_after(cert_pem: &str) -> Result<SystemTime, CertError> {
    let invalid = |reason: String| CertError::InvalidPem {
        what: "the certificate whose expiry was asked for".into(),
        reason,
        remedy: "pass a PEM certificate (-----BEGIN CERTIFICATE-----)",
    };
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| invalid(format!("not a PEM certificate: {e}")))?;
    let x509 = pem
        .parse_x509()
        .map_err(|e| invalid(format!("not an X.509 certificate: {e}")))?;
    let secs = x509.validity().not_after.timestamp();
    let offset = Duration::from_secs(secs.unsigned_abs());
    let time = if secs >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(offset)
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(offset)
    };
    time.ok_or_else(|| invalid(format!("notAfter ({secs} s since 1970) is out of range")))
}

/// Hostname syntax (RFC 1123 labels, an optional leading `*.` wildcard):
/// anything else could be signed but no TLS client would ever match it.
fn check_dns_name(name: &str) -> Result<(), CertError> {
    let invalid = |reason: &str| CertError::InvalidDnsName {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    let host = name.strip_prefix("*.").unwrap_or(name);
    if host.is_empty() || name.len() > 253 {
        return Err(invalid("it must be 1 to 253 characters"));
    }
    for label in host.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(invalid(
                "each dot-separated label must be 1 to 63 characters",
            ));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(invalid("only letters, digits, '-' and '.' are allowed"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(invalid("a label cannot start or end with '-'"));
        }
    }
    Ok(())
}

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

fn set_validity(
    params: &mut CertificateParams,
    what: &str,
    validity: Duration,
) -> Result<(), CertError> {
    let out_of_range = || CertError::InvalidValidity {
        what: what.to_owned(),
        requested: validity,
    };
    if !(MIN_VALIDITY..=MAX_VALIDITY).contains(&validity) {
        return Err(out_of_range());
    }
    let now = OffsetDateTime::now_utc();
    let skew = time::Duration::try_from(CLOCK_SKEW_ALLOWANCE).map_err(|_| out_of_range())?;
    let lifetime = time::Duration::try_from(validity).map_err(|_| out_of_range())?;
    params.not_before = now - skew;
    params.not_after = now.checked_add(lifetime).ok_or_else(out_of_range)?;
    Ok(())
}

fn generate_err(operation: &'static str) -> impl FnOnce(rcgen::Error) -> CertError {
    move |source| CertError::Generate {
        operation: operation.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 60 * 60);

    fn ca() -> Ca {
        Ca::new("nmo-test-ca", 10 * DAY).expect("CA")
    }

    #[test]
    fn not_after_is_now_plus_validity() {
        let cert = ca()
            .issue_serving(&["a.example".into()], &[], 30 * DAY)
            .expect("issue");
        let expected = SystemTime::now() + 30 * DAY;
        let got = not_after(&cert.cert_pem).expect("not_after");
        let diff = match got.duration_since(expected) {
            Ok(d) => d,
            Err(e) => e.duration(),
        };
        assert!(diff < Duration::from_secs(60), "off by {diff:?}");
    }

    #[test]
    fn ca_bundle_decodes_back_to_pem() {
        let ca = ca();
        let bundle = ca_bundle_base64(ca.cert_pem());
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(bundle)
            .expect("base64");
        assert_eq!(decoded, ca.cert_pem().as_bytes());
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    }

    #[test]
    fn from_pem_round_trips_and_issues() {
        let ca = ca();
        let reloaded = Ca::from_pem(ca.cert_pem(), ca.key_pem()).expect("reload");
        assert_eq!(reloaded.cert_pem(), ca.cert_pem());
        let cert = reloaded
            .issue_serving(&[], &["127.0.0.1".parse().expect("ip")], DAY)
            .expect("issue");
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert.cert_pem.as_bytes()).expect("pem");
        let x509 = pem.parse_x509().expect("x509");
        assert_eq!(
            x509.issuer().to_string(),
            "CN=nmo-test-ca",
            "issuer is the reloaded CA"
        );
        assert_eq!(x509.subject().to_string(), "CN=127.0.0.1");
    }

    #[test]
    fn from_pem_rejects_a_foreign_key() {
        let a = ca();
        let b = ca();
        let err = Ca::from_pem(a.cert_pem(), b.key_pem()).expect_err("mismatch");
        assert!(err.to_string().contains("does not match"), "{err}");
    }

    #[test]
    fn from_pem_rejects_a_leaf() {
        let ca = ca();
        let leaf = ca
            .issue_serving(&["a.example".into()], &[], DAY)
            .expect("issue");
        let err = Ca::from_pem(&leaf.cert_pem, &leaf.key_pem).expect_err("leaf is no CA");
        assert!(err.to_string().contains("not a CA"), "{err}");
    }

    #[test]
    fn rejects_dns_names_no_client_would_match() {
        for bad in ["bad name!", "", "a..b", "-a.svc", "*.", "a_b.svc"] {
            let err = ca().issue_serving(&[bad.into()], &[], DAY).expect_err(bad);
            assert!(
                matches!(err, CertError::InvalidDnsName { .. }),
                "{bad}: {err}"
            );
        }
        ca().issue_serving(&["*.nmo-system.svc".into(), "localhost".into()], &[], DAY)
            .expect("wildcard and single label are fine");
    }

    #[test]
    fn serving_needs_a_name() {
        let err = ca().issue_serving(&[], &[], DAY).expect_err("no names");
        assert!(matches!(err, CertError::NoSubjectNames));
    }

    #[test]
    fn serving_cert_has_server_auth_and_sans() {
        let cert = ca()
            .issue_serving(
                &["nmo-webhook.nmo-system.svc".into(), "localhost".into()],
                &["127.0.0.1".parse().expect("ip"), "::1".parse().expect("ip")],
                DAY,
            )
            .expect("issue");
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert.cert_pem.as_bytes()).expect("pem");
        let x509 = pem.parse_x509().expect("x509");
        assert_eq!(x509.subject().to_string(), "CN=nmo-webhook.nmo-system.svc");
        assert!(!x509.is_ca());
        let eku = x509
            .extended_key_usage()
            .expect("eku parses")
            .expect("eku present");
        assert!(eku.value.server_auth);
        let sans = x509
            .subject_alternative_name()
            .expect("san parses")
            .expect("san present");
        assert_eq!(sans.value.general_names.len(), 4);
    }
}
