//! Fitting the early-exit self-drafter's head (`--draft self`): the target's first layers on
//! training windows, a ridge-regression adapter onto its final hidden state, then the head's
//! top-1 agreement with the full target on held-out prose (`llada train-self-draft`).

use crate::corpora::prose_files;
use crate::error::{Context, Result};
use crate::progress::Progress;
use llada_decode::speculative::drafter::Drafter;
use llada_decode::speculative::selfdraft::{fit_head, SelfDrafter, SelfHead};
use llada_model::Model;
use llada_runtime::Lane;

/// What to fit: a head over the target's first `layers` layers proposing its `vocab` most
/// frequent ids, on `windows` training windows of 128 tokens, with ridge strength `lambda`.
#[derive(Clone, Copy, Debug)]
pub struct SelfDraftRequest {
    pub layers: usize,
    pub vocab: usize,
    pub windows: usize,
    pub lambda: f64,
}

/// The fitted head (already written) and its held-out agreement.
pub struct SelfDraft {
    /// Held-out positions where the head's first proposal is the target's argmax, of `total`.
    pub agree: usize,
    pub total: usize,
}

/// Fit the head on `lane`, write it with `save` (before the agreement is measured: a long fit
/// is kept whatever follows) and measure its held-out agreement. `progress` counts windows.
pub fn fit(
    target: &Model,
    lane: &Lane,
    a: &SelfDraftRequest,
    save: impl FnOnce(&SelfHead) -> Result<()>,
    progress: &dyn Progress,
) -> Result<SelfDraft> {
    let tok = target
        .tokenizer
        .as_ref()
        .context("the target has no tokenizer")?;
    let files = prose_files()?;
    let corpus =
        llada_train::prose::Corpus::load(&files, &tok.inner, target.config.eos_id.unwrap_or(0))?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(5);
    let windows = corpus.windows(false, a.windows, 128, &mut rng);
    progress.set_len(windows.len() as u64);
    let head = fit_head(target, lane, &windows, a.layers, a.vocab, a.lambda, |i| {
        progress.set_pos(i as u64)
    })?;
    progress.finish();
    save(&head)?;
    // Held-out agreement: the head's argmax vs the target's, on held-out windows.
    let held = corpus.windows(true, 8, 128, &mut rng);
    let mut d = SelfDrafter::new(target, lane, head, 0.0)?;
    let (mut agree, mut total) = (0usize, 0usize);
    for w in &held {
        let pos: Vec<u32> = (0..w.len() as u32).collect();
        let out = lane.run(|| {
            target.forward(
                &llada_model::ForwardRequest {
                    tokens: w,
                    positions: &pos,
                    mask: llada_model::AttnMask::Causal,
                    kv_write: llada_model::KvWrite::None,
                    logits: llada_model::LogitRows::All,
                },
                &mut target.new_cache(),
            )
        })?;
        for i in (8..w.len()).step_by(4) {
            let want = llada_decode::sampling::argmax(out.row(i - 1));
            let p = d.propose(
                &w[..i],
                &llada_decode::speculative::tree::DraftTree::default(),
                None,
                1,
            )?;
            agree += usize::from(p.top.first().map(|t| t.0) == Some(want));
            total += 1;
        }
    }
    Ok(SelfDraft { agree, total })
}
