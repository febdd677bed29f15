//! Diffusion decoding (LLaDA / Dream).
//!
//! The vanilla reference, as LLaDA's `generate`: the answer starts as `gen_length` mask tokens;
//! blocks of `block_length` are finished left to right; each block gets `steps / n_blocks`
//! steps; at every step the whole sequence is recomputed (bidirectional, no cache), every
//! masked position of the current block is predicted, and the `k` most confident predictions
//! are committed, `k` following LLaDA's schedule (`masked // steps`, remainder to the first
//! steps). Confidence is the softmax probability of the chosen token (`low_confidence`) or
//! uniform noise (`random`); positions beyond the current block get −∞.
//!
//! Dream's shifted logits are handled here, once: position `i` reads the output row `i − 1`.

use crate::sampling::{argmax, softmax};
use llada_model::{AttnMask, ForwardRequest, KvWrite, LogitRows, Model, ModelError};
use llada_runtime::Lane;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::time::Instant;

/// How confident the model is in a masked position's prediction (which positions commit first).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    /// Softmax probability of the chosen token (LLaDA `low_confidence`, Dream `maskgit_plus`).
    TopProb,
    /// Top-1 minus top-2 probability (Dream `topk_margin`).
    Margin,
    /// Negative entropy of the distribution (Dream `entropy`).
    NegEntropy,
    /// Uniform noise (LLaDA `random`).
    Random,
}

/// How many tokens each step commits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// LLaDA: `steps` split evenly over blocks; in a block, `masked // steps` per step with the
    /// remainder on the first steps.
    Uniform,
    /// Dream: timesteps `linspace(1, eps, steps + 1)`; step i commits
    /// `int(masked · (1 − s/t))` (all that remain at the last step).
    Timesteps { eps: f32 },
}

/// What the decoder keeps between steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    /// Recompute the whole sequence every step (the reference).
    None,
    /// KV of the prompt and finished blocks, refreshed at each block start (llada.cpp's baseline).
    Prefix,
    /// Prefix KV plus the KV of the masked suffix after the current block (Fast-dLLM dual
    /// cache); each step recomputes only the current block.
    Dual,
}

/// Options of the diffusion decoder.
#[derive(Debug, Clone)]
pub struct DiffusionConfig {
    pub gen_length: usize,
    pub steps: usize,
    pub block_length: usize,
    pub schedule: Schedule,
    pub confidence: Confidence,
    /// Gumbel-noise temperature (0 = argmax).
    pub temperature: f32,
    pub seed: u64,
    pub cache: CacheMode,
    /// Confidence-threshold parallel commit: every masked position of the block whose
    /// confidence reaches it commits (at least one per step); `steps` is then only a cap.
    pub threshold: Option<f32>,
}

impl DiffusionConfig {
    /// LLaDA's reference: one token per step, low-confidence remasking, blocks of `block_length`.
    pub fn one_per_step(gen_length: usize, block_length: usize) -> Self {
        Self {
            gen_length,
            steps: gen_length,
            block_length,
            schedule: Schedule::Uniform,
            confidence: Confidence::TopProb,
            temperature: 0.0,
            seed: 0,
            cache: CacheMode::None,
            threshold: None,
        }
    }
    /// Dream's reference (`diffusion_generate`): one block, timestep schedule.
    pub fn dream(gen_length: usize, steps: usize, confidence: Confidence) -> Self {
        Self {
            gen_length,
            steps,
            block_length: gen_length,
            schedule: Schedule::Timesteps { eps: 1e-3 },
            confidence,
            temperature: 0.0,
            seed: 0,
            cache: CacheMode::None,
            threshold: None,
        }
    }
    pub fn validate(&self) -> Result<(), String> {
        if self.gen_length == 0
            || self.block_length == 0
            || !self.gen_length.is_multiple_of(self.block_length)
        {
            return Err(format!(
                "gen_length {} must be a positive multiple of block_length {}",
                self.gen_length, self.block_length
            ));
        }
        let blocks = self.gen_length / self.block_length;
        if self.steps == 0 || !self.steps.is_multiple_of(blocks) {
            return Err(format!(
                "steps {} must be a positive multiple of the number of blocks {blocks}",
                self.steps
            ));
        }
        if let Some(t) = self.threshold {
            if !(t > 0.0 && t <= 1.0) {
                return Err(format!("threshold must be in (0, 1], got {t}"));
            }
        }
        if self.temperature.is_nan() || self.temperature < 0.0 {
            return Err(format!("temperature must be ≥ 0, got {}", self.temperature));
        }
        Ok(())
    }
}

/// Result of a diffusion generation.
#[derive(Debug, Clone, Serialize)]
pub struct DiffusionOutput {
    /// The `gen_length` answer tokens.
    pub tokens: Vec<u32>,
    pub forward_passes: usize,
    /// Rows computed over all passes (the dense lane's work).
    pub rows_computed: usize,
    pub total_s: f64,
}

/// LLaDA's `get_num_transfer_tokens`: how many tokens each of `steps` steps commits.
pub fn transfer_schedule(masked: usize, steps: usize) -> Vec<usize> {
    let base = masked / steps;
    let rem = masked % steps;
    (0..steps).map(|i| base + usize::from(i < rem)).collect()
}

/// Dream's per-step count: `int(masked · (1 − s/t))` with `t, s` from `linspace(1, eps, steps+1)`
/// in f32, everything left at the last step.
pub fn dream_transfer(masked: usize, step: usize, steps: usize, eps: f32) -> usize {
    if step + 1 >= steps {
        return masked;
    }
    let ts = |i: usize| -> f32 { 1.0 + (eps - 1.0) * (i as f32 / steps as f32) };
    let (t, s) = (ts(step), ts(step + 1));
    (masked as f32 * (1.0 - s / t)) as usize
}

/// Confidence and token for one position's logits (temperature 0: argmax).
fn score(logits: &[f32], conf: Confidence, tok: u32, rng: &mut StdRng) -> f32 {
    match conf {
        Confidence::Random => rng.random::<f32>(),
        c => {
            let mut p = logits.to_vec();
            softmax(&mut p);
            match c {
                Confidence::TopProb => p[tok as usize],
                Confidence::Margin => {
                    let mut top2 = f32::NEG_INFINITY;
                    for (i, v) in p.iter().enumerate() {
                        if i != tok as usize && *v > top2 {
                            top2 = *v;
                        }
                    }
                    p[tok as usize] - top2
                }
                _ => p.iter().map(|v| v * (v + 1e-10).ln()).sum(),
            }
        }
    }
}

/// The diffusion decoder: every strategy is an option of this one loop.
pub fn generate(
    model: &Model,
    lane: &Lane,
    prompt: &[u32],
    cfg: &DiffusionConfig,
) -> Result<DiffusionOutput, ModelError> {
    cfg.validate().map_err(ModelError::BadRequest)?;
    let mask = model.config.mask_id.ok_or_else(|| {
        ModelError::BadRequest("this model has no mask token: not a diffusion LM".into())
    })?;
    if prompt.is_empty() {
        return Err(ModelError::BadRequest("the prompt is empty".into()));
    }
    let t0 = Instant::now();
    let p = prompt.len();
    let n = p + cfg.gen_length;
    if n > model.config.max_ctx {
        return Err(ModelError::ContextOverflow {
            pos: n as u32,
            ctx: model.config.max_ctx,
        });
    }
    let shift = model.config.shift_logits;
    let mut x: Vec<u32> = prompt.to_vec();
    x.extend(std::iter::repeat_n(mask, cfg.gen_length));
    let positions: Vec<u32> = (0..n as u32).collect();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let blocks = cfg.gen_length / cfg.block_length;
    let steps_per_block = cfg.steps / blocks;
    let mut cache = model.new_cache();
    let mut prefix_len = 0usize;
    let (mut passes, mut rows_computed) = (0, 0);
    for b in 0..blocks {
        let (bs, be) = (p + b * cfg.block_length, p + (b + 1) * cfg.block_length);
        let masked0 = x[bs..be].iter().filter(|&&t| t == mask).count();
        let plan = transfer_schedule(masked0, steps_per_block);
        let mut step = 0;
        let mut block_start = true;
        while x[bs..be].contains(&mask) {
            if cfg.threshold.is_none() && step >= steps_per_block {
                break;
            }
            // Which rows this pass computes, and where their K/V go.
            let first = if shift { bs - 1 } else { bs };
            let (row0, row1, slots): (usize, usize, Vec<Option<usize>>) =
                match (cfg.cache, block_start) {
                    (CacheMode::None, _) => (0, n, vec![None; n]),
                    (CacheMode::Prefix, true) => {
                        let r0 = cache.len().min(first);
                        (r0, n, (r0..n).map(|r| (r < bs).then_some(r)).collect())
                    }
                    (CacheMode::Dual, true) => {
                        cache.truncate(prefix_len);
                        let r0 = prefix_len.min(first);
                        let mut next = prefix_len;
                        let slots = (r0..n)
                            .map(|r| {
                                if r < bs || r >= be {
                                    next += 1;
                                    Some(next - 1)
                                } else {
                                    None
                                }
                            })
                            .collect();
                        (r0, n, slots)
                    }
                    // Later steps of a block: only the active rows; Dream also refreshes row bs−1
                    // (its output predicts position bs) into its own slot.
                    (CacheMode::Prefix, false) => (
                        first,
                        n,
                        (first..n).map(|r| (r < bs).then_some(r)).collect(),
                    ),
                    (CacheMode::Dual, false) => (
                        first,
                        be,
                        (first..be).map(|r| (r < bs).then_some(r)).collect(),
                    ),
                };
            // Logits only for rows that predict a masked position of the block.
            let targets: Vec<usize> = (bs..be).filter(|&i| x[i] == mask).collect();
            let logit_rows: Vec<usize> = targets
                .iter()
                .map(|&i| if shift { i.max(1) - 1 } else { i } - row0)
                .collect();
            let out = lane.run(|| {
                model.forward(
                    &ForwardRequest {
                        tokens: &x[row0..row1],
                        positions: &positions[row0..row1],
                        mask: AttnMask::Bidirectional,
                        kv_write: KvWrite::Slots(&slots),
                        logits: LogitRows::Rows(&logit_rows),
                    },
                    &mut cache,
                )
            })?;
            passes += 1;
            rows_computed += row1 - row0;
            if cfg.cache == CacheMode::Dual && block_start {
                prefix_len = bs;
            }
            block_start = false;
            let mut cand: Vec<(f32, usize, u32)> = Vec::with_capacity(targets.len());
            for (j, &i) in targets.iter().enumerate() {
                let logits = out.row(j);
                let tok = if cfg.temperature > 0.0 {
                    // Gumbel-max sampling, as LLaDA's add_gumbel_noise.
                    let noisy: Vec<f32> = logits
                        .iter()
                        .map(|&v| {
                            let u: f64 = rng.random::<f64>().max(1e-20);
                            (v as f64 / cfg.temperature as f64 - (-(u.ln())).ln()) as f32
                        })
                        .collect();
                    argmax(&noisy)
                } else {
                    argmax(logits)
                };
                cand.push((score(logits, cfg.confidence, tok, &mut rng), i, tok));
            }
            // Highest confidence first; ties to the leftmost position.
            cand.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let k = match (cfg.threshold, cfg.schedule) {
                (Some(th), _) => cand.iter().filter(|c| c.0 >= th).count().max(1),
                (None, Schedule::Uniform) => plan[step],
                (None, Schedule::Timesteps { eps }) => {
                    dream_transfer(targets.len(), step, steps_per_block, eps)
                }
            };
            for &(_, i, tok) in cand.iter().take(k) {
                x[i] = tok;
            }
            step += 1;
        }
    }
    Ok(DiffusionOutput {
        tokens: x[p..].to_vec(),
        forward_passes: passes,
        rows_computed,
        total_s: t0.elapsed().as_secs_f64(),
    })
}

/// The vanilla reference (no cache, no threshold), kept as a named entry point.
pub fn generate_vanilla(
    model: &Model,
    lane: &Lane,
    prompt: &[u32],
    cfg: &DiffusionConfig,
) -> Result<DiffusionOutput, ModelError> {
    let cfg = DiffusionConfig {
        cache: CacheMode::None,
        threshold: None,
        ..cfg.clone()
    };
    generate(model, lane, prompt, &cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_matches_llada() {
        assert_eq!(transfer_schedule(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(transfer_schedule(32, 32), vec![1; 32]);
        assert_eq!(transfer_schedule(5, 8), vec![1, 1, 1, 1, 1, 0, 0, 0]);
        assert_eq!(transfer_schedule(10, 4).iter().sum::<usize>(), 10);
    }
}
