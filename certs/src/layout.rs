//! Writing certificates to disk: the kubelet secret-volume layout (so local runs
//! and tests rotate certificates exactly as Kubernetes does) and plain files.
//!
//! Kubelet layout of a mounted Secret:
//! ```text
//! dir/..2026_11_29_10_00_00.123456789_42-0/tls.crt   real files
//! dir/..data -> ..2026_11_29_10_00_00.123456789_42-0 swapped atomically on update
//! dir/tls.crt -> ..data/tls.crt                     stable, never rewritten
//! ```
//! A reader watching `dir/tls.crt` itself never sees a write: only `..data`
//! changes, which is why the webhook watches the directory.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Ca, CertError, ServingCert};

pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const CA_CRT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const OLM_CRT: &str = "apiserver.crt";
pub const OLM_KEY: &str = "apiserver.key";

const DATA_LINK: &str = "..data";
const DATA_LINK_TMP: &str = "..data_tmp";
const KEY_MODE: u32 = 0o600;
const FILE_MODE: u32 = 0o644;
const DATA_DIR_MODE: u32 = 0o755;

/// Writes `tls.crt`, `tls.key` and `ca.crt` in the kubelet layout; calling it
/// again on the same directory is a rotation.
pub fn write_serving_set(dir: &Path, ca: &Ca, cert: &ServingCert) -> Result<(), CertError> {
    write_kubelet_layout(dir, &serving_files(ca, cert))
}

/// [`write_serving_set`] with the data directory and files owned by `uid:gid`
/// before they become visible, as kubelet does for a pod's fsGroup: a server
/// running as that user can read the private key of every generation.
pub fn write_serving_set_owned(
    dir: &Path,
    ca: &Ca,
    cert: &ServingCert,
    uid: u32,
    gid: u32,
) -> Result<(), CertError> {
    write_layout(dir, &serving_files(ca, cert), Some((uid, gid)))
}

/// Writes `apiserver.crt` and `apiserver.key` (the names OLM mounts) in the
/// kubelet layout.
pub fn write_olm_set(dir: &Path, cert: &ServingCert) -> Result<(), CertError> {
    write_kubelet_layout(
        dir,
        &[
            (OLM_CRT, cert.cert_pem.as_bytes()),
            (OLM_KEY, cert.key_pem.as_bytes()),
        ],
    )
}

/// The files of a serving set, as written by [`write_serving_set`].
pub fn serving_files<'a>(ca: &'a Ca, cert: &'a ServingCert) -> [(&'static str, &'a [u8]); 3] {
    [
        (TLS_CRT, cert.cert_pem.as_bytes()),
        (TLS_KEY, cert.key_pem.as_bytes()),
        (CA_CRT, ca.cert_pem().as_bytes()),
    ]
}

/// Writes `files` into a fresh `dir/..<timestamp>_<unique>/` directory, points
/// `dir/..data` at it with an atomic rename, makes sure every `dir/<name>` is a
/// symlink to `..data/<name>`, and then removes the previous data directory
/// (and top-level links to files the new set no longer has).
///
/// Keys (names ending in `.key`) get mode 0600, everything else 0644.
pub fn write_kubelet_layout(dir: &Path, files: &[(&str, &[u8])]) -> Result<(), CertError> {
    write_layout(dir, files, None)
}

/// [`write_kubelet_layout`] with the data directory and files owned by
/// `uid:gid` (a pod's fsGroup), for any Secret's keys: e.g. one cert-manager
/// issued, mirrored into a mounted directory as kubelet does.
pub fn write_kubelet_layout_owned(
    dir: &Path,
    files: &[(&str, &[u8])],
    uid: u32,
    gid: u32,
) -> Result<(), CertError> {
    write_layout(dir, files, Some((uid, gid)))
}

fn write_layout(
    dir: &Path,
    files: &[(&str, &[u8])],
    owner: Option<(u32, u32)>,
) -> Result<(), CertError> {
    validate_names(files)?;
    fs::create_dir_all(dir).map_err(CertError::io("creating directory", dir))?;

    // 1. The new data directory, complete and synced before anyone can see it.
    let data_name = new_data_dir_name();
    let data_dir = dir.join(&data_name);
    fs::create_dir(&data_dir).map_err(CertError::io("creating directory", &data_dir))?;
    fs::set_permissions(&data_dir, fs::Permissions::from_mode(DATA_DIR_MODE))
        .map_err(CertError::io("setting permissions on", &data_dir))?;
    for (name, contents) in files {
        write_new_file(&data_dir.join(name), contents, mode_for(name))?;
    }
    if let Some((uid, gid)) = owner {
        for path in
            std::iter::once(data_dir.clone()).chain(files.iter().map(|(n, _)| data_dir.join(n)))
        {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                .map_err(CertError::io("changing the owner of", &path))?;
        }
    }
    sync_dir(&data_dir)?;

    // 2. Swap `..data` to the new directory in one rename.
    let data_link = dir.join(DATA_LINK);
    let previous = previous_data_dir(&data_link)?;
    let tmp_link = dir.join(DATA_LINK_TMP);
    remove_if_present(&tmp_link)?;
    symlink(&data_name, &tmp_link).map_err(CertError::io("creating symlink", &tmp_link))?;
    fs::rename(&tmp_link, &data_link)
        .map_err(CertError::io("renaming symlink over", &data_link))?;

    // 3. Stable top-level links; they only change when a file is new.
    let names: HashSet<&str> = files.iter().map(|(name, _)| *name).collect();
    for name in &names {
        ensure_user_link(dir, name)?;
    }
    sync_dir(dir)?;

    // 4. Clean up what the previous generation had.
    if let Some(previous) = previous.filter(|p| *p != data_name) {
        let previous_dir = dir.join(&previous);
        remove_stale_user_links(dir, &previous_dir, &names)?;
        match fs::remove_dir_all(&previous_dir) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                return Err(CertError::io("removing old data directory", previous_dir)(
                    e,
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Writes `files` as regular files in `dir` (each via a temporary file and a
/// rename, so a reader never sees half a file), with the same modes as the
/// kubelet layout. Replaces top-level symlinks left by an earlier kubelet
/// layout in the same directory.
pub fn write_plain_files(dir: &Path, files: &[(&str, &[u8])]) -> Result<(), CertError> {
    validate_names(files)?;
    fs::create_dir_all(dir).map_err(CertError::io("creating directory", dir))?;
    for (name, contents) in files {
        let target = dir.join(name);
        let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        remove_if_present(&tmp)?;
        write_new_file(&tmp, contents, mode_for(name))?;
        fs::rename(&tmp, &target).map_err(CertError::io("renaming file over", &target))?;
    }
    sync_dir(dir)
}

fn mode_for(name: &str) -> u32 {
    if name.ends_with(".key") {
        KEY_MODE
    } else {
        FILE_MODE
    }
}

fn validate_names(files: &[(&str, &[u8])]) -> Result<(), CertError> {
    let invalid = |name: &str, reason: &str| CertError::InvalidFileName {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    if files.is_empty() {
        return Err(invalid("", "no files were given; pass at least one"));
    }
    let mut seen = HashSet::new();
    for (name, _) in files {
        if name.is_empty() || name.contains('/') || name.contains('\0') {
            return Err(invalid(
                name,
                "use a plain file name without '/' such as tls.crt",
            ));
        }
        if name.starts_with("..") || *name == "." {
            return Err(invalid(
                name,
                "names starting with '..' belong to the layout itself; rename the file",
            ));
        }
        if !seen.insert(*name) {
            return Err(invalid(name, "it is given twice; pass each file once"));
        }
    }
    Ok(())
}

/// `..<timestamp>_<unique>`: the timestamp in kubelet's format, made unique by
/// process id and a per-process counter.
fn new_data_dir_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = time::OffsetDateTime::now_utc();
    format!(
        "..{:04}_{:02}_{:02}_{:02}_{:02}_{:02}.{:09}_{}-{}",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.nanosecond(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
    )
}

/// The directory `..data` points at now, if it is one of ours (a `..` name
/// directly inside `dir`).
fn previous_data_dir(data_link: &Path) -> Result<Option<String>, CertError> {
    match fs::read_link(data_link) {
        Ok(target) => Ok(target
            .to_str()
            .filter(|t| t.starts_with("..") && !t.contains('/') && *t != DATA_LINK)
            .map(str::to_owned)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        // Exists but is not a symlink: the rename over it will report that.
        Err(e) if e.kind() == ErrorKind::InvalidInput => Ok(None),
        Err(e) => Err(CertError::io("reading symlink", data_link)(e)),
    }
}

/// Makes `dir/<name>` a symlink to `..data/<name>`, replacing (atomically) a
/// regular file or a link pointing elsewhere.
fn ensure_user_link(dir: &Path, name: &str) -> Result<(), CertError> {
    let link = dir.join(name);
    let wanted = Path::new(DATA_LINK).join(name);
    if fs::read_link(&link).is_ok_and(|target| target == wanted) {
        return Ok(());
    }
    let tmp = dir.join(format!("..{name}_tmp"));
    remove_if_present(&tmp)?;
    symlink(&wanted, &tmp).map_err(CertError::io("creating symlink", &tmp))?;
    fs::rename(&tmp, &link).map_err(CertError::io("renaming symlink over", &link))
}

/// Removes top-level links to files that the previous data directory had and
/// the new one does not, as kubelet does when a key leaves a Secret.
fn remove_stale_user_links(
    dir: &Path,
    previous_dir: &Path,
    names: &HashSet<&str>,
) -> Result<(), CertError> {
    let entries = match fs::read_dir(previous_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(CertError::io("listing old data directory", previous_dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(CertError::io("listing old data directory", previous_dir))?;
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        if names.contains(name) {
            continue;
        }
        let link = dir.join(name);
        if fs::read_link(&link).is_ok_and(|t| t == Path::new(DATA_LINK).join(name)) {
            remove_if_present(&link)?;
        }
    }
    Ok(())
}

fn write_new_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(CertError::io("creating file", path))?;
    // The umask may have narrowed the mode given to open; set it exactly.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(CertError::io("setting permissions on", path))?;
    file.write_all(contents)
        .map_err(CertError::io("writing", path))?;
    file.sync_all().map_err(CertError::io("syncing", path))
}

fn remove_if_present(path: &Path) -> Result<(), CertError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(CertError::io("removing", path)(e)),
        _ => Ok(()),
    }
}

/// Makes renames and new entries in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), CertError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(CertError::io("syncing directory", PathBuf::from(dir)))
}
