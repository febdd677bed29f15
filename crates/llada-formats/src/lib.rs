//! Model file formats: where weights, hyper-parameters and tokenizers come from.
//!
//! * [`gguf`]: a bounds-checked GGUF v3 reader over a memory map;
//! * [`hf`]: Hugging Face directories (`config.json`, sharded `*.safetensors`, `tokenizer.json`);
//! * [`tensor`]: the format-neutral view of a stored tensor that model loaders consume;
//! * [`atomic`]: atomic file writes (a temporary file renamed over the target on success);
//! * [`tokenizer`]: `tokenizer.json`, or the byte-level BPE embedded in GGUF metadata, as one
//!   `tokenizers::Tokenizer`; chat templates.
//!
//! Invariant: nothing here panics or reads out of bounds on hostile input; every error names the
//! file (and the tensor or key) it is about.
pub mod atomic;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod tensor;
pub mod tokenizer;

pub use error::FormatError;
pub use tensor::{TensorSource, TensorView};
