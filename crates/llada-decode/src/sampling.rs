//! Token selection from logits: the one place where the engine turns logits into tokens.
//!
//! The order of the transformations is Hugging Face's `generate` (and, for the penalty,
//! llama.cpp's `penalties` sampler):
//! 1. repetition penalty over the last `repeat_last_n` tokens of the history (prompt and
//!    generated): a positive logit is divided by the penalty, a negative one multiplied;
//! 2. greedy (temperature 0): the argmax of the penalised logits — nothing below applies;
//! 3. temperature, then top-k, then top-p (nucleus), then min-p (drop tokens whose probability
//!    is below `min_p` times the most likely token's), renormalised; then a seeded draw.
//!
//! Every decoder that emits tokens in a model's name (autoregressive, speculative acceptance,
//! the AHASD verifier) goes through [`SamplingParams::penalized`] with the history that
//! precedes the position, so speculative decoding stays lossless under penalties.

use crate::error::DecodeError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// How to pick a token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 = greedy (argmax).
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1 = all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = off).
    pub min_p: f32,
    /// Repetition penalty on tokens of the last `repeat_last_n` of the history (1 = off).
    pub repeat_penalty: f32,
    /// How many of the latest history tokens the penalty looks at (0 = off).
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Check ranges; the message is meant for the user.
    pub fn validate(&self) -> Result<(), DecodeError> {
        self.check().map_err(DecodeError::Invalid)
    }

    fn check(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature must be ≥ 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p must be in (0, 1], got {}", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p < 1.0) {
            return Err(format!("min-p must be in [0, 1), got {}", self.min_p));
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return Err(format!(
                "the repeat penalty must be > 0 (1 = off), got {}",
                self.repeat_penalty
            ));
        }
        Ok(())
    }
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
    /// Whether [`Self::penalized`] changes anything.
    pub fn has_penalty(&self) -> bool {
        self.repeat_penalty != 1.0 && self.repeat_last_n > 0
    }

    /// `logits` with the repetition penalty applied for the last `repeat_last_n` tokens of
    /// `history` (each distinct token once); borrowed unchanged when there is no penalty.
    pub fn penalized<'a>(&self, logits: &'a [f32], history: &[u32]) -> Cow<'a, [f32]> {
        if !self.has_penalty() || history.is_empty() {
            return Cow::Borrowed(logits);
        }
        let mut out = logits.to_vec();
        let recent = &history[history.len().saturating_sub(self.repeat_last_n)..];
        let mut seen: Vec<u32> = Vec::with_capacity(recent.len());
        for &t in recent {
            if seen.contains(&t) {
                continue;
            }
            seen.push(t);
            if let Some(l) = out.get_mut(t as usize) {
                *l = if *l > 0.0 {
                    *l / self.repeat_penalty
                } else {
                    *l * self.repeat_penalty
                };
            }
        }
        Cow::Owned(out)
    }

    /// The greedy choice after `history`: the argmax of the penalised logits.
    pub fn greedy_after(&self, logits: &[f32], history: &[u32]) -> u32 {
        argmax(&self.penalized(logits, history))
    }
}

/// Index of the largest value (first on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Softmax in place (max-subtracted).
pub fn softmax(x: &mut [f32]) {
    let mx = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0f32;
    for v in x.iter_mut() {
        *v = (*v - mx).exp();
        s += *v;
    }
    for v in x.iter_mut() {
        *v /= s;
    }
}

/// A sampler with its own seeded RNG.
pub struct Sampler {
    pub params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Self {
            params,
            rng: StdRng::seed_from_u64(params.seed),
        }
    }

    /// The distribution the sampler draws from: softmax(logits / T) restricted to top-k, top-p
    /// and min-p, renormalised. For greedy, a one-hot vector on the argmax. No penalty: see
    /// [`Self::distribution_after`].
    pub fn distribution(&self, logits: &[f32]) -> Vec<f32> {
        let p = &self.params;
        let mut probs = vec![0f32; logits.len()];
        if p.is_greedy() {
            probs[argmax(logits) as usize] = 1.0;
            return probs;
        }
        // Most likely first, ties by id. With top-k, only the k best are sorted: selecting them
        // is linear, where sorting a 150k vocabulary for every sampled token cost milliseconds.
        let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        if p.top_k > 0 && p.top_k < idx.len() {
            idx.select_nth_unstable_by(p.top_k - 1, by_logit);
            idx.truncate(p.top_k);
        }
        idx.sort_unstable_by(by_logit);
        let mx = logits[idx[0]];
        let mut w: Vec<f32> = idx
            .iter()
            .map(|&i| ((logits[i] - mx) / p.temperature).exp())
            .collect();
        let total: f32 = w.iter().sum();
        w.iter_mut().for_each(|v| *v /= total);
        if p.top_p < 1.0 {
            let mut acc = 0f32;
            let mut keep = w.len();
            for (j, v) in w.iter().enumerate() {
                acc += v;
                if acc >= p.top_p {
                    keep = j + 1;
                    break;
                }
            }
            w.truncate(keep);
            idx.truncate(keep);
            let total: f32 = w.iter().sum();
            w.iter_mut().for_each(|v| *v /= total);
        }
        if p.min_p > 0.0 {
            // `w` is sorted, most likely first.
            let floor = p.min_p * w[0];
            let keep = w.iter().take_while(|&&v| v >= floor).count().max(1);
            w.truncate(keep);
            idx.truncate(keep);
            let total: f32 = w.iter().sum();
            w.iter_mut().for_each(|v| *v /= total);
        }
        for (i, v) in idx.iter().zip(w) {
            probs[*i] = v;
        }
        probs
    }

    /// Draw an index from a probability vector.
    pub fn draw(&mut self, probs: &[f32]) -> u32 {
        let u: f32 = self.rng.random();
        let mut acc = 0f32;
        let mut last = 0;
        for (i, p) in probs.iter().enumerate() {
            if *p > 0.0 {
                acc += p;
                last = i;
                if u < acc {
                    return i as u32;
                }
            }
        }
        last as u32
    }

    /// A uniform draw in [0, 1) from the sampler's stream (rejection sampling).
    pub fn uniform(&mut self) -> f32 {
        self.rng.random()
    }

    /// [`Self::distribution`] of the logits penalised for `history` (the tokens before the
    /// position, oldest first).
    pub fn distribution_after(&self, logits: &[f32], history: &[u32]) -> Vec<f32> {
        self.distribution(&self.params.penalized(logits, history))
    }

    /// Pick the next token after `history` (penalties, then [`Self::sample`]).
    pub fn sample_after(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let l = self.params.penalized(logits, history);
        self.sample(&l)
    }

    /// Pick the next token (no penalty).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let probs = self.distribution(logits);
        self.draw(&probs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_argmax() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 3.0, 2.9, -1.0]), 1);
    }

    #[test]
    fn top_k_and_top_p_restrict_support() {
        let logits = [2.0, 1.0, 0.5, 0.0, -1.0];
        let s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            seed: 1,
            ..Default::default()
        });
        let d = s.distribution(&logits);
        assert!(d[2] == 0.0 && d[3] == 0.0 && d[4] == 0.0);
        assert!((d[0] + d[1] - 1.0).abs() < 1e-6);
        let e0 = (2.0f32).exp();
        let e1 = (1.0f32).exp();
        assert!((d[0] - e0 / (e0 + e1)).abs() < 1e-6);
        // top-p 0.5: the first token alone has p ≈ 0.53 ≥ 0.5.
        let s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: 1,
            ..Default::default()
        });
        let d = s.distribution(&logits);
        assert_eq!(d[0], 1.0);
    }

    #[test]
    fn sampling_follows_the_distribution_and_is_seeded() {
        let logits = [0.0f32, (3.0f32).ln()]; // p = [0.25, 0.75]
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 42,
            ..Default::default()
        };
        let mut s = Sampler::new(params);
        let n = 20000;
        let ones = (0..n).filter(|_| s.sample(&logits) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.015, "frac {frac}");
        let mut a = Sampler::new(params);
        let mut b = Sampler::new(params);
        let xa: Vec<u32> = (0..50).map(|_| a.sample(&logits)).collect();
        let xb: Vec<u32> = (0..50).map(|_| b.sample(&logits)).collect();
        assert_eq!(xa, xb);
    }

    #[test]
    fn temperature_sharpens() {
        let logits = [1.0f32, 0.0];
        let hot = Sampler::new(SamplingParams {
            temperature: 2.0,
            ..Default::default()
        })
        .distribution(&logits);
        let cold = Sampler::new(SamplingParams {
            temperature: 0.5,
            ..Default::default()
        })
        .distribution(&logits);
        assert!(cold[0] > hot[0]);
    }

    /// Hand-computed from llama.cpp's rule (`llama_sampler_penalties_apply`): logit > 0 → /p,
    /// else ·p, each distinct token of the window once; tokens outside the window untouched.
    #[test]
    fn repeat_penalty_follows_llama_cpp() {
        let p = SamplingParams {
            repeat_penalty: 2.0,
            repeat_last_n: 3,
            ..Default::default()
        };
        let logits = [4.0f32, -1.0, 3.0, 0.5, 1.0];
        // History 3 0 1 1: the window is the last three (0, 1, 1); token 3 is outside it.
        let l = p.penalized(&logits, &[3, 0, 1, 1]);
        assert_eq!(&*l, &[2.0, -2.0, 3.0, 0.5, 1.0]);
        // The penalty moves the greedy choice from 0 to 2.
        assert_eq!(argmax(&logits), 0);
        assert_eq!(p.greedy_after(&logits, &[3, 0, 1, 1]), 2);
        // Off: borrowed, unchanged; an id past the vocabulary is ignored.
        let off = SamplingParams::default();
        assert!(matches!(off.penalized(&logits, &[0]), Cow::Borrowed(_)));
        assert_eq!(&*p.penalized(&logits, &[99]), &logits);
    }

    /// min-p 0.2 at T = 1 over logits ln(10), ln(5), ln(1.5), ln(1): probabilities
    /// 10/17.5, 5/17.5, 1.5/17.5, 1/17.5; the floor 0.2 · 10/17.5 = 2/17.5 keeps the first two,
    /// renormalised to 2/3 and 1/3.
    #[test]
    fn min_p_drops_tokens_below_a_share_of_the_best() {
        let logits = [10f32.ln(), 5f32.ln(), 1.5f32.ln(), 0.0];
        let s = Sampler::new(SamplingParams {
            temperature: 1.0,
            min_p: 0.2,
            ..Default::default()
        });
        let d = s.distribution(&logits);
        assert!((d[0] - 2.0 / 3.0).abs() < 1e-6 && (d[1] - 1.0 / 3.0).abs() < 1e-6);
        assert_eq!((d[2], d[3]), (0.0, 0.0));
        // Penalised distribution: token 0 (history) falls to 10/1.25 → 8 of 8 + 5 + 1.5 + 1;
        // the floor 0.2 · 8 = 1.6 still keeps only tokens 0 and 1: 8/13 and 5/13.
        let s = Sampler::new(SamplingParams {
            temperature: 1.0,
            min_p: 0.2,
            repeat_penalty: 1.0 / (1.0 - (1.25f32.ln() / 10f32.ln())),
            repeat_last_n: 1,
            ..Default::default()
        });
        let d = s.distribution_after(&logits, &[0]);
        assert!((d[0] - 8.0 / 13.0).abs() < 1e-4, "{d:?}");
        assert!((d[1] - 5.0 / 13.0).abs() < 1e-4, "{d:?}");
        assert!(SamplingParams {
            min_p: 1.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            repeat_penalty: 0.0,
            ..Default::default()
        }
        .validate()
        .is_err());
    }
}
