//! Model architectures and the forward pass.
//!
//! * [`config`]: hyper-parameters of the four supported architectures, read from GGUF metadata
//!   or an HF `config.json` with the real field names;
//! * [`weights`]: tensors mapped into [`weights::Linear`] layers (our quantized kernel, or
//!   candle for dense weights), with llama.cpp's q/k row permutation undone at load;
//! * [`load`]: a [`Model`] from a GGUF file or an HF directory, tensor names per layout in
//!   `tensor_names`, layers built by `layer_builder`;
//! * [`store`]: the memory budget — which weights stay resident, streaming the rest;
//! * [`forward`]: the one forward entry point every decoder uses ([`Model::forward`]).
pub mod config;
mod export;
pub mod forward;
mod layer_builder;
pub mod load;
mod model;
pub mod store;
mod stream;
mod tensor_names;
pub mod weights;

pub use config::{Arch, ModelConfig};
pub use forward::{
    AttnMask, EarlyExit, ForwardOutput, ForwardRequest, KvWrite, LogitRows, SeqPass,
};
pub use load::{LoadOptions, Model};
pub use tensor_names::hf_to_gguf_names;

/// Errors from loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] llada_formats::FormatError),
    #[error(transparent)]
    Kv(#[from] llada_runtime::KvError),
    #[error("token id {id} is outside the vocabulary ({vocab} tokens)")]
    BadToken { id: u32, vocab: usize },
    #[error("position {pos} is beyond the model's context length {ctx}: the prompt plus generation is too long")]
    ContextOverflow { pos: u32, ctx: usize },
    #[error("invalid forward request: {0}")]
    BadRequest(String),
    /// The message carries the backend's error whole; it is not also the error's `source`,
    /// which `{:#}` (anyhow's chain) would print a second time.
    #[error("compute backend: {0}")]
    Backend(candle_core::Error),
    #[error("{0}")]
    Other(String),
}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        Self::Backend(e)
    }
}
