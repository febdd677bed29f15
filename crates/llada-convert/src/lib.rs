//! Model conversion: Hugging Face checkpoints to GGUF (`llada convert`) and GGUF to another
//! GGUF file type (`llada quantize`), in llama.cpp's exact layout so llama.cpp and every GGUF
//! tool read what we write.
//!
//! * [`recipe`]: the file types (`f16`, `q8_0`, `q4_k_m`, …) and llama.cpp's rules for which
//!   tensor gets which GGML type;
//! * [`hf`]: an HF directory's tensors under llama.cpp's names (q/k rows permuted for `llama`
//!   and `llada`), its metadata and tokenizer ([`vocab`]);
//! * [`requant`]: a GGUF's tensors retyped, its metadata kept;
//! * [`plan`]: the resulting [`Plan`], printed by `--dry-run` or written by [`Plan::write`].
//!
//! Invariants: a plan is fully validated before a byte is written (names, shapes, types);
//! writing streams one tensor at a time from the memory-mapped source, a bounded chunk of rows
//! at a time, and the output appears under its name only once complete.

pub mod hf;
pub mod plan;
pub mod recipe;
pub mod requant;
pub mod vocab;

pub use hf::plan_convert;
pub use plan::{OutTensor, Plan};
pub use recipe::Target;
pub use requant::plan_quantize;

use std::path::PathBuf;

/// What can go wrong converting a model; messages name the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// Reading or writing a file.
    #[error(transparent)]
    Format(#[from] llada_formats::FormatError),
    /// A config the model loader refuses (unknown architecture, inconsistent shapes, …).
    #[error(transparent)]
    Model(#[from] llada_model::ModelError),
    /// Something valid that llama.cpp's layout cannot express or this converter does not know.
    #[error("{path}: cannot convert: {what}")]
    Unsupported { path: PathBuf, what: String },
}
