//! # llada: on-device LLM inference with parallel decoding
//!
//! Load a model by name, open a session, generate — autoregressive, speculative (a drafter's
//! token trees verified in one pass; the same output) or diffusion (LLaDA, Dream):
//!
//! ```no_run
//! use llada::{Engine, EngineOptions, GenerateOptions, Mode, Prompt};
//!
//! # fn main() -> llada::Result<()> {
//! let engine = Engine::load("smollm2", &EngineOptions::default())?; // fetched on first use
//! let mut session = engine.session();
//! let out = session.generate(
//!     &Prompt::Raw("The capital of France is"),
//!     &Mode::Ar,
//!     &GenerateOptions::default(), // greedy, 128 tokens
//! )?;
//! println!("{}", out.text);
//!
//! // A conversation: each turn prefills only what is new (the session keeps its KV cache).
//! let opts = GenerateOptions { max_tokens: 32, ..Default::default() };
//! session.chat("Name a sea.", &Mode::Ar, &opts, |_| true)?;
//! let second = session.chat("And another?", &Mode::Ar, &opts, |_| true)?;
//! assert!(second.cached_prompt_tokens > 0);
//! # Ok(())
//! # }
//! ```
//!
//! * [`Engine`]: a loaded model ([`models`] resolves aliases, shipped models and paths);
//! * [`Session`]: generation in every [`Mode`], streaming [`Event`]s, conversations;
//! * [`draft`]: drafters for [`Mode::Speculative`] by name (`ngram`, a draft model, `self`, …);
//! * [`Error`]: the one error type.
//!
//! `examples/embed.rs` runs all three modes.

pub mod draft;
pub mod engine;
pub mod error;
pub mod load;
pub mod models;
pub mod sampling;
pub mod session;

pub use draft::DraftSource;
pub use engine::{Engine, EngineOptions, Prompt};
pub use error::{Error, Result};
pub use sampling::SamplingChoice;
pub use session::{
    Ahasd, Diffusion, Event, GenerateOptions, Generation, Mode, Session, Speculative, Stats,
};

/// The pieces a front-end configures modes with.
pub use llada_decode::speculative::drafter::TreeShape;
pub use llada_decode::strategy::{Strategy, StrategyOptions};
pub use llada_decode::{SamplingParams, StopReason};
pub use llada_formats::tokenizer::Message;
