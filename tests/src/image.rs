//! The images `make images` builds, unpacked so the tests run exactly what a
//! cluster would run: the OCI archive is read (index.json -> image index ->
//! the platform's manifest -> config and layers), its layers are extracted
//! into a root directory cached by manifest digest, and the entrypoint is
//! started from there as the image's user.
//!
//! The platform is the host's (linux/amd64 here) unless
//! `NMO_TEST_IMAGE_PLATFORM` names another (`linux/arm64`): a node of that
//! architecture would pull that manifest, and the test launcher runs its
//! binary under qemu user-mode emulation (`crate::deployment`).

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
    /// The config's `os/architecture` (`linux/arm64`).
    pub platform: String,
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

#[derive(Deserialize, Clone)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize, Clone)]
struct Platform {
    os: String,
    architecture: String,
}

impl Platform {
    fn name(&self) -> String {
        format!("{}/{}", self.os, self.architecture)
    }
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
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
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

/// The environment variable naming the platform whose image the tests run.
pub const PLATFORM_VAR: &str = "NMO_TEST_IMAGE_PLATFORM";

/// This machine's platform in OCI terms (`linux/amd64`, `linux/arm64`).
pub fn host_platform() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!("{}/{arch}", std::env::consts::OS)
}

/// The platform whose image the tests run: `NMO_TEST_IMAGE_PLATFORM`, else the host's.
pub fn test_platform() -> String {
    std::env::var(PLATFORM_VAR)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(host_platform)
}

/// Unpack the image of `service` for [`test_platform`] (cached per manifest
/// digest under .cluster/images).
pub fn unpack(service: &str) -> anyhow::Result<Unpacked> {
    let archive = archive_path(service);
    anyhow::ensure!(
        archive.exists(),
        "{} is missing: build the images with `make images` (the integration tests run the binaries from them)",
        archive.display()
    );
    let cache = crate::repo_root().join(".cluster/images");
    let platform = test_platform();
    unpack_archive(&archive, &cache, &platform).with_context(|| {
        format!(
            "unpacking the {platform} image of archive {} ({PLATFORM_VAR} selects the platform)",
            archive.display()
        )
    })
}

/// The manifest for `platform` that `index` leads to: an entry of that
/// platform, through nested image indexes; an entry without a platform
/// counts when it is the index's only one (a single-image layout).
fn find_manifest(
    index: &Index,
    platform: &str,
    blob: &dyn Fn(&str) -> anyhow::Result<Vec<u8>>,
) -> anyhow::Result<Descriptor> {
    let mut seen = Vec::new();
    for desc in &index.manifests {
        if desc.media_type.contains("image.index") || desc.media_type.contains("manifest.list") {
            let nested: Index = serde_json::from_slice(&blob(&desc.digest)?)
                .with_context(|| format!("image index {}", desc.digest))?;
            return find_manifest(&nested, platform, blob)
                .with_context(|| format!("in image index {}", desc.digest));
        }
        if !desc.media_type.is_empty() && !desc.media_type.contains("manifest") {
            bail!("the index points at a {}, not a manifest", desc.media_type);
        }
        match &desc.platform {
            Some(p) if p.name() == platform => return Ok(desc.clone()),
            Some(p) => seen.push(p.name()),
            None if index.manifests.len() == 1 => return Ok(desc.clone()),
            None => seen.push("(no platform)".into()),
        }
    }
    bail!(
        "no manifest for platform {platform}; the index lists: {}",
        seen.join(", ")
    )
}

/// Unpack the `platform` image of an OCI archive (a tar of an OCI image
/// layout) below `cache`.
pub fn unpack_archive(archive: &Path, cache: &Path, platform: &str) -> anyhow::Result<Unpacked> {
    let blobs = read_tar_entries(&std::fs::read(archive)?)?;
    let blob = |digest: &str| -> anyhow::Result<Vec<u8>> {
        let hex = digest
            .strip_prefix("sha256:")
            .with_context(|| format!("unsupported digest {digest}"))?;
        blobs
            .get(&format!("blobs/sha256/{hex}"))
            .cloned()
            .with_context(|| format!("blob {digest} is not in the archive"))
    };
    let index: Index = serde_json::from_slice(
        blobs
            .get("index.json")
            .context("index.json missing: not an OCI layout archive")?,
    )
    .context("index.json")?;
    let desc = find_manifest(&index, platform, &blob)?;
    let manifest: Manifest = serde_json::from_slice(&blob(&desc.digest)?).context("manifest")?;
    let config: ImageConfig =
        serde_json::from_slice(&blob(&manifest.config.digest)?).context("image config")?;
    let config_platform = format!("{}/{}", config.os, config.architecture);
    anyhow::ensure!(
        config_platform == platform,
        "manifest {} is listed for {platform} but its config says {config_platform:?}",
        desc.digest
    );
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
            extract_layer(&data, &layer.media_type, &tmp_root)
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
        platform: config_platform,
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

    fn index(json: serde_json::Value) -> Index {
        serde_json::from_value(json).expect("index JSON")
    }

    /// index.json -> image index -> the platform's manifest, as `make images`
    /// writes it; a single-image layout's one manifest without a platform.
    #[test]
    fn the_platform_picks_the_manifest() {
        let nested = serde_json::json!({"manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:a",
             "platform": {"os": "linux", "architecture": "amd64"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:b",
             "platform": {"os": "linux", "architecture": "arm64"}},
        ]});
        let top = index(serde_json::json!({"manifests": [
            {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": "sha256:i"}
        ]}));
        let blob = |d: &str| -> anyhow::Result<Vec<u8>> {
            anyhow::ensure!(d == "sha256:i", "no blob {d}");
            Ok(serde_json::to_vec(&nested)?)
        };
        let pick = |p: &str| find_manifest(&top, p, &blob).map(|d| d.digest);
        assert_eq!(pick("linux/amd64").expect("amd64"), "sha256:a");
        assert_eq!(pick("linux/arm64").expect("arm64"), "sha256:b");
        let err = format!("{:#}", pick("linux/s390x").expect_err("no such platform"));
        assert!(err.contains("linux/amd64, linux/arm64"), "{err}");

        let single = index(serde_json::json!({"manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:s"}
        ]}));
        let digest = find_manifest(&single, "linux/arm64", &blob).expect("single");
        assert_eq!(digest.digest, "sha256:s");
    }

    #[test]
    fn host_platform_in_oci_terms() {
        let want = if cfg!(target_arch = "x86_64") {
            "linux/amd64"
        } else if cfg!(target_arch = "aarch64") {
            "linux/arm64"
        } else {
            return;
        };
        assert_eq!(host_platform(), want);
    }
}
