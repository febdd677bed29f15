//! Sampling as users ask for it: each parameter given or not, the rest filled with the
//! defaults of llama.cpp's and ollama's tools, so that a model behaves here (CLI, server,
//! library) as users know it there.
//!
//! Invariant: temperature 0 is exact greedy decoding — no penalty unless one is asked for, seed
//! 0 — so greedy output is reproducible and equal across front-ends.

use crate::error::{Error, Result};
use llada_decode::SamplingParams;

/// The defaults (llama.cpp's).
pub mod defaults {
    pub const TEMPERATURE: f32 = 0.8;
    pub const TOP_K: usize = 40;
    pub const TOP_P: f32 = 0.95;
    pub const MIN_P: f32 = 0.05;
    pub const REPEAT_PENALTY: f32 = 1.1;
    pub const REPEAT_LAST_N: usize = 64;
}

/// Sampling parameters as asked for (`None`: the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct SamplingChoice {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<usize>,
    pub seed: Option<u64>,
}

impl SamplingChoice {
    /// The parameters with defaults filled in (greedy when `greedy_default` and no temperature
    /// is given; a random seed when sampling without one), checked.
    pub fn resolve(&self, greedy_default: bool) -> Result<SamplingParams> {
        use defaults as d;
        let default_t = if greedy_default { 0.0 } else { d::TEMPERATURE };
        let temperature = self.temperature.unwrap_or(default_t);
        let greedy = temperature <= 0.0;
        let p = SamplingParams {
            temperature,
            top_k: self.top_k.unwrap_or(d::TOP_K),
            top_p: self.top_p.unwrap_or(d::TOP_P),
            min_p: self.min_p.unwrap_or(d::MIN_P),
            // Greedy decoding is exact argmax unless a penalty is asked for.
            repeat_penalty: self.repeat_penalty.unwrap_or(if greedy {
                1.0
            } else {
                d::REPEAT_PENALTY
            }),
            repeat_last_n: self.repeat_last_n.unwrap_or(d::REPEAT_LAST_N),
            seed: self.seed.unwrap_or_else(|| {
                if greedy {
                    0
                } else {
                    u64::from(rand::random::<u32>())
                }
            }),
        };
        p.validate().map_err(|e| Error::Invalid(e.to_string()))?;
        Ok(p)
    }
}
