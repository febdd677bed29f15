//! Prose data: the Austen and KJV corpora (`scripts/fetch_corpora.py` writes `data/*.txt`),
//! a byte-level BPE trained on them with the `tokenizers` crate, and random training windows.
//! The last 2% of each corpus (by lines) is held out.

use crate::objective::Batch;
use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use rand::Rng;
use std::path::Path;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

/// Special tokens of the prose tokenizer, ids 0, 1, 2.
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|startoftext|>", "<|mask|>"];

/// Train a byte-level BPE of `vocab` tokens on `files`.
pub fn train_bpe(files: &[impl AsRef<Path>], vocab: usize) -> Result<Tokenizer> {
    let mut trainer = TrainerWrapper::BpeTrainer(
        BpeTrainerBuilder::new()
            .vocab_size(vocab)
            .min_frequency(2)
            .show_progress(false)
            .special_tokens(
                SPECIALS
                    .iter()
                    .map(|s| AddedToken::from(*s, true))
                    .collect(),
            )
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build(),
    );
    let mut tok = Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
    let files: Vec<String> = files
        .iter()
        .map(|p| p.as_ref().display().to_string())
        .collect();
    tok.train_from_files(&mut trainer, files)
        .map_err(|e| anyhow::anyhow!("training the tokenizer: {e}"))?;
    Ok(tok)
}

/// A tokenized corpus: train and held-out id streams (paragraphs separated by EOS).
pub struct Corpus {
    pub train: Vec<u32>,
    pub heldout: Vec<u32>,
}

impl Corpus {
    /// Tokenize `files` (one paragraph per line) with `tok`; `eos` separates paragraphs.
    pub fn load(files: &[impl AsRef<Path>], tok: &Tokenizer, eos: u32) -> Result<Self> {
        let mut train = vec![];
        let mut heldout = vec![];
        for f in files {
            let f = f.as_ref();
            let text = std::fs::read_to_string(f).with_context(|| {
                format!("reading {} (run scripts/fetch_corpora.py)", f.display())
            })?;
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let cut = lines.len() * 98 / 100;
            for (i, chunk) in [&lines[..cut], &lines[cut..]].into_iter().enumerate() {
                let enc = tok
                    .encode_batch(chunk.to_vec(), false)
                    .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
                let dst = if i == 0 { &mut train } else { &mut heldout };
                for e in enc {
                    dst.extend_from_slice(e.get_ids());
                    dst.push(eos);
                }
            }
        }
        Ok(Self { train, heldout })
    }

    /// How many distinct windows of `t` tokens [`Corpus::windows`] draws from (0 when the
    /// stream is shorter than one window).
    pub fn window_count(&self, heldout: bool, t: usize) -> usize {
        let src = if heldout { &self.heldout } else { &self.train };
        if t == 0 || src.len() < t {
            0
        } else {
            src.len().saturating_sub(t + 1).max(1)
        }
    }

    /// `b` random windows of `t` tokens.
    pub fn windows(&self, heldout: bool, b: usize, t: usize, rng: &mut impl Rng) -> Vec<Vec<u32>> {
        let src = if heldout { &self.heldout } else { &self.train };
        (0..b)
            .map(|_| {
                let s = rng.random_range(0..src.len().saturating_sub(t + 1).max(1));
                src[s..(s + t).min(src.len())].to_vec()
            })
            .collect()
    }
}

/// Reduce the corpus to its `k` most frequent training ids (ties by id): returns the ids (row
/// order) and the fraction of training tokens they cover, and rewrites both streams to row
/// indices, every other id becoming row `k` (the shared "other" row).
pub fn reduce_vocab(corpus: &mut Corpus, vocab: usize, k: usize) -> (Vec<u32>, f64) {
    reduce_vocab_with(corpus, vocab, k, &[])
}

/// [`reduce_vocab`] where the frequencies also count `extra` tokens (a draft's distillation
/// text: what its target writes, chat template included), weighted so that `extra` as a whole
/// counts as much as the training corpus.
pub fn reduce_vocab_with(
    corpus: &mut Corpus,
    vocab: usize,
    k: usize,
    extra: &[u32],
) -> (Vec<u32>, f64) {
    let mut count = vec![0f64; vocab];
    for &t in &corpus.train {
        if let Some(c) = count.get_mut(t as usize) {
            *c += 1.0;
        }
    }
    let w = corpus.train.len() as f64 / extra.len().max(1) as f64;
    for &t in extra {
        if let Some(c) = count.get_mut(t as usize) {
            *c += w;
        }
    }
    let mut order: Vec<u32> = (0..vocab as u32).collect();
    order.sort_by(|&a, &b| {
        count[b as usize]
            .total_cmp(&count[a as usize])
            .then(a.cmp(&b))
    });
    order.truncate(k.min(vocab));
    let cover = apply_vocab(corpus, &order, vocab);
    (order, cover)
}

/// Rewrite both streams to the rows of the reduced vocabulary `ids` (others: row `ids.len()`);
/// returns the fraction of training tokens inside `ids`.
pub fn apply_vocab(corpus: &mut Corpus, ids: &[u32], vocab: usize) -> f64 {
    let row = row_map(ids, vocab);
    let other = ids.len() as u32;
    for s in [&mut corpus.train, &mut corpus.heldout] {
        to_rows(&row, other, s);
    }
    let covered = corpus.train.iter().filter(|&&r| r != other).count();
    covered as f64 / corpus.train.len().max(1) as f64
}

/// Id → row of a reduced vocabulary `ids` (row order) over `vocab` ids; every other id maps to
/// row `ids.len()`, the shared "other" row.
pub fn row_map(ids: &[u32], vocab: usize) -> Vec<u32> {
    let mut row = vec![ids.len() as u32; vocab];
    for (r, &t) in ids.iter().enumerate() {
        row[t as usize] = r as u32;
    }
    row
}

/// Rewrite full ids to rows with a [`row_map`]; ids beyond the map become `other`.
pub fn to_rows(row: &[u32], other: u32, tokens: &mut [u32]) {
    for t in tokens.iter_mut() {
        *t = row.get(*t as usize).copied().unwrap_or(other);
    }
}

/// Masked-diffusion pretraining batch: every position masked with probability `t` (at least
/// one), weight `1 / (t · T)`. Row `r` draws `t` from the `r`-th of `B` equal slices of
/// `[ε, 1]` (one shared offset): the marginal is `U(ε, 1)` as in LLaDA, with far less variance
/// in the 1/t-weighted loss at small batches (the task objective does the same).
pub fn pretrain_batch(
    rows: &[Vec<u32>],
    mask_id: u32,
    eps: f64,
    rng: &mut impl Rng,
    dev: &Device,
) -> Result<Batch> {
    let (b, t) = (rows.len(), rows[0].len());
    let (mut ids, mut tg, mut w) = (
        Vec::with_capacity(b * t),
        Vec::with_capacity(b * t),
        Vec::with_capacity(b * t),
    );
    let u: f64 = rng.random();
    for (r, row) in rows.iter().enumerate() {
        let tt: f64 = eps + (1.0 - eps) * ((r as f64 + u) / b as f64);
        let mut masked: Vec<bool> = (0..t).map(|_| rng.random::<f64>() < tt).collect();
        if !masked.iter().any(|m| *m) {
            masked[rng.random_range(0..t)] = true;
        }
        for i in 0..t {
            ids.push(if masked[i] { mask_id } else { row[i] });
            tg.push(row[i]);
            w.push(if masked[i] {
                (1.0 / (tt * t as f64)) as f32
            } else {
                0.0
            });
        }
    }
    Ok(Batch {
        ids: Tensor::from_vec(ids, (b, t), dev)?,
        targets: Tensor::from_vec(tg, (b, t), dev)?,
        weights: Tensor::from_vec(w, (b, t), dev)?,
        tokens: b * t,
        causal: false,
        two_stream: false,
        soft: None,
        ends: None,
    })
}

/// Two-stream warm-up batch over windows of `t` tokens, LLaDA's own alignment
/// ([`crate::objective::two_stream_layout`]): each row is its content stream followed by a
/// query stream of `t` masks; query `i` sees content `0..i` and predicts token `i` (weight
/// `1/(t − 1)`; position 0 carries no loss, it has no left context). This is the autoregressive
/// warm-up of a LLaDA model: a prediction from the left context at the masked position itself,
/// as semi-autoregressive block decoding asks of it.
pub fn two_stream_windows(rows: &[Vec<u32>], mask_id: u32, dev: &Device) -> Result<Batch> {
    Ok(crate::objective::two_stream_rows(
        rows,
        &vec![1; rows.len()],
        None,
        mask_id,
        dev,
    )?)
}

/// Next-token batch over windows of `t + 1` tokens.
pub fn next_token_windows(rows: &[Vec<u32>], dev: &Device) -> Result<Batch> {
    let (b, t) = (rows.len(), rows[0].len() - 1);
    let ids: Vec<u32> = rows.iter().flat_map(|r| r[..t].to_vec()).collect();
    let tg: Vec<u32> = rows.iter().flat_map(|r| r[1..].to_vec()).collect();
    Ok(Batch {
        ids: Tensor::from_vec(ids, (b, t), dev)?,
        targets: Tensor::from_vec(tg, (b, t), dev)?,
        weights: Tensor::from_vec(vec![1.0 / t as f32; b * t], (b, t), dev)?,
        tokens: b * t,
        causal: true,
        two_stream: false,
        soft: None,
        ends: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn pretrain_masks_everywhere_with_inverse_t_weight() {
        let rows = vec![(0..64).collect::<Vec<u32>>(); 16];
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let b = pretrain_batch(&rows, 999, 1e-3, &mut rng, &Device::Cpu).unwrap();
        let ids: Vec<Vec<u32>> = b.ids.to_vec2().unwrap();
        let w: Vec<Vec<f32>> = b.weights.to_vec2().unwrap();
        for (r, wr) in ids.iter().zip(&w) {
            let m: Vec<usize> = (0..64).filter(|&i| r[i] == 999).collect();
            assert!(!m.is_empty());
            let t = 1.0 / (wr[m[0]] * 64.0);
            assert!(t > 0.0 && t <= 1.0 + 1e-5);
            assert!((0..64).all(|i| (r[i] == 999) == (wr[i] > 0.0)));
        }
    }

    #[test]
    fn reduce_vocab_keeps_the_most_frequent_ids() {
        let mut c = Corpus {
            train: vec![5, 5, 5, 7, 7, 1, 9],
            heldout: vec![7, 3, 5],
        };
        let (ids, cover) = reduce_vocab(&mut c, 10, 2);
        assert_eq!(ids, vec![5, 7]);
        assert!((cover - 5.0 / 7.0).abs() < 1e-12);
        assert_eq!(c.train, vec![0, 0, 0, 1, 1, 2, 2]);
        assert_eq!(c.heldout, vec![1, 2, 0]);
        // Extra text counts as much as the corpus as a whole: 3 (weight 7/3 each) beats 7.
        let mut c = Corpus {
            train: vec![5, 5, 5, 7, 7, 1, 9],
            heldout: vec![],
        };
        let (ids, cover) = reduce_vocab_with(&mut c, 10, 2, &[3, 3, 3]);
        assert_eq!(ids, vec![3, 5]);
        assert!((cover - 3.0 / 7.0).abs() < 1e-12);
    }

    #[test]
    fn bpe_trains_and_roundtrips() {
        let dir = std::env::temp_dir().join(format!("llada-bpe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a.txt");
        std::fs::write(
            &f,
            "It is a truth universally acknowledged.\nIn the beginning was the Word.\n".repeat(50),
        )
        .unwrap();
        let tok = train_bpe(&[&f], 300).unwrap();
        assert_eq!(tok.token_to_id("<|mask|>"), Some(2));
        let e = tok.encode("In the beginning", false).unwrap();
        assert_eq!(tok.decode(e.get_ids(), true).unwrap(), "In the beginning");
        let c = Corpus::load(&[&f], &tok, 0).unwrap();
        assert!(!c.train.is_empty() && !c.heldout.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
