//! Decoders. Every decoder drives [`llada_model::Model::forward`]; token selection lives in
//! [`sampling`] only.
//!
//! * [`sampling`]: greedy, temperature, top-k, top-p with a seeded RNG;
//! * [`ar`]: autoregressive generation with streaming and stop conditions;
//! * [`diffusion`]: diffusion decoding (LLaDA / Dream): vanilla, prefix / dual cache,
//!   threshold commit, multi-block windows ([`window`]), progressive revision ([`revision`]);
//! * [`strategy`]: the named diffusion strategies (`--strategy`) and their lanes;
//! * [`speculative`]: draft trees verified in one target pass, lossless acceptance.
pub mod ar;
pub mod diffusion;
pub mod error;
pub mod revision;
pub mod sampling;
pub mod speculative;
pub mod strategy;
pub mod window;

pub use ar::{generate, generate_in, GenerateConfig, GenerateOutput, StopReason};
pub use error::DecodeError;
pub use sampling::{Sampler, SamplingParams};
