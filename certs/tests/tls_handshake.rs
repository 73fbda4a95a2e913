//! A real TLS handshake: a rustls client trusting only our CA against a
//! tokio-rustls server serving a certificate the CA issued.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use certs::{Ca, ServingCert};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{CertificateError, ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

const DAY: Duration = Duration::from_secs(24 * 60 * 60);
const SERVICE_DNS: &str = "nmo-webhook.nmo-system.svc";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn issue(ca: &Ca) -> ServingCert {
    let ip: IpAddr = "127.0.0.1".parse().expect("ip");
    ca.issue_serving(&[SERVICE_DNS.to_owned()], &[ip], DAY)
        .expect("issue serving cert")
}

fn server_config(cert: &ServingCert) -> Arc<ServerConfig> {
    let chain = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("cert PEM");
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).expect("key PEM");
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
    Arc::new(config)
}

fn client_config(ca_pem: &str) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("add root");
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// Serves one connection with `cert`, connects a client trusting `trusted_ca`
/// under `server_name`, and returns the client's result of a ping/pong.
async fn handshake(
    cert: &ServingCert,
    trusted_ca: &str,
    server_name: &str,
) -> Result<(), std::io::Error> {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor = TlsAcceptor::from(server_config(cert));
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        // A failed handshake is the client's to report.
        if let Ok(mut tls) = acceptor.accept(tcp).await {
            let mut buf = [0u8; 4];
            if tls.read_exact(&mut buf).await.is_ok() && &buf == b"ping" {
                let _ = tls.write_all(b"pong").await;
                let _ = tls.shutdown().await;
            }
        }
    });

    let connector = TlsConnector::from(client_config(trusted_ca));
    let name = ServerName::try_from(server_name.to_owned()).expect("server name");
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let result = async {
        let mut tls = connector.connect(name, tcp).await?;
        tls.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"pong");
        Ok(())
    }
    .await;
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server finished")
        .expect("server task");
    result
}

/// The certificate verification error a failed client handshake carries.
fn certificate_error(err: &std::io::Error) -> Option<&CertificateError> {
    match err.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::InvalidCertificate(e) => Some(e),
        _ => None,
    }
}

#[tokio::test]
async fn client_trusting_the_ca_verifies_the_ip_san() {
    let ca = Ca::new("nmo-test-ca", DAY).expect("CA");
    handshake(&issue(&ca), ca.cert_pem(), "127.0.0.1")
        .await
        .expect("handshake by IP");
}

#[tokio::test]
async fn client_trusting_the_ca_verifies_the_service_dns_san() {
    let ca = Ca::new("nmo-test-ca", DAY).expect("CA");
    handshake(&issue(&ca), ca.cert_pem(), SERVICE_DNS)
        .await
        .expect("handshake by service DNS name");
}

#[tokio::test]
async fn client_trusting_a_reloaded_ca_verifies() {
    let ca = Ca::new("nmo-test-ca", DAY).expect("CA");
    let reloaded = Ca::from_pem(ca.cert_pem(), ca.key_pem()).expect("reload");
    handshake(&issue(&reloaded), ca.cert_pem(), SERVICE_DNS)
        .await
        .expect("cert from the reloaded CA verifies against the original");
}

#[tokio::test]
async fn client_trusting_another_ca_fails() {
    let ca = Ca::new("nmo-test-ca", DAY).expect("CA");
    let other = Ca::new("some-other-ca", DAY).expect("other CA");
    let err = handshake(&issue(&ca), other.cert_pem(), SERVICE_DNS)
        .await
        .expect_err("a different CA must not verify");
    assert!(
        matches!(
            certificate_error(&err),
            Some(CertificateError::UnknownIssuer)
        ),
        "{err}"
    );
}

/// What happens when a CA is regenerated with the same (default) name and a
/// caBundle is stale: the issuer name matches, the signature does not.
#[tokio::test]
async fn client_trusting_a_regenerated_ca_with_the_same_name_fails() {
    let ca = Ca::new("nmo-test-ca", DAY).expect("CA");
    let regenerated = Ca::new("nmo-test-ca", DAY).expect("regenerated CA");
    let err = handshake(&issue(&ca), regenerated.cert_pem(), SERVICE_DNS)
        .await
        .expect_err("a regenerated CA must not verify");
    assert!(
        matches!(
            certificate_error(&err),
            Some(CertificateError::BadSignature | CertificateError::UnknownIssuer)
        ),
        "{err}"
    );
}

#[tokio::test]
async fn name_not_in_the_sans_fails() {
    let ca = Ca::new("nmo-test-ca", DAY).expect("CA");
    let err = handshake(&issue(&ca), ca.cert_pem(), "other.nmo-system.svc")
        .await
        .expect_err("a name outside the SANs must not verify");
    assert!(
        matches!(
            certificate_error(&err),
            Some(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
            )
        ),
        "{err}"
    );
}
