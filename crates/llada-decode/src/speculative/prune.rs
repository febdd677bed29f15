//! Early-exit verification pruning: after a middle layer of the target, a small probe scores
//! every tree node; nodes scored below a conservative threshold (and their subtrees) leave the
//! verification batch before the remaining layers.
//!
//! Features of node `j` (token `t`, parent row `p`, hidden states `h` after the exit layer):
//! 1. the *logit lens* `⟨norm(h_p), E_t⟩` — the final RMSNorm then the token's embedding row, the
//!    parent's early opinion of `t` (exact for tied heads; `d` MACs, not `vocab · d`);
//! 2. the same minus the best lens score among `j`'s siblings (0 for the favourite);
//! 3. `ln q(t)`, the draft's probability;
//! 4. the depth.
//!
//! A logistic regression on standardised features, fitted by [`fit`] on calibration runs
//! (`llada train-probe`); the threshold is the score that keeps a target fraction (e.g. 99.5 %)
//! of the nodes that the target accepts. Lossless by construction: a pruned node is treated as
//! never drafted, so the target's own token at its parent is emitted instead (greedy, tree
//! sampling and chain rejection all stay exact); pruning can only shorten the accepted path.

use super::tree::DraftTree;
use crate::error::DecodeError;
use llada_model::{Model, ModelError};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Number of features per node.
pub const NF: usize = 4;

/// A fitted probe and how it did on calibration data.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExitProbe {
    /// Exit layer (0-based): features are read after this layer.
    pub layer: usize,
    pub mean: [f32; NF],
    pub std: [f32; NF],
    pub w: [f32; NF],
    pub b: f32,
    /// Nodes scoring below this leave the batch.
    pub threshold: f32,
    /// Recall asked for on the fitting split.
    pub target_recall: f64,
    /// Recall of accepted nodes and fraction of nodes pruned, on the held-out calibration split.
    pub heldout_recall: f64,
    pub heldout_pruned: f64,
    pub fit_samples: usize,
    pub heldout_samples: usize,
}

impl ExitProbe {
    /// The probe's logit for one node.
    pub fn score(&self, f: &[f32; NF]) -> f32 {
        self.b
            + (0..NF)
                .map(|i| self.w[i] * (f[i] - self.mean[i]) / self.std[i])
                .sum::<f32>()
    }

    /// Keep flags for the verification batch (row 0 the root, row `j + 1` node `j`): a node
    /// stays iff it scores at least the threshold and its parent stays.
    pub fn keep(&self, feats: &[[f32; NF]], tree: &DraftTree) -> Vec<bool> {
        let mut keep = vec![true; tree.len() + 1];
        for j in 0..tree.len() {
            let parent_kept = tree.parent[j].is_none_or(|p| keep[p + 1]);
            keep[j + 1] = parent_kept && self.score(&feats[j]) >= self.threshold;
        }
        keep
    }

    /// Load a probe written by [`Self::save`], checked.
    pub fn load(path: &Path) -> Result<Self, DecodeError> {
        Self::read(path).map_err(DecodeError::File)
    }

    fn read(path: &Path) -> Result<Self, String> {
        let s = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let p: Self =
            serde_json::from_str(&s).map_err(|e| format!("parsing {}: {e}", path.display()))?;
        if p.std.iter().any(|s| s.is_nan() || *s <= 0.0) || !p.threshold.is_finite() {
            return Err(format!("{}: invalid probe parameters", path.display()));
        }
        Ok(p)
    }

    /// Writes the probe atomically (`llada_formats::atomic`).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        llada_formats::atomic::write(path, json.as_bytes()).map_err(std::io::Error::other)
    }
}

/// Features of every node of `tree` from the hidden states after the exit layer (`hidden`:
/// `(tree.len() + 1) × d`, row 0 the root).
pub fn features(
    target: &Model,
    hidden: &[f32],
    tree: &DraftTree,
) -> Result<Vec<[f32; NF]>, ModelError> {
    let d = target.config.d_model;
    let row = |j: Option<usize>| j.map_or(0, |p| p + 1);
    // One lens call per parent (its row is normalised once for all its children).
    let mut lens = vec![0f32; tree.len()];
    let mut best = vec![f32::NEG_INFINITY; tree.len()];
    for parent in std::iter::once(None).chain((0..tree.len()).map(Some)) {
        let kids: Vec<usize> = tree.children(parent).collect();
        if kids.is_empty() {
            continue;
        }
        let r = row(parent);
        let toks: Vec<u32> = kids.iter().map(|&j| tree.tokens[j]).collect();
        let scores = target.lens_logits(&hidden[r * d..(r + 1) * d], &toks)?;
        let top = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for (&j, s) in kids.iter().zip(scores) {
            lens[j] = s;
            best[j] = top;
        }
    }
    Ok((0..tree.len())
        .map(|j| {
            [
                lens[j],
                lens[j] - best[j],
                tree.q[j].max(1e-12).ln(),
                tree.depth[j] as f32,
            ]
        })
        .collect())
}

/// Calibration samples: features and whether the target accepts the node given its parent
/// (greedy: the node's token is the target's argmax at the parent).
#[derive(Debug, Clone, Default)]
pub struct ProbeData {
    pub x: Vec<[f32; NF]>,
    pub y: Vec<bool>,
}

/// Fit a logistic probe on `fit` (L2-regularised, gradient descent on standardised features)
/// and pick the threshold keeping `target_recall` of its accepted nodes; report recall and
/// pruning on `heldout`.
pub fn fit(layer: usize, fit: &ProbeData, heldout: &ProbeData, target_recall: f64) -> ExitProbe {
    let n = fit.x.len().max(1) as f32;
    let mut mean = [0f32; NF];
    let mut std = [0f32; NF];
    for x in &fit.x {
        for (m, v) in mean.iter_mut().zip(x) {
            *m += v / n;
        }
    }
    for x in &fit.x {
        for ((s, v), m) in std.iter_mut().zip(x).zip(&mean) {
            *s += (v - m).powi(2) / n;
        }
    }
    for s in std.iter_mut() {
        *s = s.sqrt().max(1e-6);
    }
    let mut p = ExitProbe {
        layer,
        mean,
        std,
        w: [0.0; NF],
        b: 0.0,
        threshold: f32::NEG_INFINITY,
        target_recall,
        heldout_recall: 1.0,
        heldout_pruned: 0.0,
        fit_samples: fit.x.len(),
        heldout_samples: heldout.x.len(),
    };
    // Full-batch gradient descent (a convex problem of 5 unknowns: no library needed).
    let lr = 0.5f32;
    for _ in 0..2000 {
        let mut gw = [0f32; NF];
        let mut gb = 0f32;
        for (x, &y) in fit.x.iter().zip(&fit.y) {
            let z = p.score(x);
            let e = 1.0 / (1.0 + (-z).exp()) - if y { 1.0 } else { 0.0 };
            for (i, g) in gw.iter_mut().enumerate() {
                *g += e * (x[i] - mean[i]) / std[i] / n;
            }
            gb += e / n;
        }
        for (w, g) in p.w.iter_mut().zip(&gw) {
            *w -= lr * (g + 1e-3 * *w);
        }
        p.b -= lr * gb;
    }
    // Threshold: the (1 − recall) quantile of the accepted nodes' scores.
    let mut pos: Vec<f32> = fit
        .x
        .iter()
        .zip(&fit.y)
        .filter(|(_, &y)| y)
        .map(|(x, _)| p.score(x))
        .collect();
    pos.sort_by(f32::total_cmp);
    if !pos.is_empty() {
        let k = ((1.0 - target_recall) * pos.len() as f64).floor() as usize;
        // Strictly below the k-th lowest accepted score: at most k accepted nodes pruned.
        p.threshold = pos[k.min(pos.len() - 1)] - 1e-4;
    }
    let (r, pr) = evaluate(&p, heldout);
    p.heldout_recall = r;
    p.heldout_pruned = pr;
    p
}

/// (recall of accepted nodes, fraction of all nodes pruned) of `p` on `data`, scoring nodes
/// independently (subtree propagation only prunes more).
pub fn evaluate(p: &ExitProbe, data: &ProbeData) -> (f64, f64) {
    let (mut kept_pos, mut pos, mut pruned) = (0usize, 0usize, 0usize);
    for (x, &y) in data.x.iter().zip(&data.y) {
        let keep = p.score(x) >= p.threshold;
        if y {
            pos += 1;
            kept_pos += keep as usize;
        }
        pruned += !keep as usize;
    }
    (
        if pos == 0 {
            1.0
        } else {
            kept_pos as f64 / pos as f64
        },
        pruned as f64 / data.x.len().max(1) as f64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_separates_and_keeps_the_recall() {
        // Accepted nodes have high lens scores; a few overlap.
        let mut d = ProbeData::default();
        let mut h = ProbeData::default();
        for i in 0..4000 {
            let y = i % 3 == 0;
            let noise = ((i * 7919) % 1000) as f32 / 1000.0;
            let lens = if y { 2.0 + 2.0 * noise } else { 3.0 * noise };
            let x = [lens, 0.0, -noise, 1.0 + (i % 4) as f32];
            let dst = if i % 4 == 0 { &mut h } else { &mut d };
            dst.x.push(x);
            dst.y.push(y);
        }
        let p = fit(3, &d, &h, 0.99);
        let (r, pruned) = evaluate(&p, &d);
        assert!(r >= 0.99, "fit recall {r}");
        assert!(
            p.heldout_recall >= 0.97,
            "held-out recall {}",
            p.heldout_recall
        );
        // Most rejected nodes (two thirds of all) are prunable.
        assert!(pruned > 0.3, "pruned {pruned}");
        assert!(p.w[0] > 0.0);
    }

    #[test]
    fn keep_drops_whole_subtrees() {
        let mut t = DraftTree::default();
        let a = t.push(None, 5, 0.9, 1.0);
        let b = t.push(Some(a), 6, 0.9, 1.0);
        let _c = t.push(Some(b), 7, 0.9, 1.0);
        let _e = t.push(None, 8, 0.9, 1.0);
        let p = ExitProbe {
            layer: 0,
            mean: [0.0; NF],
            std: [1.0; NF],
            w: [1.0, 0.0, 0.0, 0.0],
            b: 0.0,
            threshold: 0.5,
            target_recall: 0.99,
            heldout_recall: 1.0,
            heldout_pruned: 0.0,
            fit_samples: 0,
            heldout_samples: 0,
        };
        // Node b scores low: b and its child c leave; a and e stay; the root always stays.
        let feats = vec![
            [1.0, 0.0, 0.0, 1.0],
            [0.0, 0.0, 0.0, 2.0],
            [9.0, 0.0, 0.0, 3.0],
            [1.0, 0.0, 0.0, 1.0],
        ];
        assert_eq!(p.keep(&feats, &t), vec![true, true, false, false, true]);
    }
}
