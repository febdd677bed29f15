//! The corpora the prose models, drafts and probes train and are evaluated on (Austen and the
//! King James Bible, fetched by `scripts/fetch_corpora.py` into the data directory), and the
//! checks of how many distinct windows a split holds.

use crate::error::{bail, Result};
use std::path::PathBuf;

/// The prose corpora (`austen.txt`, `kjv.txt` in [`llada::models::data_dir`]), or an error
/// saying how to fetch them.
pub fn prose_files() -> Result<[PathBuf; 2]> {
    let files = [
        llada::models::data_file("austen.txt"),
        llada::models::data_file("kjv.txt"),
    ];
    if let Some(f) = files.iter().find(|f| !f.exists()) {
        bail!(
            "{} is missing: run `python3 scripts/fetch_corpora.py` first",
            f.display()
        );
    }
    Ok(files)
}

/// `--windows n` against the `t`-token windows the held-out split of `corpus` (read from
/// `source`) has: the windows are drawn at random starts, so there are as many distinct ones
/// as starts; asking for more only repeats them (`--windows 100000000` allocated until the
/// kernel killed the process), and a split shorter than one window has none.
pub fn check_windows(
    corpus: &llada_train::prose::Corpus,
    n: usize,
    t: usize,
    source: &str,
) -> Result<()> {
    let have = corpus.window_count(true, t);
    if n > have {
        bail!(
            "--windows {n}: the held-out split of {source} ({} tokens) has {have} distinct \
             windows of {t} tokens; ask for at most {have}",
            corpus.heldout.len()
        );
    }
    Ok(())
}

/// Each of `names` (a command-line list) as the entry of `known` it names; an unknown one is
/// an error that lists `known` (`what` names the kind, e.g. "task").
pub fn known_names(
    names: &[String],
    known: &[&'static str],
    what: &str,
) -> Result<Vec<&'static str>> {
    names
        .iter()
        .map(|t| {
            known.iter().copied().find(|k| k == t).ok_or_else(|| {
                crate::Error::Invalid(format!(
                    "unknown {what} '{t}' (one of {})",
                    known.join(", ")
                ))
            })
        })
        .collect()
}

/// `--max-scale` (`train`, `eval`): a fraction of the task lengths, in (0, 1].
pub fn check_max_scale(s: f64) -> Result<()> {
    if !(s > 0.0 && s <= 1.0) {
        bail!("--max-scale {s}: must be in (0, 1]");
    }
    Ok(())
}
