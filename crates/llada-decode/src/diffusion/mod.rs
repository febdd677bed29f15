//! Diffusion decoding (LLaDA / Dream).
//!
//! The vanilla reference, as LLaDA's `generate`: the answer starts as `gen_length` mask tokens;
//! blocks of `block_length` are finished left to right; each block gets `steps / n_blocks`
//! steps; at every step the whole sequence is recomputed (bidirectional, no cache), every
//! masked position of the current block is predicted, and the `k` most confident predictions
//! are committed, `k` following LLaDA's schedule (`masked // steps`, remainder to the first
//! steps). Confidence is the softmax probability of the chosen token (`low_confidence`) or
//! uniform noise (`random`); positions beyond the current block get −∞.
//!
//! Dream's shifted logits are handled here, once: position `i` reads the output row `i − 1`.
//!
//! Every strategy is an option of one loop, [`generate_with`]; its steps live beside it:
//! `config` (the options and their checks), `canvas` (the tokens and each answer position's
//! state), `step` (block setup, the rows a dense pass computes, the commits that end a step),
//! `passes` (the dense pass, the sparse lane's probe pass, the revision merge) and `commit`
//! (token choice, the schedules, which predictions commit).

mod canvas;
mod commit;
mod config;
mod passes;
mod step;

pub use self::commit::{dream_transfer, sample_transfer, transfer_schedule};
pub use self::config::{CacheMode, Confidence, DiffusionConfig, Schedule};
use self::step::Decoder;
pub use crate::revision::Revision;
pub use crate::window::{MultiBlock, TokenState};
use llada_model::{Model, ModelError};
use llada_runtime::Lane;
use serde::Serialize;
use std::time::Instant;

/// Result of a diffusion generation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DiffusionOutput {
    /// The `gen_length` answer tokens.
    pub tokens: Vec<u32>,
    /// Dense-lane forward passes.
    pub forward_passes: usize,
    /// Rows computed over all dense passes (the dense lane's work).
    pub rows_computed: usize,
    /// Rows a static-shape accelerator would add to reach the window shapes.
    pub padded_rows: usize,
    /// Sparse-lane passes and rows.
    pub sparse_passes: usize,
    pub sparse_rows: usize,
    /// Token identities changed by revision.
    pub revised: usize,
    /// Time in dense / sparse passes, and the time both ran at once.
    pub dense_s: f64,
    pub sparse_s: f64,
    pub overlap_s: f64,
    pub total_s: f64,
}

/// What an observer (e.g. `--visual`) sees after every step.
pub struct StepView<'a> {
    pub tokens: &'a [u32],
    pub states: &'a [TokenState],
    /// Positions whose token was changed by revision at least once.
    pub revised: &'a [bool],
    pub mask_id: u32,
}

/// The diffusion decoder on one lane (revision, if enabled and concurrent, is joined onto
/// that lane's threads).
pub fn generate(
    model: &Model,
    lane: &Lane,
    prompt: &[u32],
    cfg: &DiffusionConfig,
) -> Result<DiffusionOutput, ModelError> {
    generate_with(model, lane, None, prompt, cfg, None)
}

/// The diffusion decoder: every strategy is an option of this one loop. With
/// `Revision::concurrent`, the revision pass runs at the same time as the dense pass: on
/// `sparse`, a pool of its own, or (`None`) on the dense lane's threads through a
/// work-stealing join ([`Lane::join`]; no oversubscription where the cores are few); without
/// it, after the dense pass. `observe` is called after every step.
pub fn generate_with(
    model: &Model,
    dense: &Lane,
    sparse: Option<&Lane>,
    prompt: &[u32],
    cfg: &DiffusionConfig,
    mut observe: Option<&mut dyn FnMut(&StepView)>,
) -> Result<DiffusionOutput, ModelError> {
    let mask = check_request(model, prompt, cfg)?;
    let t0 = Instant::now();
    let dual = cfg.cache == CacheMode::Dual;
    let mut dec = Decoder::new(model, cfg, prompt, mask);
    while let Some(win) = dec
        .canvas
        .window(cfg.block_length, cfg.multi_block.as_ref())
    {
        let step = dec.plan_step(&win);
        let ((dense_out, da, db), sparse_out) = dec.forward(&step, dense, sparse)?;
        // Rows written with their real token have clean KV now.
        dec.canvas
            .mark_clean(step.dense.row0, &step.dense.slots, dual);
        dec.merge_revision(&step, (da, db), sparse_out)?;
        dec.sync_shadow(&step.dense)?;
        dec.commit(&step, &dense_out);
        if let Some(f) = observe.as_mut() {
            dec.canvas.show(*f);
        }
        dec.step += 1;
    }
    dec.canvas.finish();
    if let Some(f) = observe.as_mut() {
        dec.canvas.show(*f);
    }
    Ok(dec.finish(t0))
}

/// The request's checks; returns the model's mask token.
fn check_request(model: &Model, prompt: &[u32], cfg: &DiffusionConfig) -> Result<u32, ModelError> {
    cfg.validate()?;
    let mask = model.config.mask_id.ok_or_else(|| {
        ModelError::BadRequest("this model has no mask token: not a diffusion LM".into())
    })?;
    if prompt.is_empty() {
        return Err(ModelError::BadRequest("the prompt is empty".into()));
    }
    let n = prompt.len() + cfg.gen_length;
    if n > model.config.max_ctx {
        return Err(ModelError::ContextOverflow {
            pos: n as u32,
            ctx: model.config.max_ctx,
        });
    }
    Ok(mask)
}

/// The vanilla reference (no cache, no threshold), kept as a named entry point.
pub fn generate_vanilla(
    model: &Model,
    lane: &Lane,
    prompt: &[u32],
    cfg: &DiffusionConfig,
) -> Result<DiffusionOutput, ModelError> {
    let cfg = DiffusionConfig {
        cache: CacheMode::None,
        threshold: None,
        refresh_every: 0,
        ..cfg.clone()
    };
    generate(model, lane, prompt, &cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sparse lane's shadow cache stays equal to the live cache at every step end (the
    /// loop asserts it under `cfg(test)`), on both formats, with the sparse pass on its own
    /// pool, joined onto the dense lane, and sequential.
    #[test]
    fn shadow_cache_tracks_the_live_cache() {
        use crate::revision::Revision;
        use crate::window::MultiBlock;
        use llada_model::LoadOptions;
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        if !dir.join("expected.json").exists() {
            panic!(
                "fixtures missing: run `python3 tests/reference/make_fixtures.py tests/fixtures`"
            );
        }
        let (dense, sparse) = (
            Lane::new("dense", 2).unwrap(),
            Lane::new("sparse", 1).unwrap(),
        );
        for name in ["hf-llada", "hf-dream"] {
            let opts = LoadOptions {
                no_tokenizer: true,
                ..Default::default()
            };
            let model = Model::load(&dir.join(name), &opts).unwrap();
            // Refreshing steps (every step, 2nd, 3rd) rewrite rows the probes also compute:
            // the shadow must still track the cache, and the probes must still run.
            for refresh_every in [0, 1, 2, 3] {
                let mut outs = vec![];
                for (concurrent, pool) in [(true, true), (true, false), (false, false)] {
                    let cfg = DiffusionConfig {
                        cache: CacheMode::Dual,
                        refresh_every,
                        threshold: Some(0.05),
                        multi_block: Some(MultiBlock {
                            window: 16,
                            lookahead: 6,
                        }),
                        revision: Some(Revision {
                            revise_threshold: 0.05,
                            stable_threshold: 0.5,
                            max_probes: 3,
                            stable_on_commit: None,
                            concurrent,
                            ..Revision::default()
                        }),
                        ..DiffusionConfig::one_per_step(32, 8)
                    };
                    let sl = pool.then_some(&sparse);
                    let o = generate_with(&model, &dense, sl, &[5, 17, 33, 8, 2, 61], &cfg, None);
                    let o = o.unwrap();
                    assert!(
                        o.sparse_passes > 1,
                        "{name} every {refresh_every}: the sparse lane must run"
                    );
                    outs.push(o.tokens);
                }
                assert!(outs.windows(2).all(|w| w[0] == w[1]), "{name}");
            }
        }
    }
}
