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

/// How committed positions are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Remasking {
    LowConfidence,
    Random,
}

/// Options of the vanilla decoder.
#[derive(Debug, Clone)]
pub struct DiffusionConfig {
    pub gen_length: usize,
    pub steps: usize,
    pub block_length: usize,
    pub remasking: Remasking,
    /// Gumbel-noise temperature (0 = argmax).
    pub temperature: f32,
    pub seed: u64,
}

impl DiffusionConfig {
    /// One token per step, one block over the whole answer... split in blocks of `block`.
    pub fn one_per_step(gen_length: usize, block_length: usize) -> Self {
        Self {
            gen_length,
            steps: gen_length,
            block_length,
            remasking: Remasking::LowConfidence,
            temperature: 0.0,
            seed: 0,
        }
    }
    pub fn validate(&self) -> Result<(), String> {
        if self.gen_length == 0 || self.block_length == 0 || self.gen_length % self.block_length != 0 {
            return Err(format!("gen_length {} must be a positive multiple of block_length {}", self.gen_length, self.block_length));
        }
        let blocks = self.gen_length / self.block_length;
        if self.steps == 0 || self.steps % blocks != 0 {
            return Err(format!("steps {} must be a positive multiple of the number of blocks {blocks}", self.steps));
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
    pub total_s: f64,
}

/// LLaDA's `get_num_transfer_tokens`: how many tokens each of `steps` steps commits.
pub fn transfer_schedule(masked: usize, steps: usize) -> Vec<usize> {
    let base = masked / steps;
    let rem = masked % steps;
    (0..steps).map(|i| base + usize::from(i < rem)).collect()
}

/// Per-position logits of `tokens` (full bidirectional pass), aligned so that row `i` predicts
/// position `i` (Dream's shift applied here).
pub fn position_logits(model: &Model, tokens: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let mut cache = model.new_cache();
    let out = model.forward(
        &ForwardRequest {
            tokens,
            positions: &positions,
            mask: AttnMask::Bidirectional,
            kv_write: KvWrite::None,
            logits: LogitRows::All,
        },
        &mut cache,
    )?;
    let rows: Vec<Vec<f32>> = (0..tokens.len()).map(|i| out.row(i).to_vec()).collect();
    Ok(if model.config.shift_logits {
        // Dream: the prediction for position i is output row i − 1 (row 0 keeps its own).
        let mut shifted = Vec::with_capacity(rows.len());
        shifted.push(rows[0].clone());
        shifted.extend(rows[..rows.len() - 1].iter().cloned());
        shifted
    } else {
        rows
    })
}

/// The vanilla decoder.
pub fn generate_vanilla(model: &Model, lane: &Lane, prompt: &[u32], cfg: &DiffusionConfig) -> Result<DiffusionOutput, ModelError> {
    cfg.validate().map_err(ModelError::BadRequest)?;
    let mask = model
        .config
        .mask_id
        .ok_or_else(|| ModelError::BadRequest("this model has no mask token: not a diffusion LM".into()))?;
    let t0 = Instant::now();
    let p = prompt.len();
    if p + cfg.gen_length > model.config.max_ctx {
        return Err(ModelError::ContextOverflow { pos: (p + cfg.gen_length) as u32, ctx: model.config.max_ctx });
    }
    let mut x: Vec<u32> = prompt.to_vec();
    x.extend(std::iter::repeat_n(mask, cfg.gen_length));
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let blocks = cfg.gen_length / cfg.block_length;
    let steps_per_block = cfg.steps / blocks;
    let mut passes = 0;
    for b in 0..blocks {
        let (bs, be) = (p + b * cfg.block_length, p + (b + 1) * cfg.block_length);
        let masked = x[bs..be].iter().filter(|&&t| t == mask).count();
        let schedule = transfer_schedule(masked, steps_per_block);
        for &k in &schedule {
            let logits = lane.run(|| position_logits(model, &x))?;
            passes += 1;
            let mut cand: Vec<(f32, usize, u32)> = vec![];
            for i in bs..be {
                if x[i] != mask {
                    continue;
                }
                let mut l = logits[i].clone();
                if cfg.temperature > 0.0 {
                    // Gumbel-max sampling, as LLaDA's add_gumbel_noise.
                    for v in l.iter_mut() {
                        let u: f64 = rng.random::<f64>().max(1e-20);
                        *v = (*v as f64 / cfg.temperature as f64 - (-(u.ln())).ln()) as f32;
                    }
                }
                let tok = argmax(&l);
                let conf = match cfg.remasking {
                    Remasking::LowConfidence => {
                        let mut pr = logits[i].clone();
                        softmax(&mut pr);
                        pr[tok as usize]
                    }
                    Remasking::Random => rng.random::<f32>(),
                };
                cand.push((conf, i, tok));
            }
            // Highest confidence first; ties to the leftmost position (stable order).
            cand.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for &(_, i, tok) in cand.iter().take(k) {
                x[i] = tok;
            }
        }
    }
    Ok(DiffusionOutput { tokens: x[p..].to_vec(), forward_passes: passes, total_s: t0.elapsed().as_secs_f64() })
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
