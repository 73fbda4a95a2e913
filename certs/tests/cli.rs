//! The `nmo-certs` binary end to end.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use base64::Engine as _;
use common::TempDir;

fn nmo_certs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nmo-certs"))
        .args(args)
        .output()
        .expect("run nmo-certs")
}

fn ok(args: &[&str]) -> String {
    let out = nmo_certs(args);
    assert!(
        out.status.success(),
        "nmo-certs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn ca_serving_and_ca_bundle() {
    let tmp = TempDir::new("cli");
    let ca_dir = tmp.path().join("ca");
    let out = tmp.path().join("webhook");

    let stdout = ok(&[
        "ca",
        "--out",
        s(&ca_dir),
        "--cn",
        "nmo-cli-ca",
        "--days",
        "30",
    ]);
    assert!(
        stdout.contains("ca.crt") && stdout.contains("ca.key"),
        "{stdout}"
    );
    let ca_pem = fs::read_to_string(ca_dir.join("ca.crt")).expect("ca.crt");
    assert!(ca_dir.join("ca.key").is_file());

    // Without --force the existing CA is kept.
    let stdout = ok(&["ca", "--out", s(&ca_dir)]);
    assert!(stdout.contains("kept existing"), "{stdout}");
    assert_eq!(
        fs::read_to_string(ca_dir.join("ca.crt")).expect("ca.crt"),
        ca_pem
    );

    let args = [
        "serving",
        "--ca-dir",
        s(&ca_dir),
        "--out",
        s(&out),
        "--dns",
        "nmo-webhook.nmo-system.svc",
        "--dns",
        "localhost",
        "--ip",
        "127.0.0.1",
    ];
    let stdout = ok(&args);
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    let first = fs::read_to_string(out.join("tls.crt")).expect("tls.crt");
    assert!(out.join("tls.key").exists());
    assert_eq!(
        fs::read_to_string(out.join("ca.crt")).expect("ca.crt"),
        ca_pem
    );
    assert!(
        fs::symlink_metadata(out.join("..data"))
            .expect("..data")
            .file_type()
            .is_symlink()
    );

    // Issued by the CA in --ca-dir (not a new one), and not expired.
    let (_, pem) = x509_parser::pem::parse_x509_pem(first.as_bytes()).expect("PEM");
    let leaf = pem.parse_x509().expect("X.509");
    assert_eq!(leaf.issuer().to_string(), "CN=nmo-cli-ca");
    assert!(certs::not_after(&first).expect("not_after") > std::time::SystemTime::now());

    // Again: a rotation.
    ok(&args);
    let second = fs::read_to_string(out.join("tls.crt")).expect("tls.crt");
    assert_ne!(first, second);

    let bundle = ok(&["ca-bundle", "--ca-dir", s(&ca_dir)]);
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(bundle.trim())
        .expect("base64");
    assert_eq!(decoded, ca_pem.as_bytes());
}

#[test]
fn serving_creates_a_missing_ca_and_writes_plain_and_olm() {
    let tmp = TempDir::new("cli-plain");
    let ca_dir = tmp.path().join("ca");
    let plain = tmp.path().join("plain");
    let olm = tmp.path().join("olm");

    let stdout = ok(&[
        "serving",
        "--ca-dir",
        s(&ca_dir),
        "--out",
        s(&plain),
        "--ip",
        "127.0.0.1,::1",
        "--layout",
        "plain",
    ]);
    assert!(stdout.contains("ca.key"), "CA creation reported: {stdout}");
    assert!(ca_dir.join("ca.crt").is_file());
    for name in ["tls.crt", "tls.key", "ca.crt"] {
        let meta = fs::symlink_metadata(plain.join(name)).expect(name);
        assert!(meta.file_type().is_file(), "{name} is a regular file");
    }

    ok(&[
        "serving",
        "--ca-dir",
        s(&ca_dir),
        "--out",
        s(&olm),
        "--dns",
        "nmo-webhook.nmo-system.svc",
        "--layout",
        "olm",
    ]);
    assert!(olm.join("apiserver.crt").is_file());
    assert!(olm.join("apiserver.key").is_file());
}

#[test]
fn errors_name_what_failed() {
    let tmp = TempDir::new("cli-errors");
    let missing = tmp.path().join("nope");

    let out = nmo_certs(&["ca-bundle", "--ca-dir", s(&missing)]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ca.crt"), "{stderr}");

    let out = nmo_certs(&["serving", "--ca-dir", s(&missing), "--out", s(&missing)]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--dns"), "{stderr}");
}
