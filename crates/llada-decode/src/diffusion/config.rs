//! The decoder's options: which positions commit first ([`Confidence`]), how many per step
//! ([`Schedule`]), what is cached between steps ([`CacheMode`]), and the rest of
//! [`DiffusionConfig`] with its validation.

use crate::error::DecodeError;
use crate::revision::Revision;
use crate::window::{MultiBlock, WINDOW_SHAPES};
use serde::Serialize;

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
    /// KV of the prompt and finished blocks (llada.cpp's baseline): each finished block is
    /// appended at the next block start; the prompt's KV is the first pass's unless
    /// [`DiffusionConfig::refresh_prefix`] recomputes the whole prefix there.
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
    /// Prefix and dual caches: at each block start recompute the whole cached prefix (prompt and
    /// finished blocks), as Fast-dLLM's block-wise cache does, so its KV has seen every token
    /// committed so far. `false` (the default) only appends the newly finished block: the
    /// prompt's KV stays as computed while the whole answer was masked — fewer rows per block;
    /// on the task models the refresh bought no accuracy (docs/diffusion.md).
    pub refresh_prefix: bool,
    /// Prefix and dual caches: every `refresh_every`-th step of a block (its first included)
    /// recomputes every row and rewrites the whole cache, as at a refreshing block start; the
    /// steps between reuse it (dLLM-Cache's interval refresh). 0 = off. The block-start refresh
    /// leaves the cached rows stale while the block fills; this bounds their staleness to
    /// `refresh_every − 1` steps at one full pass per `refresh_every` steps.
    pub refresh_every: usize,
    /// Confidence-threshold parallel commit: every masked position of the block whose
    /// confidence reaches it commits (at least one per step); `steps` is then only a cap.
    pub threshold: Option<f32>,
    /// Multi-block speculative decoding (sliding window + adaptive lookahead; dual cache only).
    pub multi_block: Option<MultiBlock>,
    /// Dual-path progressive revision on the sparse lane (dual cache only).
    pub revision: Option<Revision>,
    /// Classifier-free guidance scale (LLaDA: `un + (s + 1)(cond − un)`, the unconditional pass
    /// masks the prompt); 0 = off. Vanilla only (it doubles every pass).
    pub cfg_scale: f32,
    /// Dream's `alg_temp`: with a schedule (no threshold), the positions that commit are drawn
    /// without replacement from `softmax(confidence / alg_temp)` over the masked positions
    /// instead of taken by top confidence ([`super::sample_transfer`]); 0 = top-k (Dream's `None`).
    pub alg_temp: f32,
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
            refresh_prefix: false,
            refresh_every: 0,
            threshold: None,
            multi_block: None,
            revision: None,
            cfg_scale: 0.0,
            alg_temp: 0.0,
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
            refresh_prefix: false,
            refresh_every: 0,
            threshold: None,
            multi_block: None,
            revision: None,
            cfg_scale: 0.0,
            alg_temp: 0.0,
        }
    }
    /// Check the options against each other; the message is meant for the user.
    pub fn validate(&self) -> Result<(), DecodeError> {
        self.check().map_err(DecodeError::Invalid)
    }

    fn check(&self) -> Result<(), String> {
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
        if (self.multi_block.is_some() || self.revision.is_some()) && self.cache != CacheMode::Dual
        {
            return Err("multi-block decoding and revision need the dual cache".into());
        }
        if let Some(mb) = &self.multi_block {
            if !WINDOW_SHAPES.contains(&mb.window) || mb.lookahead == 0 {
                return Err(format!(
                    "window must be one of {WINDOW_SHAPES:?} and lookahead ≥ 1 (got {} / {})",
                    mb.window, mb.lookahead
                ));
            }
        }
        if let Some(r) = &self.revision {
            let ok = |t: f32| t > 0.0 && t <= 1.0;
            if !ok(r.revise_threshold)
                || !ok(r.stable_threshold)
                || !r.stable_on_commit.is_none_or(ok)
                || r.max_probes == 0
            {
                return Err("revision thresholds must be in (0, 1] and max_probes ≥ 1".into());
            }
        }
        if !(self.alg_temp.is_finite() && self.alg_temp >= 0.0) {
            return Err(format!("alg_temp must be ≥ 0, got {}", self.alg_temp));
        }
        if self.alg_temp > 0.0 && self.threshold.is_some() {
            return Err("alg_temp samples which positions a schedule commits; a confidence threshold decides that itself (use one or the other)".into());
        }
        if self.cfg_scale.is_nan() || self.cfg_scale < 0.0 {
            return Err(format!("cfg scale must be ≥ 0, got {}", self.cfg_scale));
        }
        if self.refresh_every > 0 && self.cache == CacheMode::None {
            return Err("refresh_every refreshes a cache; the vanilla strategy keeps none".into());
        }
        if self.cfg_scale > 0.0 && self.cache != CacheMode::None {
            return Err(
                "classifier-free guidance is only supported by the vanilla strategy".into(),
            );
        }
        Ok(())
    }
}
