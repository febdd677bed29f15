//! Benchmarks' measurements: left-to-right speed ([`ar`]), the diffusion strategies and the
//! window sweep ([`diffusion`]) with their accuracy on the whole eval split
//! ([`split_accuracy`]), speculative decoding under weight budgets ([`spec`]). Each
//! returns what it measured; reports, tables and plots are the front-end's.

pub mod ar;
pub mod diffusion;
pub mod peer;
pub mod peer_spec;
pub mod prompts;
pub mod spec;
pub mod split_accuracy;
