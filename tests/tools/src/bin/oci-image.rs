//! `oci-image`: builds a `FROM scratch` OCI image archive from a Containerfile,
//! without a container daemon, byte for byte reproducibly.
//!
//! The Containerfile is the single description of the image: this tool reads
//! the same file that `podman build` / `docker build` read, and supports the
//! subset a scratch image of static binaries needs: `FROM scratch`, `ARG`,
//! `LABEL`, `COPY` (files and directories, no flags), `USER`, `ENTRYPOINT` and
//! `CMD` in exec (JSON) form. Anything else is an error, never silently
//! skipped, so the image built here and one built by podman cannot drift.
//!
//! Reproducibility: every layer is a tar with fixed mtimes (the image creation
//! time, normally SOURCE_DATE_EPOCH = the commit's time), owner 0:0, modes
//! normalised to 0755 (directories and executables) or 0644, entries sorted by
//! path; gzip without name or time; JSON written by serde with a fixed key
//! order. The outer archive (a tar of an OCI image layout: `oci-layout`,
//! `index.json`, `blobs/sha256/...`) is built the same way, so the archive's
//! own checksum repeats too.
//!
//! One image, or one per platform: with `--context DIR` the archive holds one
//! image (index.json names its manifest; linux/amd64 unless `--platform-of`
//! says otherwise) and the tool prints the manifest digest (`sha256:...`) on
//! stdout. With `--platform OS/ARCH=DIR` (repeatable) the same Containerfile is
//! built once per platform from that platform's build context, each image with
//! its own config (`architecture`, `os`), and the archive's index.json names an
//! OCI image index listing the platform manifests, as `docker buildx` and `ko`
//! write multi-platform images. It then prints the index digest on the first
//! line and `OS/ARCH <manifest digest>` per platform after it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write as _;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context as _, bail, ensure};
use clap::Parser;
use flate2::{Compression, GzBuilder};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

#[derive(Parser, Debug)]
#[command(
    about = "Build a FROM scratch OCI image archive from a Containerfile, reproducibly and without a daemon"
)]
struct Args {
    /// The Containerfile describing the image.
    #[arg(long, short = 'f')]
    containerfile: PathBuf,
    /// Build context of a single-platform image: COPY sources are relative
    /// to it.
    #[arg(
        long,
        conflicts_with = "platforms",
        required_unless_present = "platforms"
    )]
    context: Option<PathBuf>,
    /// The platform of the `--context` image.
    #[arg(long, default_value = "linux/amd64", requires = "context")]
    platform_of: String,
    /// One image per platform, OS/ARCH[/VARIANT]=CONTEXT (repeatable): the
    /// archive holds an image index of them, in the order given.
    #[arg(long = "platform", value_name = "OS/ARCH=CONTEXT")]
    platforms: Vec<String>,
    /// ARG values, NAME=VALUE (repeatable). An ARG the Containerfile does not
    /// declare is an error.
    #[arg(long = "build-arg", value_name = "NAME=VALUE")]
    build_args: Vec<String>,
    /// Image creation time, seconds since the epoch (layer mtimes, config
    /// `created`). Defaults to SOURCE_DATE_EPOCH.
    #[arg(long, env = "SOURCE_DATE_EPOCH")]
    created_epoch: i64,
    /// Full image reference recorded in index.json
    /// (`org.opencontainers.image.ref.name`, `io.containerd.image.name`),
    /// the name `podman load` / `ctr import` give the image.
    #[arg(long = "ref", value_name = "NAME:TAG")]
    reference: String,
    /// The OCI archive to write.
    #[arg(long, short = 'o')]
    out: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let spec = read_spec(&args)?;
    let created = rfc3339(args.created_epoch)?;
    let mut images = Vec::new();
    for (platform, context) in targets(&args)? {
        let image = build_image(&spec, &context, args.created_epoch, &created, &platform)
            .with_context(|| format!("building the {platform} image from {}", context.display()))?;
        images.push(image);
    }
    let layout = if args.platforms.is_empty() {
        Layout::single(&images)?
    } else {
        Layout::index(&images, &spec)?
    };
    let archive = layout.archive(&args.reference, args.created_epoch)?;
    write_atomically(&args.out, &archive)?;
    eprintln!(
        "oci-image: {} -> {} ({}, {} bytes, archive sha256:{})",
        args.reference,
        args.out.display(),
        images
            .iter()
            .map(|i| format!("{} {} layers", i.platform, i.layers.len()))
            .collect::<Vec<_>>()
            .join(", "),
        archive.len(),
        hex_sha256(&archive)
    );
    println!("{}", layout.top.digest);
    if !args.platforms.is_empty() {
        for image in &images {
            println!("{} {}", image.platform, image.manifest.digest);
        }
    }
    Ok(())
}

/// The Containerfile, parsed with the `--build-arg` values.
fn read_spec(args: &Args) -> anyhow::Result<Spec> {
    let text = fs::read_to_string(&args.containerfile)
        .with_context(|| format!("reading {}", args.containerfile.display()))?;
    let mut build_args = BTreeMap::new();
    for a in &args.build_args {
        let (k, v) = a
            .split_once('=')
            .with_context(|| format!("--build-arg {a:?}: expected NAME=VALUE"))?;
        build_args.insert(k.to_string(), v.to_string());
    }
    parse_containerfile(&text, &build_args)
        .with_context(|| format!("in {}", args.containerfile.display()))
}

/// (platform, build context) of each image to build, each platform once.
fn targets(args: &Args) -> anyhow::Result<Vec<(Platform, PathBuf)>> {
    if let Some(context) = &args.context {
        return Ok(vec![(Platform::parse(&args.platform_of)?, context.clone())]);
    }
    let mut out: Vec<(Platform, PathBuf)> = Vec::new();
    for p in &args.platforms {
        let (platform, context) = p.split_once('=').with_context(|| {
            format!("--platform {p:?}: expected OS/ARCH=CONTEXT, e.g. linux/arm64=target/aarch64-unknown-linux-musl/release")
        })?;
        let platform = Platform::parse(platform)?;
        ensure!(
            out.iter().all(|(seen, _)| *seen != platform),
            "--platform {platform} is given twice: an index holds one image per platform"
        );
        out.push((platform, PathBuf::from(context)));
    }
    Ok(out)
}

/// Writes `bytes` to `out` through a temporary file beside it, so a reader
/// never sees half an archive.
fn write_atomically(out: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = out.with_extension("tar.partial");
    fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, out).with_context(|| format!("renaming to {}", out.display()))
}

// ---------------------------------------------------------------- Containerfile

/// What a Containerfile says about the image.
#[derive(Debug, Default, PartialEq)]
struct Spec {
    labels: BTreeMap<String, String>,
    /// (sources relative to the context, absolute destination, instruction text)
    copies: Vec<(Vec<String>, String, String)>,
    user: Option<String>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
}

/// Joins continuation lines and drops comments and blank lines.
fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for raw in text.lines() {
        let t = raw.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
            continue;
        }
        cur.push_str(t);
        if !cur.trim().is_empty() {
            out.push(cur.trim().to_string());
        }
        cur.clear();
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Splits shell-like words: double quotes (with `\` escapes and `$VAR`
/// expansion), single quotes (literal), bare words (with expansion).
fn words(s: &str, vars: &BTreeMap<String, String>) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        None => bail!("unterminated double quote in {s:?}"),
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(e) => cur.push(e),
                            None => bail!("dangling backslash in {s:?}"),
                        },
                        Some('$') => expand(&mut chars, &mut cur, vars)?,
                        Some(o) => cur.push(o),
                    }
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        None => bail!("unterminated single quote in {s:?}"),
                        Some('\'') => break,
                        Some(o) => cur.push(o),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(e) => cur.push(e),
                    None => bail!("dangling backslash in {s:?}"),
                }
            }
            '$' => {
                in_word = true;
                expand(&mut chars, &mut cur, vars)?;
            }
            o => {
                in_word = true;
                cur.push(o);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Expands `$NAME` or `${NAME}` (the `$` already consumed).
fn expand(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    out: &mut String,
    vars: &BTreeMap<String, String>,
) -> anyhow::Result<()> {
    let mut name = String::new();
    if chars.peek() == Some(&'{') {
        chars.next();
        loop {
            match chars.next() {
                Some('}') => break,
                Some(c) if c.is_ascii_alphanumeric() || c == '_' => name.push(c),
                Some(c) => {
                    bail!("unsupported character {c:?} in ${{...}} (only ${{NAME}} is supported)")
                }
                None => bail!("unterminated ${{"),
            }
        }
    } else {
        while let Some(&c) = chars.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                chars.next();
            } else {
                break;
            }
        }
    }
    if name.is_empty() {
        out.push('$');
        return Ok(());
    }
    match vars.get(&name) {
        Some(v) => out.push_str(v),
        None => bail!("${name} is not a declared ARG"),
    }
    Ok(())
}

fn exec_form(instr: &str, rest: &str) -> anyhow::Result<Vec<String>> {
    let v: Vec<String> = serde_json::from_str(rest).with_context(|| {
        format!("{instr} must use the exec form, a JSON array such as [\"/binary\"] (the image has no shell)")
    })?;
    ensure!(!v.is_empty(), "{instr} is an empty array");
    Ok(v)
}

fn parse_containerfile(text: &str, build_args: &BTreeMap<String, String>) -> anyhow::Result<Spec> {
    let mut spec = Spec::default();
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut declared = BTreeSet::new();
    let mut seen_from = false;
    for line in logical_lines(text) {
        let (instr, rest) = match line.split_once(char::is_whitespace) {
            Some((i, r)) => (i.to_ascii_uppercase(), r.trim()),
            None => (line.to_ascii_uppercase(), ""),
        };
        if instr != "ARG" && instr != "FROM" {
            ensure!(seen_from, "{instr} before FROM");
        }
        match instr.as_str() {
            "FROM" => {
                ensure!(
                    !seen_from,
                    "more than one FROM: multi-stage builds need podman/buildah/docker"
                );
                ensure!(
                    rest == "scratch",
                    "FROM {rest}: only `FROM scratch` is supported (no registry is needed or used)"
                );
                seen_from = true;
            }
            "ARG" => {
                let w = words(rest, &vars)?;
                ensure!(w.len() == 1, "ARG takes one NAME[=DEFAULT]: {line:?}");
                let (name, default) = match w[0].split_once('=') {
                    Some((n, d)) => (n.to_string(), Some(d.to_string())),
                    None => (w[0].clone(), None),
                };
                let value = build_args
                    .get(&name)
                    .cloned()
                    .or(default)
                    .unwrap_or_default();
                declared.insert(name.clone());
                vars.insert(name, value);
            }
            "LABEL" => {
                for w in words(rest, &vars)? {
                    let (k, v) = w
                        .split_once('=')
                        .with_context(|| format!("LABEL {w:?}: expected KEY=VALUE"))?;
                    ensure!(!k.is_empty(), "LABEL with an empty key: {line:?}");
                    spec.labels.insert(k.to_string(), v.to_string());
                }
            }
            "COPY" => {
                let w = words(rest, &vars)?;
                ensure!(
                    w.iter().all(|x| !x.starts_with("--")),
                    "COPY flags (--from, --chown, --chmod) are not supported: {line:?}"
                );
                ensure!(
                    w.len() >= 2,
                    "COPY needs a source and a destination: {line:?}"
                );
                let (dest, srcs) = w.split_last().context("COPY without arguments")?;
                ensure!(
                    dest.starts_with('/'),
                    "COPY destination must be absolute: {dest:?}"
                );
                spec.copies
                    .push((srcs.to_vec(), dest.clone(), line.clone()));
            }
            "USER" => {
                let w = words(rest, &vars)?;
                ensure!(w.len() == 1, "USER takes one argument: {line:?}");
                spec.user = Some(w[0].clone());
            }
            "ENTRYPOINT" => spec.entrypoint = Some(exec_form("ENTRYPOINT", rest)?),
            "CMD" => spec.cmd = Some(exec_form("CMD", rest)?),
            other => bail!(
                "instruction {other} is not supported by oci-image (FROM scratch, ARG, LABEL, COPY, USER, ENTRYPOINT, CMD are)"
            ),
        }
    }
    ensure!(seen_from, "no FROM line");
    for name in build_args.keys() {
        ensure!(
            declared.contains(name),
            "--build-arg {name}: the Containerfile declares no ARG {name}"
        );
    }
    Ok(spec)
}

// ---------------------------------------------------------------------- image

struct Blob {
    media_type: &'static str,
    digest: String,
    bytes: Vec<u8>,
}

impl Blob {
    fn new(media_type: &'static str, bytes: Vec<u8>) -> Self {
        Blob {
            media_type,
            digest: format!("sha256:{}", hex_sha256(&bytes)),
            bytes,
        }
    }
    fn descriptor(&self) -> Value {
        json!({"mediaType": self.media_type, "digest": self.digest, "size": self.bytes.len()})
    }
}

struct Image {
    platform: Platform,
    config: Blob,
    layers: Vec<Blob>,
    manifest: Blob,
}

/// An OCI platform: `os/architecture[/variant]` with GOOS/GOARCH names
/// (`linux/amd64`, `linux/arm64`), as image configs and index entries say.
#[derive(Debug, Clone, PartialEq)]
struct Platform {
    os: String,
    architecture: String,
    variant: Option<String>,
}

impl Platform {
    fn parse(s: &str) -> anyhow::Result<Platform> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok = |p: &&str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric());
        ensure!(
            (2..=3).contains(&parts.len()) && parts.iter().all(ok),
            "platform {s:?}: expected OS/ARCH[/VARIANT] as in an image index, e.g. linux/amd64 or linux/arm64"
        );
        Ok(Platform {
            os: parts[0].to_string(),
            architecture: parts[1].to_string(),
            variant: parts.get(2).map(|v| v.to_string()),
        })
    }

    /// The `platform` object of an index entry.
    fn json(&self) -> Value {
        let mut p = json!({"architecture": self.architecture, "os": self.os});
        if let Some(v) = &self.variant {
            p["variant"] = json!(v);
        }
        p
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        match &self.variant {
            Some(v) => write!(f, "/{v}"),
            None => Ok(()),
        }
    }
}

fn hex_sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn rfc3339(epoch: i64) -> anyhow::Result<String> {
    let t = jiff::Timestamp::from_second(epoch)
        .with_context(|| format!("creation time {epoch} is out of range"))?;
    // Whole seconds, UTC: "2006-01-02T15:04:05Z".
    Ok(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// A file or directory to put in a layer, path relative to the image root.
enum Entry {
    Dir,
    File { data: Vec<u8>, executable: bool },
}

/// Rejects `..`, absolute and empty source paths.
fn context_path(context: &Path, src: &str) -> anyhow::Result<PathBuf> {
    let p = Path::new(src);
    ensure!(
        p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir)),
        "COPY source {src:?} must be a relative path inside the build context"
    );
    Ok(context.join(p))
}

fn is_executable(meta: &fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    meta.permissions().mode() & 0o111 != 0
}

/// Adds `src` (file, or directory contents recursively) at image path `dest`.
fn collect(src: &Path, dest: &str, out: &mut BTreeMap<String, Entry>) -> anyhow::Result<()> {
    let meta = fs::symlink_metadata(src).with_context(|| {
        format!(
            "COPY source {} does not exist (build it first, or fix the build context)",
            src.display()
        )
    })?;
    if meta.file_type().is_symlink() {
        bail!(
            "COPY source {} is a symlink; copy the file it points to",
            src.display()
        );
    }
    if meta.is_dir() {
        if !dest.is_empty() {
            out.insert(dest.to_string(), Entry::Dir);
        }
        let mut names: Vec<_> = fs::read_dir(src)
            .with_context(|| format!("listing {}", src.display()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .with_context(|| format!("listing {}", src.display()))?;
        names.sort();
        for n in names {
            let name = n
                .to_str()
                .with_context(|| format!("non-UTF-8 file name in {}", src.display()))?;
            let child = if dest.is_empty() {
                name.to_string()
            } else {
                format!("{dest}/{name}")
            };
            collect(&src.join(name), &child, out)?;
        }
    } else if meta.is_file() {
        let data = fs::read(src).with_context(|| format!("reading {}", src.display()))?;
        out.insert(
            dest.to_string(),
            Entry::File {
                data,
                executable: is_executable(&meta),
            },
        );
    } else {
        bail!(
            "COPY source {} is neither a file nor a directory",
            src.display()
        );
    }
    Ok(())
}

/// The entries of one COPY instruction, with parent directories.
fn copy_entries(
    context: &Path,
    srcs: &[String],
    dest: &str,
) -> anyhow::Result<BTreeMap<String, Entry>> {
    let mut out = BTreeMap::new();
    let dest_rel = dest.trim_start_matches('/');
    let dest_is_dir = dest.ends_with('/') || srcs.len() > 1;
    for src in srcs {
        let path = context_path(context, src)?;
        let is_dir = path.is_dir();
        let target = if is_dir {
            dest_rel.trim_end_matches('/').to_string()
        } else if dest_is_dir {
            let base = path
                .file_name()
                .and_then(|n| n.to_str())
                .with_context(|| format!("COPY source {src:?} has no file name"))?;
            match dest_rel.trim_end_matches('/') {
                "" => base.to_string(),
                d => format!("{d}/{base}"),
            }
        } else {
            dest_rel.to_string()
        };
        collect(&path, &target, &mut out)?;
    }
    // Parent directories of everything, so unpackers never invent modes.
    let parents: Vec<String> = out
        .keys()
        .flat_map(|k| {
            let parts: Vec<&str> = k.split('/').collect();
            (1..parts.len())
                .map(move |i| parts[..i].join("/"))
                .collect::<Vec<_>>()
        })
        .collect();
    for p in parents {
        out.entry(p).or_insert(Entry::Dir);
    }
    Ok(out)
}

/// A tar of `entries` (sorted by path), fixed owner, time and modes.
fn tar_bytes(entries: &BTreeMap<String, Entry>, mtime: u64) -> anyhow::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, entry) in entries {
        let mut h = tar::Header::new_ustar();
        h.set_mtime(mtime);
        h.set_uid(0);
        h.set_gid(0);
        match entry {
            Entry::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, format!("{path}/"), std::io::empty())
                    .with_context(|| format!("tar entry {path}/"))?;
            }
            Entry::File { data, executable } => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(if *executable { 0o755 } else { 0o644 });
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, data.as_slice())
                    .with_context(|| format!("tar entry {path}"))?;
            }
        }
    }
    b.into_inner().context("finishing tar")
}

fn gzip(data: &[u8]) -> anyhow::Result<Vec<u8>> {
    // No file name, mtime 0, OS "unknown": the header never varies.
    let mut e = GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), Compression::default());
    e.write_all(data).context("gzip")?;
    e.finish().context("gzip")
}

fn build_image(
    spec: &Spec,
    context: &Path,
    epoch: i64,
    created: &str,
    platform: &Platform,
) -> anyhow::Result<Image> {
    let mtime = u64::try_from(epoch).context("creation time before 1970")?;
    let mut layers = Vec::new();
    let mut diff_ids = Vec::new();
    let mut history = Vec::new();
    for (srcs, dest, line) in &spec.copies {
        let entries = copy_entries(context, srcs, dest).with_context(|| format!("{line:?}"))?;
        let tar = tar_bytes(&entries, mtime)?;
        diff_ids.push(format!("sha256:{}", hex_sha256(&tar)));
        layers.push(Blob::new(MEDIA_LAYER, gzip(&tar)?));
        history.push(json!({"created": created, "created_by": line}));
    }
    let mut config = json!({
        "created": created,
        "architecture": platform.architecture,
        "os": platform.os,
        "config": run_config(spec),
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": history,
    });
    if let Some(v) = &platform.variant {
        config["variant"] = json!(v);
    }
    let config = Blob::new(MEDIA_CONFIG, serde_json::to_vec(&config)?);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config.descriptor(),
        "layers": layers.iter().map(Blob::descriptor).collect::<Vec<_>>(),
        "annotations": standard_annotations(spec),
    });
    let manifest = Blob::new(MEDIA_MANIFEST, serde_json::to_vec(&manifest)?);
    Ok(Image {
        platform: platform.clone(),
        config,
        layers,
        manifest,
    })
}

/// The config's `config` object: user, entrypoint, command and labels.
fn run_config(spec: &Spec) -> Value {
    let mut config = serde_json::Map::new();
    if let Some(u) = &spec.user {
        config.insert("User".into(), json!(u));
    }
    if let Some(e) = &spec.entrypoint {
        config.insert("Entrypoint".into(), json!(e));
    }
    if let Some(c) = &spec.cmd {
        config.insert("Cmd".into(), json!(c));
    }
    if !spec.labels.is_empty() {
        config.insert("Labels".into(), json!(spec.labels));
    }
    Value::Object(config)
}

/// The standard labels repeated as annotations of manifests and the index
/// (registries show those without fetching the config).
fn standard_annotations(spec: &Spec) -> BTreeMap<&String, &String> {
    spec.labels
        .iter()
        .filter(|(k, _)| k.starts_with("org.opencontainers.image."))
        .collect()
}

/// An OCI image layout: what its index.json names (`top`: one image's
/// manifest, or an image index) and every blob it holds.
struct Layout<'a> {
    top: Blob,
    /// The platform of `top` when it is one image's manifest.
    top_platform: Option<&'a Platform>,
    blobs: Vec<&'a Blob>,
}

impl<'a> Layout<'a> {
    /// One image: index.json names its manifest.
    fn single(images: &'a [Image]) -> anyhow::Result<Layout<'a>> {
        let [image] = images else {
            bail!(
                "a single-image layout needs exactly one image, got {}",
                images.len()
            );
        };
        Ok(Layout {
            top: Blob::new(MEDIA_MANIFEST, image.manifest.bytes.clone()),
            top_platform: Some(&image.platform),
            blobs: image_blobs(image),
        })
    }

    /// One image per platform: index.json names an image index listing each
    /// platform's manifest with its `platform`.
    fn index(images: &'a [Image], spec: &Spec) -> anyhow::Result<Layout<'a>> {
        ensure!(
            !images.is_empty(),
            "an image index needs at least one image"
        );
        let manifests: Vec<Value> = images
            .iter()
            .map(|i| {
                let mut d = i.manifest.descriptor();
                d["platform"] = i.platform.json();
                d
            })
            .collect();
        let index = json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": manifests,
            "annotations": standard_annotations(spec),
        });
        Ok(Layout {
            top: Blob::new(MEDIA_INDEX, serde_json::to_vec(&index)?),
            top_platform: None,
            blobs: images.iter().flat_map(image_blobs).collect(),
        })
    }

    /// The OCI archive: a tar of the image layout (`oci-layout`,
    /// `index.json`, `blobs/sha256/...`), entries sorted, fixed times.
    fn archive(&self, reference: &str, epoch: i64) -> anyhow::Result<Vec<u8>> {
        let mtime = u64::try_from(epoch).context("creation time before 1970")?;
        let mut top = self.top.descriptor();
        if let Some(p) = self.top_platform {
            top["platform"] = p.json();
        }
        top["annotations"] = json!({
            "io.containerd.image.name": reference,
            "org.opencontainers.image.ref.name": reference,
        });
        let index = json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [top],
        });
        let file = |data: Vec<u8>| Entry::File {
            data,
            executable: false,
        };
        let mut entries = BTreeMap::new();
        entries.insert(
            "oci-layout".to_string(),
            file(br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
        );
        entries.insert("index.json".to_string(), file(serde_json::to_vec(&index)?));
        entries.insert("blobs".to_string(), Entry::Dir);
        entries.insert("blobs/sha256".to_string(), Entry::Dir);
        // The same blob twice (e.g. one layer in two images) is one entry.
        for blob in std::iter::once(&self.top).chain(self.blobs.iter().copied()) {
            let hex = blob.digest.trim_start_matches("sha256:");
            entries.insert(format!("blobs/sha256/{hex}"), file(blob.bytes.clone()));
        }
        tar_bytes(&entries, mtime)
    }
}

/// The manifest, config and layers of one image.
fn image_blobs(image: &Image) -> Vec<&Blob> {
    std::iter::once(&image.manifest)
        .chain(std::iter::once(&image.config))
        .chain(image.layers.iter())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_args() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    #[test]
    fn parses_the_subset() {
        let text = r#"
# comment
FROM scratch
ARG VERSION=0.1.0
ARG REVISION
LABEL a="x ${VERSION}" \
      # a comment inside a continuation
      b=$REVISION c='lit $X'
COPY bin /bin-dest
USER 65532:65532
ENTRYPOINT ["/bin-dest"]
"#;
        let mut args = no_args();
        args.insert("REVISION".into(), "abc".into());
        let s = parse_containerfile(text, &args).expect("parses");
        assert_eq!(s.labels["a"], "x 0.1.0");
        assert_eq!(s.labels["b"], "abc");
        assert_eq!(s.labels["c"], "lit $X");
        assert_eq!(s.user.as_deref(), Some("65532:65532"));
        assert_eq!(s.entrypoint, Some(vec!["/bin-dest".to_string()]));
        assert_eq!(s.copies[0].0, vec!["bin".to_string()]);
        assert_eq!(s.copies[0].1, "/bin-dest");
    }

    #[test]
    fn rejects_what_it_cannot_build() {
        for bad in [
            "FROM debian\n",
            "FROM scratch\nRUN true\n",
            "FROM scratch\nENTRYPOINT /bin/sh\n",
            "FROM scratch\nCOPY --chown=1:1 a /a\n",
            "FROM scratch\nLABEL a=$UNDECLARED\n",
            "FROM scratch AS x\n",
        ] {
            assert!(
                parse_containerfile(bad, &no_args()).is_err(),
                "{bad:?} accepted"
            );
        }
        let mut args = no_args();
        args.insert("TYPO".into(), "1".into());
        assert!(parse_containerfile("FROM scratch\n", &args).is_err());
    }

    /// The shipped Containerfiles parse, describe a non-root scratch image
    /// with the binary as entrypoint, and default VERSION to the workspace
    /// version.
    #[test]
    fn service_containerfiles() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        for svc in ["controller", "webhook"] {
            let text =
                fs::read_to_string(root.join(svc).join("Containerfile")).expect("Containerfile");
            let s = parse_containerfile(&text, &no_args()).expect("parses");
            let bin = format!("/nmo-{svc}");
            assert_eq!(s.entrypoint, Some(vec![bin.clone()]), "{svc}");
            assert_eq!(s.user.as_deref(), Some("65532:65532"), "{svc}");
            assert_eq!(s.copies.len(), 1, "{svc}: one layer, the binary");
            assert_eq!(s.copies[0].1, bin, "{svc}");
            assert_eq!(
                s.labels["org.opencontainers.image.version"],
                env!("CARGO_PKG_VERSION")
            );
            assert_eq!(
                s.labels["org.opencontainers.image.title"],
                format!("nmo-{svc}")
            );
            for k in [
                "title",
                "description",
                "version",
                "revision",
                "source",
                "licenses",
                "created",
            ] {
                assert!(
                    s.labels
                        .contains_key(&format!("org.opencontainers.image.{k}")),
                    "{svc}: {k}"
                );
            }
        }
    }

    const EPOCH: i64 = 1_700_000_000;
    const CREATED: &str = "2023-11-14T22:13:20Z";

    fn amd64() -> Platform {
        Platform::parse("linux/amd64").expect("platform")
    }

    /// A build context with `app` (holding `content`) and `sub/{a,b}.yaml`.
    fn context(name: &str, content: &[u8]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("oci-image-test-{name}-{}", std::process::id()));
        fs::create_dir_all(dir.join("sub")).expect("mkdir");
        fs::write(dir.join("app"), content).expect("write");
        fs::write(dir.join("sub/b.yaml"), b"b").expect("write");
        fs::write(dir.join("sub/a.yaml"), b"a").expect("write");
        dir
    }

    fn test_spec() -> Spec {
        let text =
            "FROM scratch\nCOPY app /app\nCOPY sub /data/\nUSER 1:1\nENTRYPOINT [\"/app\"]\n";
        parse_containerfile(text, &no_args()).expect("parses")
    }

    #[test]
    fn same_input_same_digest() {
        let dir = context("same", b"binary");
        let spec = test_spec();
        let a = build_image(&spec, &dir, EPOCH, CREATED, &amd64()).expect("image");
        let b = build_image(&spec, &dir, EPOCH, CREATED, &amd64()).expect("image");
        assert_eq!(a.manifest.digest, b.manifest.digest);
        let (a, b) = ([a], [b]);
        let archive = |i: &[Image]| {
            Layout::single(i)
                .expect("layout")
                .archive("x:1", EPOCH)
                .expect("archive")
        };
        assert_eq!(archive(&a), archive(&b));
        // The directory layer lists data/, data/a.yaml, data/b.yaml in order.
        let entries = copy_entries(&dir, &["sub".into()], "/data/").expect("entries");
        assert_eq!(
            entries.keys().collect::<Vec<_>>(),
            ["data", "data/a.yaml", "data/b.yaml"]
        );
        let c =
            build_image(&spec, &dir, EPOCH + 1, "2023-11-14T22:13:21Z", &amd64()).expect("image");
        assert_ne!(
            a[0].manifest.digest, c.manifest.digest,
            "the time is part of the image"
        );
        fs::remove_dir_all(&dir).ok();
    }

    /// Two platforms: an index naming both manifests with their platform,
    /// each config saying its architecture, the same bytes on every build.
    #[test]
    fn one_index_one_manifest_per_platform() {
        let x86 = context("amd64", b"x86-64 binary");
        let arm = context("arm64", b"aarch64 binary");
        let spec = test_spec();
        let arm64 = Platform::parse("linux/arm64").expect("platform");
        let build = || {
            let images = [
                build_image(&spec, &x86, EPOCH, CREATED, &amd64()).expect("amd64"),
                build_image(&spec, &arm, EPOCH, CREATED, &arm64).expect("arm64"),
            ];
            let (index, archive) = {
                let layout = Layout::index(&images, &spec).expect("index");
                let archive = layout.archive("x:1", EPOCH).expect("archive");
                (layout.top.bytes, archive)
            };
            (images, index, archive)
        };
        let (images, index, archive) = build();
        let (_, index2, archive2) = build();
        assert_eq!(archive, archive2, "the archive repeats byte for byte");
        assert_eq!(index, index2);
        let index: Value = serde_json::from_slice(&index).expect("index JSON");
        assert_eq!(index["mediaType"], MEDIA_INDEX);
        let entries = index["manifests"].as_array().expect("manifests");
        assert_eq!(entries.len(), 2);
        for (entry, (image, arch)) in entries.iter().zip(images.iter().zip(["amd64", "arm64"])) {
            assert_eq!(entry["digest"], image.manifest.digest.as_str());
            assert_eq!(
                entry["platform"],
                json!({"architecture": arch, "os": "linux"})
            );
            let config: Value = serde_json::from_slice(&image.config.bytes).expect("config");
            assert_eq!(config["architecture"], arch);
            assert_eq!(config["os"], "linux");
        }
        assert_ne!(images[0].manifest.digest, images[1].manifest.digest);
        // The identical layer (sub/) has one digest: the archive stores it once.
        assert_eq!(images[0].layers[1].digest, images[1].layers[1].digest);
        fs::remove_dir_all(&x86).ok();
        fs::remove_dir_all(&arm).ok();
    }

    #[test]
    fn platforms_parse_and_print() {
        assert_eq!(amd64().to_string(), "linux/amd64");
        let v8 = Platform::parse("linux/arm64/v8").expect("with variant");
        assert_eq!(v8.to_string(), "linux/arm64/v8");
        assert_eq!(v8.json()["variant"], "v8");
        for bad in ["amd64", "linux/", "linux/arm64/v8/x", "linux/arm 64"] {
            assert!(Platform::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn rfc3339_of_epoch() {
        assert_eq!(rfc3339(0).expect("time"), "1970-01-01T00:00:00Z");
    }
}
