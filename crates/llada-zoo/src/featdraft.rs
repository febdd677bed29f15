//! Training the feature drafter's head (`--draft feature`): the target's final features over
//! training windows (recorded once, cached), the head's vocabulary (the target's most frequent
//! choices and tokens there), llada-train's fit, and the head's top-1 agreement with the target
//! on held-out prose (`llada train-feature-draft`).

use crate::corpora::prose_files;
use crate::distill::{feature_windows, record_features};
use crate::error::{bail, Context, Result};
use crate::progress::Progress;
use llada::draft::{draft_quant, DraftSource, DRAFT_QUANT};
use llada_decode::speculative::drafter::Drafter;
use llada_decode::speculative::featdraft::{embed, FeatureDrafter, FeatureHead, FeatureModel};
use llada_model::Model;
use llada_runtime::Lane;

/// What to train (the options of `llada train-feature-draft`; their help is the reference).
#[derive(Clone, Debug)]
pub struct FeatureDraftRequest {
    /// The target's name (its feature caches are named after it).
    pub target: String,
    pub windows: usize,
    /// `corpus`, `generated` or `mixed`.
    pub source: String,
    pub held_out: usize,
    pub vocab: usize,
    pub hidden: usize,
    pub epochs: f64,
    pub batch: usize,
    pub lr: f64,
    pub feature_weight: f64,
    pub unroll: usize,
    pub seed: u64,
}

impl FeatureDraftRequest {
    /// The sizes and rates no run can use, refused before any work.
    pub fn check(&self) -> Result<()> {
        if self.windows == 0
            || self.vocab == 0
            || self.hidden == 0
            || self.batch == 0
            || self.epochs.is_nan()
            || self.epochs <= 0.0
        {
            bail!("--windows, --vocab, --hidden, --batch and --epochs must be positive");
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            bail!(
                "--lr {}: the learning rate must be a positive number",
                self.lr
            );
        }
        if self.held_out == 0 {
            bail!("--held-out must be at least 1 (the agreement is measured on them)");
        }
        if !(self.feature_weight.is_finite() && self.feature_weight >= 0.0) {
            bail!(
                "--feature-weight {}: must be a number ≥ 0",
                self.feature_weight
            );
        }
        Ok(())
    }
}

/// A trained feature head (already written) and its held-out figures.
pub struct FeatureDraft {
    /// Recorded training positions.
    pub examples: usize,
    /// Cross-entropy of the first step on the held-out windows.
    pub held_ce: f32,
    /// Held-out positions where the head's first proposal is the target's argmax (and the
    /// comparison drafter's, when there is one), of `total`.
    pub agree: usize,
    pub agree_other: usize,
    pub total: usize,
}

/// Train the head on `lane`, write it with `save` (before the agreement is measured) and
/// measure its held-out agreement, and `compare`'s on the same positions.
pub fn train(
    target: &Model,
    lane: &Lane,
    a: &FeatureDraftRequest,
    compare: Option<&DraftSource>,
    save: impl FnOnce(&FeatureHead) -> Result<()>,
    progress: &dyn Progress,
) -> Result<FeatureDraft> {
    if !(1..64).contains(&a.unroll) {
        bail!("--unroll must be between 1 and 63");
    }
    let tok = target
        .tokenizer
        .as_ref()
        .context("the target has no tokenizer")?;
    let files = prose_files()?;
    let corpus =
        llada_train::prose::Corpus::load(&files, &tok.inner, target.config.eos_id.unwrap_or(0))?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    let windows = feature_windows(
        &a.target,
        &corpus.train,
        a.windows,
        128,
        &a.source,
        progress,
    )?;
    let held = corpus.windows(true, a.held_out, 128, &mut rng);
    let d = target.config.d_model;
    let (feats, best) = record_features(
        &a.target,
        &windows,
        "recording the target's features",
        progress,
    )?;
    // The head's ids: the most frequent target choices and input tokens of the windows.
    let vocab = target.config.vocab;
    let mut count = vec![0u64; vocab];
    for &t in windows.iter().flatten().chain(&best) {
        if let Some(c) = count.get_mut(t as usize) {
            *c += 1;
        }
    }
    let mut ids: Vec<u32> = (0..vocab as u32).collect();
    ids.sort_by_key(|&t| (std::cmp::Reverse(count[t as usize]), t));
    ids.truncate(a.vocab.min(vocab));
    let mut index = vec![u32::MAX; vocab];
    for (i, &t) in ids.iter().enumerate() {
        index[t as usize] = i as u32;
    }
    let mut rows = vec![0f32; ids.len() * d];
    for (r, &t) in rows.chunks_exact_mut(d).zip(&ids) {
        embed(target, t, r)?;
    }
    // Every position: its feature, its token's embedding row, the target's choice there.
    // The target's embedding row of every window token.
    let embed_all = |ws: &[Vec<u32>]| -> Result<Vec<f32>> {
        let mut out = vec![0f32; ws.iter().map(Vec::len).sum::<usize>() * d];
        for (e, &t) in out.chunks_exact_mut(d).zip(ws.iter().flatten()) {
            embed(target, t, e)?;
        }
        Ok(out)
    };
    let embeds = embed_all(&windows)?;
    let data = llada_train::featdraft::FeatureData {
        d,
        window: 128,
        feats,
        embeds,
        labels: best.iter().map(|&y| index[y as usize]).collect(),
    };
    let opts = llada_train::featdraft::FitOptions {
        hidden: a.hidden,
        epochs: a.epochs,
        batch: a.batch,
        lr: a.lr,
        feature_weight: a.feature_weight,
        unroll: a.unroll,
        seed: a.seed,
    };
    let examples = data.len();
    let fitted = lane.run(|| {
        llada_train::featdraft::fit(&data, &rows, &opts, |s, n, ce| {
            progress.set_len(n as u64);
            progress.set_pos(s as u64);
            progress.status(&format!("training the feature head, cross-entropy {ce:.3}"));
            // A log line now and then too (the bar is hidden when stderr is not a terminal).
            if s % 500 == 1 || s == n {
                progress.note(&format!("step {s}/{n}: cross-entropy {ce:.3}"));
            }
        })
    })?;
    progress.finish();
    drop(data);
    // Cross-entropy of the first step on the held-out windows (train: the last batches').
    let (hfeats, hbest) = record_features(&a.target, &held, "held-out features", progress)?;
    let hembeds = embed_all(&held)?;
    let held_data = llada_train::featdraft::FeatureData {
        d,
        window: 128,
        feats: hfeats,
        embeds: hembeds,
        labels: hbest.iter().map(|&y| index[y as usize]).collect(),
    };
    let held_ce = llada_train::featdraft::mean_ce(&fitted, &held_data, &rows)?;
    let hfeats = held_data.feats;
    let head = FeatureHead {
        d,
        hidden: fitted.hidden,
        w1: fitted.w1,
        b1: fitted.b1,
        w2: fitted.w2,
        b2: fitted.b2,
        ids,
    };
    save(&head)?;
    // Held-out agreement: the drafter's first proposal after each held-out position, given
    // the target's feature one position back (what it gets after a verification), against
    // the target's argmax.
    let fm = FeatureModel::new(target, head, draft_quant(DRAFT_QUANT)?)?;
    let mut fd = FeatureDrafter::new(target, &fm, 0.0);
    let mut od = match compare {
        Some(src) => Some(src.drafter(target, lane, 0.0)?),
        None => None,
    };
    let empty = llada_decode::speculative::tree::DraftTree::default();
    let (mut agree, mut agree_other, mut total) = (0usize, 0usize, 0usize);
    let mut off = 0;
    for w in &held {
        for t in 0..w.len().saturating_sub(1) {
            let want = hbest[off + t + 1];
            fd.observe_feature(&hfeats[(off + t) * d..(off + t + 1) * d]);
            let p = fd.propose(&w[..t + 2], &empty, None, 1)?;
            agree += usize::from(p.top.first().map(|x| x.0) == Some(want));
            if let Some(o) = od.as_mut() {
                let p = o.propose(&w[..t + 2], &empty, None, 1)?;
                agree_other += usize::from(p.top.first().map(|x| x.0) == Some(want));
            }
            total += 1;
        }
        off += w.len();
    }
    Ok(FeatureDraft {
        examples,
        held_ce,
        agree,
        agree_other,
        total,
    })
}
