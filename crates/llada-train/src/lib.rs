//! Training tiny models the engine then runs through its normal loaders.
//!
//! * [`tasks`]: checkable synthetic `prompt → answer` tasks generated from a seed, with a fixed
//!   held-out split;
//! * [`vocab`]: the character-level vocabulary of the task models, written as `tokenizer.json`;
//! * [`model`]: a LLaMA-style transformer on candle's autograd whose parameters carry the real
//!   checkpoints' tensor names (LLaDA: `model.transformer.*`; Dream/Qwen2: `model.layers.*`);
//! * [`ops`]: fused attention softmax and weighted cross-entropy, each with its backward;
//! * [`objective`]: masked diffusion (LLaDA, with the 1/t weighting), its shifted Dream variant,
//!   and next-token prediction;
//! * [`prose`]: prose corpora (Austen, KJV) tokenized by a BPE trained with `tokenizers`, or by
//!   SmolLM2's tokenizer for the draft; random windows with a held-out tail;
//! * [`featdraft`]: the head of a drafter that reads the target's own features;
//! * [`trainer`]: AdamW loop with progress bar, seeded and resumable, saving HF directories.
pub mod featdraft;
pub mod model;
pub mod objective;
pub mod ops;
pub mod prose;
pub mod tasks;
pub mod trainer;
pub mod vocab;
