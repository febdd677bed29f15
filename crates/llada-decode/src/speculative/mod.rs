//! Speculative decoding: a drafter proposes a token tree, the target verifies the whole tree in
//! one forward pass with a tree attention mask, a lossless rule accepts a path plus one target
//! token, and the KV rows of rejected branches are rolled back.
//!
//! * [`tree`]: trees, their masks, calibration and Lever's cost model;
//! * [`drafter`]: the `Drafter` trait (draft model, n-gram) and tree growth (chain, top-k,
//!   cost-aware);
//! * [`featdraft`]: a drafter reading the target's own features;
//! * [`accept`]: the acceptance rules;
//! * [`ahasd`]: asynchronous draft/verify lanes with the EDC and TVC gates.

pub mod accept;
pub mod ahasd;
pub mod drafter;
pub mod featdraft;
pub mod gate;
pub mod prune;
pub mod selfdraft;
pub mod tree;

use crate::sampling::Sampler;
use crate::SamplingParams;
use accept::Accepted;
use drafter::{grow, Drafter, TreeShape};
use llada_model::{AttnMask, ForwardRequest, KvWrite, LogitRows, Model, ModelError};
use llada_runtime::Lane;
use serde::Serialize;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tree::{Calibration, CostModel};

/// Options of speculative generation.
#[derive(Debug, Clone)]
pub struct SpecConfig {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub shape: TreeShape,
    /// Stop after any of these ids (emitted, then generation ends).
    pub stop_ids: Vec<u32>,
    /// Early-exit verification pruning ([`prune`]).
    pub exit: Option<prune::ExitProbe>,
    /// Calibration: record every node's probe features after layer `.0` and its greedy label
    /// into `.1` (`llada train-probe`).
    pub probe_log: Option<(usize, Arc<Mutex<prune::ProbeData>>)>,
    /// Lever's cost model: `None` refits it from this run's measured verify passes (the trees
    /// follow the machine's speed, run to run); `Some` keeps it fixed, so the trees — and what
    /// is calibrated on them (`llada train-probe`) — are the same on every run.
    pub fixed_cost: Option<CostModel>,
}

/// Result and statistics of a speculative generation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpecOutput {
    pub tokens: Vec<u32>,
    /// Target forward passes (prefill excluded).
    pub verify_passes: usize,
    /// Draft tokens accepted over all passes.
    pub accepted: usize,
    /// Tree nodes verified over all passes.
    pub tree_nodes: usize,
    /// Early exit: tree nodes pruned, and layer-rows skipped out of all layer-rows verified
    /// (the compute saved).
    pub pruned_nodes: usize,
    pub layer_rows_saved: usize,
    pub layer_rows_total: usize,
    pub draft_s: f64,
    pub verify_s: f64,
    pub prefill_s: f64,
    pub total_s: f64,
    /// The cost model at the end of the run: the last refit from this run's measured passes,
    /// or [`SpecConfig::fixed_cost`] unchanged.
    pub cost: CostModel,
    /// AHASD with TVC: why TVC pre-verified nothing in this run, if it was gated off
    /// (`ahasd::tvc_gate`).
    pub tvc_gated: Option<String>,
    /// AHASD with TVC: drafts pre-verified on the draft lane.
    pub preverified: usize,
    /// Steps that verified the root alone because drafting did not pay ([`gate`]).
    pub declined_steps: usize,
}

impl SpecOutput {
    /// Mean draft tokens accepted per verification.
    pub fn mean_accepted(&self) -> f64 {
        self.accepted as f64 / self.verify_passes.max(1) as f64
    }
}

/// Generate with `drafter` against `target`. `sparse`: the lane the vocabulary-wide final
/// selection (acceptance) runs on; the dense lane runs the target.
pub fn generate(
    target: &Model,
    dense: &Lane,
    sparse: Option<&Lane>,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    cfg: &SpecConfig,
) -> Result<SpecOutput, ModelError> {
    generate_with(target, dense, sparse, drafter, prompt, cfg, &mut |_| true)
}

/// [`generate`], showing every step's emitted tokens to `on_step`, which returns `false` to
/// end the generation there (a stop string completed, a client gone).
pub fn generate_with(
    target: &Model,
    dense: &Lane,
    sparse: Option<&Lane>,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    cfg: &SpecConfig,
    on_step: &mut dyn FnMut(&[u32]) -> bool,
) -> Result<SpecOutput, ModelError> {
    cfg.sampling.validate()?;
    if prompt.is_empty() {
        return Err(ModelError::BadRequest("the prompt is empty".into()));
    }
    let t0 = Instant::now();
    let mut out = SpecOutput::default();
    let mut cache = target.new_cache();
    let mut ctx: Vec<u32> = prompt.to_vec();
    // Prefill all but the last prompt token: the last one is the root of every tree. A drafter
    // that reads the target's features gets the last prefill row's (the row that chose the
    // root).
    if drafter.wants_features() && ctx.len() > 1 {
        let f = prefill_feature(target, dense, &mut cache, &ctx[..ctx.len() - 1])?;
        drafter.observe_feature(&f);
    } else {
        append_context(target, dense, &mut cache, &ctx[..ctx.len() - 1])?;
    }
    out.prefill_s = t0.elapsed().as_secs_f64();
    let sampler = Sampler::new(cfg.sampling);
    let mut cal = Calibration::default();
    // Cost model of this run, refitted from measured verify passes (least squares on
    // (rows, seconds)), unless the config fixes it.
    let mut fit: Vec<(f64, f64)> = vec![];
    let mut cost = cfg.fixed_cost.unwrap_or(CostModel::START);
    let greedy = cfg.sampling.is_greedy();
    let chain_rejection = !greedy && matches!(cfg.shape, TreeShape::Chain { .. });
    let mut q_full: Vec<Vec<f32>> = vec![];
    let budget = cfg.max_tokens;
    // Lever's cost-aware tree adapts to measured costs, its draft's too, and declines drafting
    // that does not pay ([`gate`]); the fixed shapes are the baselines and always draft.
    let adaptive = cfg.fixed_cost.is_none() && matches!(cfg.shape, TreeShape::CostAware { .. });
    let mut gate = gate::DraftGate::default();
    while out.tokens.len() < budget {
        let base = ctx.len() - 1; // slot / position of the root
        if base + 1 >= target.config.max_ctx {
            break;
        }
        let td = Instant::now();
        let mut draft_sampler = chain_rejection.then(|| {
            Sampler::new(SamplingParams {
                seed: cfg.sampling.seed ^ (0x9e37 + out.verify_passes as u64),
                ..cfg.sampling
            })
        });
        let drafted = !adaptive || gate.should_draft();
        let mut tree = if drafted {
            grow(
                drafter,
                &ctx,
                &cfg.shape,
                &cal,
                &cost,
                draft_sampler.as_mut(),
                &mut q_full,
            )?
        } else {
            q_full.clear();
            tree::DraftTree::default()
        };
        if drafted && adaptive {
            // Seconds per proposal: the root's and one per node (smoothed).
            let per = td.elapsed().as_secs_f64() / (tree.len() + 1) as f64;
            cost.draft_s += 0.3 * (per - cost.draft_s);
        }
        // Never verify past the context or far past the token budget.
        let room = (target.config.max_ctx - base - 1).min(budget - out.tokens.len());
        while !tree.is_empty() && tree.depth.iter().any(|&d| d as usize > room) {
            let keep: Vec<usize> = (0..tree.len())
                .filter(|&i| tree.depth[i] as usize <= room)
                .collect();
            tree = tree.subtree(&keep);
        }
        out.draft_s += td.elapsed().as_secs_f64();

        // One verify pass: the root row and every tree node.
        let tv = Instant::now();
        let n = tree.len() + 1;
        let mut toks = vec![ctx[base]];
        toks.extend(&tree.tokens);
        let pos: Vec<u32> = std::iter::once(base as u32)
            .chain(tree.depth.iter().map(|&d| base as u32 + d))
            .collect();
        let mask = tree.attention_mask();
        let slots: Vec<Option<usize>> = (0..n).map(|r| Some(base + r)).collect();
        let req = ForwardRequest {
            tokens: &toks,
            positions: &pos,
            mask: AttnMask::Explicit(&mask),
            kv_write: KvWrite::Slots(&slots),
            logits: LogitRows::All,
        };
        let exit_layer = cfg
            .exit
            .as_ref()
            .map(|p| p.layer)
            .or(cfg.probe_log.as_ref().map(|l| l.0));
        let feats: Mutex<Option<Vec<[f32; prune::NF]>>> = Mutex::new(None);
        let keep_fn = |h: &[f32], _alive: &[usize]| -> Vec<bool> {
            // A feature failure (cannot happen for in-vocabulary trees) keeps every node.
            let Ok(f) = prune::features(target, h, &tree) else {
                return vec![true; n];
            };
            let keep = match &cfg.exit {
                Some(p) => p.keep(&f, &tree),
                None => vec![true; n],
            };
            if let Ok(mut g) = feats.lock() {
                *g = Some(f);
            }
            keep
        };
        let vout = dense.run(|| match exit_layer {
            Some(layer) if !tree.is_empty() => target.forward_with_exit(
                &req,
                &mut cache,
                Some(&llada_model::EarlyExit {
                    layer,
                    keep: &keep_fn,
                }),
            ),
            _ => target.forward(&req, &mut cache),
        })?;
        let verify_time = tv.elapsed().as_secs_f64();
        out.verify_s += verify_time;
        out.verify_passes += 1;
        out.tree_nodes += tree.len();
        fit.push((n as f64, verify_time));
        if fit.len() >= 4 && cfg.fixed_cost.is_none() {
            cost = refit(&fit, cost);
        }
        // Logits row of each batch row (None: pruned by early exit).
        let mut vrow: Vec<Option<usize>> = vec![None; n];
        for (i, &r) in vout.rows.iter().enumerate() {
            vrow[r] = Some(i);
        }
        let argmax_of = |r: usize| vrow[r].map(|i| crate::sampling::argmax(vout.row(i)));
        if let (Some((_, log)), Ok(Some(f))) = (&cfg.probe_log, feats.lock().map(|mut g| g.take()))
        {
            if let Ok(mut log) = log.lock() {
                for (j, fj) in f.into_iter().enumerate() {
                    if let Some(a) = argmax_of(tree.parent[j].map_or(0, |p| p + 1)) {
                        log.x.push(fj);
                        log.y.push(a == tree.tokens[j]);
                    }
                }
            }
        }
        // Pruned nodes are treated as never drafted: verify the kept subtree (`orig[j]`: the
        // original index of its node j).
        let orig: Vec<usize> = (0..tree.len()).filter(|&j| vrow[j + 1].is_some()).collect();
        if orig.len() < tree.len() {
            let pruned = tree.len() - orig.len();
            out.pruned_nodes += pruned;
            let layer = exit_layer.unwrap_or(0);
            out.layer_rows_saved += pruned * (target.config.n_layers - layer - 1);
            if chain_rejection {
                q_full.truncate(orig.len());
            }
            tree = tree.subtree(&orig);
        }
        out.layer_rows_total += n * target.config.n_layers;
        let vrow: Vec<usize> = std::iter::once(0)
            .chain(orig.iter().map(|&j| j + 1))
            .map(|r| vrow[r].unwrap_or(0))
            .collect();
        let row = |r: usize| vout.row(vrow[r]);
        // What the repetition penalty sees at row r: the context and the draft path to it.
        let window = if cfg.sampling.has_penalty() {
            cfg.sampling.repeat_last_n
        } else {
            0
        };
        let hist = |r: usize| tree.history(&ctx, r, window);

        // Final selection (vocabulary-wide) on the sparse lane.
        let select = || -> Accepted {
            if greedy {
                accept::greedy(&tree, |r| cfg.sampling.greedy_after(row(r), &hist(r)))
            } else if chain_rejection {
                let p = |r: usize| sampler.distribution_after(row(r), &hist(r));
                let mut s2 = Sampler::new(SamplingParams {
                    seed: cfg
                        .sampling
                        .seed
                        .wrapping_add(out.verify_passes as u64 * 7919),
                    ..cfg.sampling
                });
                accept::chain_rejection(&tree, p, |j| q_full[j].clone(), &mut s2)
            } else {
                let p = |r: usize| sampler.distribution_after(row(r), &hist(r));
                let mut s2 = Sampler::new(SamplingParams {
                    seed: cfg
                        .sampling
                        .seed
                        .wrapping_add(out.verify_passes as u64 * 7919),
                    ..cfg.sampling
                });
                accept::tree_sampling(&tree, p, &mut s2)
            }
        };
        // A one-row selection is not worth a thread hop (the dense pool's workers would
        // compete with the sparse thread for the cores).
        let acc = match sparse {
            Some(l) if tree.len() >= 4 => l.run(select),
            _ => select(),
        };

        // Calibration: every node whose parent was on the accepted path was tested.
        for j in 0..tree.len() {
            let tested = match tree.parent[j] {
                None => true,
                Some(p) => acc.path.contains(&p),
            };
            if tested {
                cal.observe(tree.q[j], acc.path.contains(&j));
            }
        }
        // The feature of the row that chose the bonus token (the next root).
        if drafter.wants_features() {
            let i = vrow[acc.path.last().map_or(0, |&j| j + 1)];
            let d = target.config.d_model;
            if let Some(f) = vout.features.get(i * d..(i + 1) * d) {
                drafter.observe_feature(f);
            }
        }
        // KV rollback: keep the root and the accepted path, compacted, drop the rest.
        for (k, &j) in acc.path.iter().enumerate() {
            cache.move_slot(base + 1 + orig[j], base + 1 + k);
        }
        cache.truncate(base + 1 + acc.path.len());
        out.accepted += acc.path.len();
        let emitted: Vec<u32> = acc
            .path
            .iter()
            .map(|&j| tree.tokens[j])
            .chain([acc.bonus])
            .collect();
        let mut stop = false;
        let emitted_n = emitted.len();
        let from = out.tokens.len();
        for t in emitted {
            if out.tokens.len() >= budget {
                stop = true;
                break;
            }
            out.tokens.push(t);
            ctx.push(t);
            if cfg.stop_ids.contains(&t) {
                stop = true;
                break;
            }
        }
        // The cache must hold exactly ctx[..len − 1].
        cache.truncate(ctx.len() - 1);
        stop |= !on_step(&out.tokens[from..]);
        if adaptive {
            let secs = td.elapsed().as_secs_f64();
            gate.record(drafted, emitted_n, secs, cost.pass(1));
        }
        if stop {
            break;
        }
    }
    out.total_s = t0.elapsed().as_secs_f64();
    out.cost = cost;
    out.declined_steps = gate.declined;
    Ok(out)
}

/// Append `tokens` (causal, no logits) to `cache` at the positions that follow it: the shared
/// prefill of target and draft caches (the committed context minus the pending root).
pub(crate) fn append_context(
    model: &Model,
    lane: &Lane,
    cache: &mut llada_runtime::KvCache,
    tokens: &[u32],
) -> Result<(), ModelError> {
    prefill(model, lane, cache, tokens, LogitRows::None).map(|_| ())
}

/// [`append_context`], also returning the last row's final feature.
pub(crate) fn prefill_feature(
    model: &Model,
    lane: &Lane,
    cache: &mut llada_runtime::KvCache,
    tokens: &[u32],
) -> Result<Vec<f32>, ModelError> {
    Ok(prefill(model, lane, cache, tokens, LogitRows::Last)?.features)
}

/// Append `tokens` to `cache` (causal), with logits and features of `rows`.
fn prefill(
    model: &Model,
    lane: &Lane,
    cache: &mut llada_runtime::KvCache,
    tokens: &[u32],
    rows: LogitRows<'_>,
) -> Result<llada_model::ForwardOutput, ModelError> {
    if tokens.is_empty() {
        return Ok(llada_model::ForwardOutput {
            logits: vec![],
            rows: vec![],
            vocab: model.config.vocab,
            features: vec![],
        });
    }
    let p0 = cache.len() as u32;
    let pos: Vec<u32> = (p0..p0 + tokens.len() as u32).collect();
    lane.run(|| {
        model.forward(
            &ForwardRequest {
                tokens,
                positions: &pos,
                mask: AttnMask::Causal,
                kv_write: KvWrite::Append,
                logits: rows,
            },
            cache,
        )
    })
}

/// A least-squares line `y = mean_y + slope · (x − mean_x)`: callers clamp the slope, then
/// take the intercept `mean_y − slope · mean_x` from it.
pub(crate) struct LineFit {
    pub mean_x: f64,
    pub mean_y: f64,
    /// Unclamped; `None` when the x values do not vary.
    pub slope: Option<f64>,
}

/// Least squares over `points` (non-empty) — the fit behind Lever's cost model ([`refit`]) and
/// AHASD's TVC ([`ahasd::Tvc`]).
pub(crate) fn fit_line(points: impl Iterator<Item = (f64, f64)> + Clone) -> LineFit {
    let n = points.clone().count().max(1) as f64;
    let (sx, sy) = points
        .clone()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for (x, y) in points {
        sxx += (x - mx) * (x - mx);
        sxy += (x - mx) * (y - my);
    }
    LineFit {
        mean_x: mx,
        mean_y: my,
        slope: (sxx >= 1e-9).then(|| sxy / sxx),
    }
}

/// Least-squares fit of `seconds = io_s + rows · token_s` over the measured passes (falls back
/// to the previous model when the rows do not vary).
fn refit(samples: &[(f64, f64)], prev: CostModel) -> CostModel {
    let recent = &samples[samples.len().saturating_sub(64)..];
    let f = fit_line(recent.iter().copied());
    let token_s = f.slope.map_or(prev.token_s, |b| b.max(1e-7));
    CostModel {
        io_s: (f.mean_y - token_s * f.mean_x).max(1e-6),
        token_s,
        draft_s: prev.draft_s,
    }
}
