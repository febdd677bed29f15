//! The loaded model: its config, weights, tokenizer and (under a memory budget) the streaming
//! state of the weights that stay in the file.
//!
//! Invariants: `weights.layers[i]` is `None` exactly for the layers the store streams, and
//! `weights.lm_head` is `None` exactly when the head is streamed; `store` is `None` when every
//! weight is resident. Loading is [`crate::load`]; the forward pass is [`crate::forward`].

use crate::config::ModelConfig;
use crate::store::WeightStore;
use crate::weights::Weights;
use llada_formats::tokenizer::Tokenizer;
use llada_runtime::KvCache;
use std::path::PathBuf;

/// Where the model came from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelFormat {
    Gguf,
    HfDir,
}

/// A loaded model: config, weights and (usually) its tokenizer.
pub struct Model {
    pub config: ModelConfig,
    pub weights: Weights,
    pub tokenizer: Option<Tokenizer>,
    pub path: PathBuf,
    pub format: ModelFormat,
    /// (type name, tensor count, bytes) over all stored tensors.
    pub tensor_types: Vec<(String, usize, u64)>,
    /// Streaming state when a memory budget keeps some weights in the file.
    pub store: Option<WeightStore>,
}

impl Model {
    /// Bytes of weights one decoding step reads (all layers + LM head), resident or streamed.
    pub fn bytes_per_token(&self) -> u64 {
        match &self.store {
            Some(st) => st.plan.total_bytes() + (self.weights.final_norm.len() * 4) as u64,
            None => {
                self.weights
                    .layers
                    .iter()
                    .flatten()
                    .map(|l| l.weight_bytes() as u64)
                    .sum::<u64>()
                    + self
                        .weights
                        .lm_head
                        .as_ref()
                        .map_or(0, |h| h.weight_bytes() as u64)
                    + (self.weights.final_norm.len() * 4) as u64
            }
        }
    }

    /// The ids that end generation: the tokenizer's EOS / end-of-turn and the config's EOS.
    pub fn stop_ids(&self) -> Vec<u32> {
        self.tokenizer
            .as_ref()
            .map(|t| t.stop_ids.clone())
            .unwrap_or_default()
            .into_iter()
            .chain(self.config.eos_id)
            .collect()
    }

    /// A KV cache sized for this model's context.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(
            self.config.n_layers,
            self.config.kv_dim(),
            self.config.max_ctx,
        )
    }
}
