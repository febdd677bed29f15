//! Prompt sets of the speculative-decoding bench (`--prompts`): the fixed prose and chat
//! prompts followed by held-out corpus windows (`6`, `50`, …), or HumanEval problems
//! (`humaneval`, `humaneval[:N]`, `humaneval[A:B]`), each problem's `prompt` field alternately
//! as a raw completion prompt (even problem index) and inside a chat request (odd index,
//! rendered with the target's chat template). Every set is deterministic: the same spec gives
//! the same token ids on every run.

use crate::error::{bail, Context, Error, Result};
use llada_formats::tokenizer::{Message, Tokenizer};
use std::path::PathBuf;
use std::str::FromStr;

/// HumanEval's problem count (data/humaneval.jsonl).
pub const HUMANEVAL_PROBLEMS: usize = 164;

/// Which prompts a bench runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptSet {
    /// The first `n` of the fixed prompts, then held-out corpus windows.
    Mixed(usize),
    /// HumanEval problems `start..end`.
    HumanEval { start: usize, end: usize },
}

impl FromStr for PromptSet {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let t = s.trim();
        let Some(rest) = t.strip_prefix("humaneval") else {
            return match t.parse::<usize>() {
                Ok(0) => Err("--prompts must be at least 1".into()),
                Ok(n) => Ok(PromptSet::Mixed(n)),
                Err(_) => Err(format!(
                    "--prompts '{s}': a count (6) or humaneval, humaneval[:N], humaneval[A:B]"
                )),
            };
        };
        let bad =
            || format!("--prompts '{s}': expected humaneval, humaneval[:N] or humaneval[A:B]");
        let num = |v: &str, default: usize| -> std::result::Result<usize, String> {
            if v.trim().is_empty() {
                Ok(default)
            } else {
                v.trim().parse().map_err(|_| bad())
            }
        };
        let (start, end) = if rest.is_empty() {
            (0, HUMANEVAL_PROBLEMS)
        } else if let Some(n) = rest.strip_prefix(':') {
            (0, num(n, HUMANEVAL_PROBLEMS)?)
        } else {
            let inner = rest
                .strip_prefix('[')
                .and_then(|r| r.strip_suffix(']'))
                .ok_or_else(bad)?;
            let (a, b) = inner.split_once(':').ok_or_else(bad)?;
            (num(a, 0)?, num(b, HUMANEVAL_PROBLEMS)?)
        };
        if start >= end || end > HUMANEVAL_PROBLEMS {
            return Err(format!(
                "--prompts '{s}': the range {start}..{end} must be non-empty and within HumanEval's {HUMANEVAL_PROBLEMS} problems"
            ));
        }
        Ok(PromptSet::HumanEval { start, end })
    }
}

impl std::fmt::Display for PromptSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PromptSet::Mixed(n) => write!(f, "{n}"),
            PromptSet::HumanEval { start, end } => write!(f, "humaneval[{start}:{end}]"),
        }
    }
}

impl PromptSet {
    /// Number of prompts.
    pub fn len(&self) -> usize {
        match *self {
            PromptSet::Mixed(n) => n,
            PromptSet::HumanEval { start, end } => end - start,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The prompts as text, chat requests rendered with the target's template (what a peer
    /// given text tokenizes to the ids of [`Self::encode`]).
    pub fn texts(&self, tok: &Tokenizer) -> Result<Vec<String>> {
        let texts = match *self {
            PromptSet::Mixed(n) => mixed_texts(tok, n)?,
            PromptSet::HumanEval { start, end } => humaneval_texts(start, end)?,
        };
        Ok(texts
            .into_iter()
            .map(|(p, chat)| {
                if chat {
                    tok.template.render(&[Message::new("user", &p)], true)
                } else {
                    p
                }
            })
            .collect())
    }
    /// Texts from [`Self::texts`] as token ids.
    pub fn encode(tok: &Tokenizer, texts: &[String]) -> Result<Vec<Vec<u32>>> {
        texts
            .iter()
            .map(|t| tok.encode(t).map_err(crate::error::msg))
            .collect()
    }
}

/// Where HumanEval lives once fetched.
pub fn humaneval_file() -> PathBuf {
    llada::models::data_file("humaneval.jsonl")
}

/// HumanEval problems `start..end` as (text, chat) pairs: the `prompt` field, raw for even
/// problem indices, inside a "Complete this function" chat request for odd ones.
fn humaneval_texts(start: usize, end: usize) -> Result<Vec<(String, bool)>> {
    let f = humaneval_file();
    let body = std::fs::read_to_string(&f).map_err(|e| {
        Error::Invalid(format!(
            "{}: {e}; run `python3 scripts/fetch_humaneval.py` first",
            f.display()
        ))
    })?;
    let mut out = vec![];
    for (i, line) in body.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        if i < start || i >= end {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| Error::Invalid(format!("{} line {}: {e}", f.display(), i + 1)))?;
        let prompt = v["prompt"]
            .as_str()
            .with_context(|| format!("{} line {}: no \"prompt\" string", f.display(), i + 1))?;
        out.push(if i % 2 == 1 {
            (
                format!("Complete this function.\n\n```python\n{prompt}```"),
                true,
            )
        } else {
            (prompt.to_string(), false)
        });
    }
    if out.len() != end - start {
        bail!(
            "{}: {} problems, fewer than the {end} asked for",
            f.display(),
            out.len() + start
        );
    }
    Ok(out)
}

/// Bench prompts, alternating prose continuations (raw text, no template: held-out-style
/// prose) and chat requests (rendered with the target's chat template).
const PROMPTS: [(&str, bool); 8] = [
    ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.", false),
    ("Write a Python function that returns the n-th Fibonacci number, then explain how it works.", true),
    ("In the beginning God created the heaven and the earth. And the earth was without form, and void;", false),
    ("List the planets of the solar system in order from the Sun, one per line.", true),
    ("Mr. Darcy walked towards them with Mr. Bingley, and Elizabeth, who had been", false),
    ("Explain what a hash map is and give an example of using one.", true),
    ("Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox", false),
    ("Summarise the rules of chess in five sentences.", true),
];

/// `n` bench prompts as (text, chat) pairs: [`PROMPTS`] first, then held-out corpus windows
/// (see `--prompts`).
fn mixed_texts(tok: &Tokenizer, n: usize) -> Result<Vec<(String, bool)>> {
    let mut texts: Vec<(String, bool)> = PROMPTS
        .iter()
        .take(n)
        .map(|&(p, chat)| (p.to_string(), chat))
        .collect();
    if n > texts.len() {
        let files = [
            llada::models::data_file("austen.txt"),
            llada::models::data_file("kjv.txt"),
        ];
        if let Some(f) = files.iter().find(|f| !f.exists()) {
            bail!(
                "--prompts {n}: prompts past the first {} are held-out corpus windows, and {} is \
                 missing; run `python3 scripts/fetch_corpora.py` first",
                PROMPTS.len(),
                f.display()
            );
        }
        // Lines joined by the newline token, so a window decodes to the text as written.
        let nl = tok
            .encode("\n")
            .map_err(crate::error::msg)?
            .last()
            .copied()
            .context("the tokenizer encodes no newline")?;
        let corpus = llada_train::prose::Corpus::load(&files, &tok.inner, nl)?;
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(50);
        for (i, w) in corpus
            .windows(true, n - texts.len(), 32, &mut rng)
            .into_iter()
            .enumerate()
        {
            let text = tok.decode(&w);
            texts.push(if i % 2 == 1 {
                (format!("Continue this passage:\n{text}"), true)
            } else {
                (text, false)
            });
        }
    }
    Ok(texts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_specs_parse() {
        let he = |start, end| Ok(PromptSet::HumanEval { start, end });
        assert_eq!("6".parse(), Ok(PromptSet::Mixed(6)));
        assert_eq!("humaneval".parse(), he(0, 164));
        assert_eq!("humaneval[:10]".parse(), he(0, 10));
        assert_eq!("humaneval:10".parse(), he(0, 10));
        assert_eq!("humaneval[20:30]".parse(), he(20, 30));
        assert_eq!("humaneval[150:]".parse(), he(150, 164));
        for bad in [
            "0",
            "x",
            "humaneval[:0]",
            "humaneval[5:5]",
            "humaneval[:165]",
            "humaneval[3",
            "humanevalx",
        ] {
            assert!(bad.parse::<PromptSet>().is_err(), "{bad}");
        }
        assert_eq!(
            PromptSet::HumanEval { start: 0, end: 8 }.to_string(),
            "humaneval[0:8]"
        );
        assert_eq!(PromptSet::HumanEval { start: 2, end: 8 }.len(), 6);
    }
}
