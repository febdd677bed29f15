//! # llada-zoo: the tiny model zoo and its tools, as a library
//!
//! What `llada train`, `eval`, `synth`, `bench` and the drafts' trainers do, without the
//! command line: each routine takes a request (plain options), reports its progress to a
//! [`Progress`] and returns what it made or measured.
//!
//! * [`presets`]: what `--preset NAME` builds; [`train`]: a [`train::TrainRequest`] run;
//! * [`distill`]: the target's labels of training windows and their binary caches;
//! * [`corpora`]: the prose corpora and their held-out windows;
//! * [`eval`]: task exact match, prose NLL, draft agreement — result structs;
//! * [`probe`], [`selfdraft`], [`featdraft`]: a draft's early-exit probe, the self-drafter's
//!   head, the feature drafter's head;
//! * [`bench`]: the benchmarks' measurement loops; [`synth`]: random models of real shapes;
//! * [`Error`]: the one error type.

pub mod bench;
pub mod corpora;
pub mod distill;
pub mod error;
pub mod eval;
pub mod featdraft;
pub mod forward;
pub mod presets;
pub mod probe;
pub mod progress;
pub mod selfdraft;
pub mod synth;
pub mod train;

pub use error::{Error, Result};
pub use progress::{Progress, Silent};

use llada_model::Model;

/// Commands that decode left to right (generate in AR or speculative mode, chat, `bench`,
/// `bench spec`, the train-* commands) refuse a diffusion model: `who` names it (its path, or
/// the option and path), `hint` says what to run instead.
pub fn left_to_right(model: &Model, who: &str, hint: &str) -> Result<()> {
    if model.config.arch.is_diffusion() {
        return Err(Error::Invalid(format!(
            "{who} is a diffusion model ({:?}): {hint}",
            model.config.arch
        )));
    }
    Ok(())
}
