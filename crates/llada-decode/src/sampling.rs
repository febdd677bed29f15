//! Token selection from logits: the one place where the engine turns logits into tokens.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// How to pick a token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 = greedy (argmax).
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1 = all).
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Check ranges; the message is meant for the user.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature must be ≥ 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p must be in (0, 1], got {}", self.top_p));
        }
        Ok(())
    }
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
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

    /// The distribution the sampler draws from: softmax(logits / T) restricted to top-k and
    /// top-p, renormalised. For greedy, a one-hot vector on the argmax.
    pub fn distribution(&self, logits: &[f32]) -> Vec<f32> {
        let p = &self.params;
        let mut probs = vec![0f32; logits.len()];
        if p.is_greedy() {
            probs[argmax(logits) as usize] = 1.0;
            return probs;
        }
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        if p.top_k > 0 {
            idx.truncate(p.top_k);
        }
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

    /// Pick the next token.
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
}
