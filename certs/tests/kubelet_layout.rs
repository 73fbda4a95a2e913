//! The kubelet secret-volume layout and rotation through it.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use certs::{Ca, write_kubelet_layout, write_olm_set, write_serving_set};
use common::TempDir;

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

fn data_target(dir: &Path) -> String {
    fs::read_link(dir.join("..data"))
        .expect("..data is a symlink")
        .to_str()
        .expect("utf-8")
        .to_owned()
}

fn timestamp_dirs(dir: &Path) -> Vec<String> {
    let mut dirs: Vec<String> = fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry"))
        .filter(|e| e.file_type().expect("type").is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn rotation_swaps_data_and_removes_the_old_generation() {
    let tmp = TempDir::new("rotate");
    let dir = tmp.path().join("serving-certs");
    let ca = Ca::new("nmo-test-ca", DAY).expect("CA");
    let names = ["nmo-webhook.nmo-system.svc".to_owned()];

    let first = ca.issue_serving(&names, &[], DAY).expect("first");
    write_serving_set(&dir, &ca, &first).expect("first write");
    let first_target = data_target(&dir);
    assert!(first_target.starts_with(".."), "{first_target}");
    assert_eq!(timestamp_dirs(&dir), vec![first_target.clone()]);
    assert_eq!(
        fs::read_to_string(dir.join("tls.crt")).expect("read"),
        first.cert_pem
    );

    let second = ca.issue_serving(&names, &[], DAY).expect("second");
    assert_ne!(first.cert_pem, second.cert_pem);
    write_serving_set(&dir, &ca, &second).expect("second write");

    // tls.crt resolves through ..data to the second generation.
    assert_eq!(
        fs::read_to_string(dir.join("tls.crt")).expect("read"),
        second.cert_pem
    );
    assert_eq!(
        fs::read_to_string(dir.join("tls.key")).expect("read"),
        second.key_pem
    );
    assert_eq!(
        fs::read_to_string(dir.join("ca.crt")).expect("read"),
        ca.cert_pem()
    );

    // ..data is a symlink to a new timestamp dir; the old one is gone.
    let meta = fs::symlink_metadata(dir.join("..data")).expect("..data");
    assert!(meta.file_type().is_symlink());
    let second_target = data_target(&dir);
    assert_ne!(first_target, second_target);
    assert!(!dir.join(&first_target).exists(), "old generation removed");
    assert_eq!(timestamp_dirs(&dir), vec![second_target]);
    assert!(!dir.join("..data_tmp").exists());

    // The user-visible files are symlinks into ..data/.
    for name in ["tls.crt", "tls.key", "ca.crt"] {
        let link = dir.join(name);
        let meta = fs::symlink_metadata(&link).expect("exists");
        assert!(meta.file_type().is_symlink(), "{name} is a symlink");
        assert_eq!(
            fs::read_link(&link).expect("link"),
            Path::new("..data").join(name)
        );
    }
}

#[test]
fn keys_are_private_and_certs_readable() {
    let tmp = TempDir::new("modes");
    let dir = tmp.path();
    write_kubelet_layout(dir, &[("tls.crt", b"cert"), ("tls.key", b"key")]).expect("write");
    let mode = |name: &str| {
        fs::metadata(dir.join(name))
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("tls.key"), 0o600);
    assert_eq!(mode("tls.crt"), 0o644);
}

#[test]
fn files_dropped_from_the_set_lose_their_link() {
    let tmp = TempDir::new("drop");
    let dir = tmp.path();
    write_kubelet_layout(dir, &[("a.crt", b"a1"), ("b.crt", b"b1")]).expect("first");
    write_kubelet_layout(dir, &[("a.crt", b"a2")]).expect("second");
    assert_eq!(fs::read(dir.join("a.crt")).expect("a"), b"a2");
    assert!(
        fs::symlink_metadata(dir.join("b.crt")).is_err(),
        "b.crt gone"
    );
}

#[test]
fn replaces_plain_files_left_by_an_earlier_layout() {
    let tmp = TempDir::new("plain-then-kubelet");
    let dir = tmp.path();
    fs::write(dir.join("tls.crt"), "old").expect("plain file");
    write_kubelet_layout(dir, &[("tls.crt", b"new")]).expect("write");
    assert!(
        fs::symlink_metadata(dir.join("tls.crt"))
            .expect("exists")
            .file_type()
            .is_symlink()
    );
    assert_eq!(fs::read(dir.join("tls.crt")).expect("read"), b"new");
}

#[test]
fn rejects_names_that_escape_or_clash_with_the_layout() {
    let tmp = TempDir::new("names");
    for bad in ["../x", "a/b", "..data", "", "..2026"] {
        let err = write_kubelet_layout(tmp.path(), &[(bad, b"x")]).expect_err(bad);
        assert!(
            matches!(err, certs::CertError::InvalidFileName { .. }),
            "{bad}: {err}"
        );
    }
    let err = write_kubelet_layout(tmp.path(), &[("a", b"1"), ("a", b"2")]).expect_err("dup");
    assert!(err.to_string().contains("twice"), "{err}");
}

#[test]
fn olm_set_uses_apiserver_names() {
    let tmp = TempDir::new("olm");
    let ca = Ca::new("nmo-test-ca", DAY).expect("CA");
    let cert = ca
        .issue_serving(&["nmo-webhook.nmo-system.svc".into()], &[], DAY)
        .expect("issue");
    write_olm_set(tmp.path(), &cert).expect("write");
    assert_eq!(
        fs::read_to_string(tmp.path().join("apiserver.crt")).expect("crt"),
        cert.cert_pem
    );
    assert_eq!(
        fs::read_to_string(tmp.path().join("apiserver.key")).expect("key"),
        cert.key_pem
    );
}
