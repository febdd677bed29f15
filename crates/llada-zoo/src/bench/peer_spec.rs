//! llama.cpp's speculative example as the peer of `llada bench spec`: `llama-speculative-simple`
//! (from the peer build, [`super::peer`]) on the same target and draft files and the same
//! prompt text, greedy (`--temp 0 --top-k 1`), `--ignore-eos` so that it decodes exactly the
//! tokens asked for, as our bench does. It cannot stream weights: the peer's rows are resident.
//!
//! Its log's `decoded N tokens in S seconds` line is the speed (prompt processing excluded,
//! as our rows exclude prefill); `n_drafted` and `n_accept` the acceptance. llama.cpp's logger
//! is not flushed at exit, so a run whose log lacks the line is run again (up to 4 times).

use crate::error::{Error, Result};
use std::path::Path;
use std::process::Command;

/// One run of the peer on one prompt.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct SpecPeerRun {
    pub tokens: usize,
    pub secs: f64,
    pub drafted: usize,
    pub accepted: usize,
}

/// Read a run's figures from its log (stdout and stderr together); `None` when the
/// `decoded` line is missing.
pub fn parse_log(log: &str) -> Option<SpecPeerRun> {
    let mut run = SpecPeerRun::default();
    let mut found = false;
    for line in log.lines() {
        if let Some(rest) = line
            .split("decoded")
            .nth(1)
            .filter(|_| line.contains(" seconds"))
        {
            // "decoded   65 tokens in    8.156 seconds, speed: ..."
            let words: Vec<&str> = rest.split_whitespace().collect();
            if let (Some(n), Some(s)) = (words.first(), words.get(3)) {
                run.tokens = n.parse().ok()?;
                run.secs = s.parse().ok()?;
                found = true;
            }
        }
        let value = |key: &str| -> Option<usize> {
            let (_, v) = line.split_once(key)?;
            v.trim().trim_start_matches('=').trim().parse().ok()
        };
        if line.contains("n_drafted") {
            run.drafted = value("n_drafted").unwrap_or(0);
        }
        if line.contains("n_accept ") || line.contains("n_accept=") {
            run.accepted = value("n_accept").unwrap_or(0);
        }
    }
    found.then_some(run)
}

/// Run `llama-speculative-simple` from `bin_dir`: `target` verified, `draft` drafting at most
/// `n_max` tokens a step, on `prompt` (text; llama.cpp tokenizes it, special tokens included),
/// `tokens` greedy tokens, `threads` threads.
pub fn run(
    bin_dir: &Path,
    target: &Path,
    draft: &Path,
    prompt: &str,
    tokens: usize,
    threads: usize,
    n_max: usize,
) -> Result<SpecPeerRun> {
    let exe = bin_dir.join("llama-speculative-simple");
    let file = std::env::temp_dir().join(format!("llada-peer-prompt-{}.txt", std::process::id()));
    std::fs::write(&file, prompt)?;
    let args: Vec<String> = [
        "-m",
        &target.display().to_string(),
        "-md",
        &draft.display().to_string(),
        "-f",
        &file.display().to_string(),
        "-n",
        &tokens.to_string(),
        "-t",
        &threads.to_string(),
        "--temp",
        "0",
        "--top-k",
        "1",
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-max",
        &n_max.to_string(),
        "--ignore-eos",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let shown = format!("{} {}", exe.display(), args.join(" "));
    let mut last = String::new();
    for _ in 0..4 {
        let out = Command::new(&exe)
            .args(&args)
            .output()
            .map_err(|e| Error::Invalid(format!("could not start `{shown}`: {e}")))?;
        let log = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            let _ = std::fs::remove_file(&file);
            return Err(Error::Invalid(format!(
                "the llama.cpp peer failed ({}): `{shown}`; its log ended with:\n{}",
                out.status,
                super::peer::tail(&log, 20)
            )));
        }
        if let Some(r) = parse_log(&log) {
            let _ = std::fs::remove_file(&file);
            return Ok(r);
        }
        last = log;
    }
    let _ = std::fs::remove_file(&file);
    Err(Error::Invalid(format!(
        "`{shown}` printed no `decoded N tokens in S seconds` line in 4 runs; its log ended with:\n{}",
        super::peer::tail(&last, 10)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_example_log() {
        let log = "0.09.564.304 I encoded  118 tokens in    1.942 seconds, speed:   60.768 t/s\n\
                   0.13.066.520 I decoded   65 tokens in    8.156 seconds, speed:    7.970 t/s\n\
                   0.13.066.730 I n_predict = 65\n\
                   0.13.066.813 I n_drafted = 94\n\
                   0.13.066.894 I n_accept  = 41\n\
                   0.13.066.961 I accept    = 43.617%\n";
        assert_eq!(
            parse_log(log),
            Some(SpecPeerRun {
                tokens: 65,
                secs: 8.156,
                drafted: 94,
                accepted: 41
            })
        );
        // A log cut before the summary is no result (the run is repeated).
        assert_eq!(
            parse_log("0.09.564.304 I encoded  118 tokens in 1.9 seconds"),
            None
        );
    }
}
