//! The images `make images` builds, unpacked so the tests run exactly what a
//! cluster would run: the OCI archive is read (index -> manifest -> config and
//! layers), its layers are extracted into a root directory cached by manifest
//! digest, and the entrypoint is started from there as the image's user.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::Deserialize;

/// What the tests need from an image: where its files are and how it starts.
#[derive(Debug, Clone)]
pub struct Unpacked {
    /// Directory holding the image's filesystem.
    pub root: PathBuf,
    /// `sha256:...` of the image manifest.
    pub digest: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// Numeric user and group from the config's `User` (`uid[:gid]`).
    pub uid: u32,
    pub gid: u32,
    pub labels: BTreeMap<String, String>,
}

impl Unpacked {
    /// Host path of a file inside the image (`/nmo-controller` -> root/nmo-controller).
    pub fn path_of(&self, in_image: &str) -> PathBuf {
        self.root.join(in_image.trim_start_matches('/'))
    }
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct ImageConfig {
    #[serde(default)]
    config: RunConfig,
}

#[derive(Deserialize, Default)]
struct RunConfig {
    #[serde(rename = "User", default)]
    user: String,
    #[serde(rename = "Entrypoint", default)]
    entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    cmd: Option<Vec<String>>,
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}

/// Where `make images` writes the archive of `service` (nmo-controller, nmo-webhook).
pub fn archive_path(service: &str) -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| crate::repo_root().join("target"));
    target.join("images").join(format!("{service}.oci.tar"))
}

/// Unpack the image of `service` (cached per manifest digest under .cluster/images).
pub fn unpack(service: &str) -> anyhow::Result<Unpacked> {
    let archive = archive_path(service);
    anyhow::ensure!(
        archive.exists(),
        "{} is missing: build the images with `make images` (the integration tests run the binaries from them)",
        archive.display()
    );
    let cache = crate::repo_root().join(".cluster/images");
    unpack_archive(&archive, &cache)
        .with_context(|| format!("unpacking image archive {}", archive.display()))
}

/// Unpack an OCI archive (a tar of an OCI image layout) below `cache`.
pub fn unpack_archive(archive: &Path, cache: &Path) -> anyhow::Result<Unpacked> {
    let blobs = read_tar_entries(&std::fs::read(archive)?)?;
    let blob = |digest: &str| -> anyhow::Result<&Vec<u8>> {
        let hex = digest
            .strip_prefix("sha256:")
            .with_context(|| format!("unsupported digest {digest}"))?;
        blobs
            .get(&format!("blobs/sha256/{hex}"))
            .with_context(|| format!("blob {digest} is not in the archive"))
    };
    let index: Index = serde_json::from_slice(
        blobs
            .get("index.json")
            .context("index.json missing: not an OCI layout archive")?,
    )
    .context("index.json")?;
    let desc = match index.manifests.as_slice() {
        [one] => one,
        many => bail!(
            "index.json lists {} manifests; expected exactly one",
            many.len()
        ),
    };
    if !desc.media_type.is_empty() && !desc.media_type.contains("manifest") {
        bail!("index.json points at a {}, not a manifest", desc.media_type);
    }
    let manifest: Manifest = serde_json::from_slice(blob(&desc.digest)?).context("manifest")?;
    let config: ImageConfig =
        serde_json::from_slice(blob(&manifest.config.digest)?).context("image config")?;
    let (uid, gid) = parse_user(&config.config.user)?;

    let dir = cache.join(desc.digest.replace(':', "-"));
    let root = dir.join("rootfs");
    let done = dir.join("unpacked");
    // One unpack at a time in this process (tests run as threads); other
    // processes each unpack into a temp dir of their own and rename it into
    // place, so nobody ever runs a half-written root.
    static UNPACKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = UNPACKING.lock().unwrap_or_else(|p| p.into_inner());
    if !done.exists() {
        let tmp = dir.with_extension(format!("tmp-{}", crate::unique("unpack")));
        let _ = std::fs::remove_dir_all(&tmp);
        let tmp_root = tmp.join("rootfs");
        std::fs::create_dir_all(&tmp_root)?;
        for layer in &manifest.layers {
            let data = blob(&layer.digest)?;
            extract_layer(data, &layer.media_type, &tmp_root)
                .with_context(|| format!("extracting layer {}", layer.digest))?;
        }
        std::fs::write(tmp.join("unpacked"), &desc.digest)?;
        std::fs::create_dir_all(cache)?;
        if std::fs::rename(&tmp, &dir).is_err() {
            // Another process won the race: use its copy.
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    Ok(Unpacked {
        root,
        digest: desc.digest.clone(),
        entrypoint: config.config.entrypoint.unwrap_or_default(),
        cmd: config.config.cmd.unwrap_or_default(),
        uid,
        gid,
        labels: config.config.labels.unwrap_or_default(),
    })
}

/// `User` of an image config: numeric `uid` or `uid:gid` (a scratch image has
/// no /etc/passwd, so names cannot be resolved). Empty means root.
pub fn parse_user(user: &str) -> anyhow::Result<(u32, u32)> {
    if user.is_empty() {
        return Ok((0, 0));
    }
    let (u, g) = user.split_once(':').unwrap_or((user, user));
    let num = |s: &str| {
        s.parse::<u32>()
            .with_context(|| format!("image user {user:?} is not numeric (uid[:gid])"))
    };
    Ok((num(u)?, num(g)?))
}

/// Every regular file of an (uncompressed) tar, by path.
fn read_tar_entries(data: &[u8]) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut ar = tar::Archive::new(data);
    for entry in ar.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        let mut buf = Vec::new();
        entry.read_to_end(&mut buf)?;
        out.insert(path, buf);
    }
    Ok(out)
}

fn extract_layer(data: &[u8], media_type: &str, root: &Path) -> anyhow::Result<()> {
    let gzip = media_type.ends_with("gzip") || data.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(data))
    } else if media_type.ends_with("zstd") {
        bail!("zstd layers are not supported by the test unpacker");
    } else {
        Box::new(data)
    };
    let mut ar = tar::Archive::new(reader);
    ar.set_preserve_permissions(true);
    ar.set_overwrite(true);
    for entry in ar.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.to_path_buf();
        let name = path.file_name().map(|n| n.to_string_lossy().to_string());
        if name.as_deref().is_some_and(|n| n.starts_with(".wh.")) {
            bail!(
                "whiteout {} in a layer: the images are single-layer FROM scratch",
                path.display()
            );
        }
        // unpack_in refuses paths that would leave `root`.
        entry.unpack_in(root)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_users() {
        assert_eq!(parse_user("").expect("root"), (0, 0));
        assert_eq!(parse_user("65532").expect("uid"), (65532, 65532));
        assert_eq!(parse_user("65532:65533").expect("uid:gid"), (65532, 65533));
        assert!(parse_user("nonroot").is_err());
    }
}
