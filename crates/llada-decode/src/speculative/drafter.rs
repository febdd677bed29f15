//! Drafters behind one trait, and the tree shapes grown from them.

use super::tree::{Calibration, CostModel, DraftTree};
use crate::sampling::{softmax, Sampler};
use llada_model::{AttnMask, ForwardRequest, KvWrite, LogitRows, Model, ModelError};
use llada_runtime::{KvCache, Lane};

/// The next-token proposals at one tree node.
#[derive(Debug, Clone, Default)]
pub struct Proposal {
    /// Most likely tokens with their draft probabilities, best first.
    pub top: Vec<(u32, f32)>,
    /// The full draft distribution (model drafters; needed by chain rejection sampling).
    pub full: Option<Vec<f32>>,
}

/// A source of draft tokens.
pub trait Drafter: Send {
    fn name(&self) -> String;
    /// Proposals after `context ++ path tokens of node` (`None`: after the context).
    fn propose(
        &mut self,
        context: &[u32],
        tree: &DraftTree,
        node: Option<usize>,
        k: usize,
    ) -> Result<Proposal, ModelError>;
    /// Whether this drafter reads the target's features ([`Drafter::observe_feature`]); the
    /// engine then asks the prefill for its last row's feature too.
    fn wants_features(&self) -> bool {
        false
    }
    /// The target's final feature ([`llada_model::ForwardOutput::features`]) of the row whose
    /// logits chose the pending root — after the prefill and after every verification. Only
    /// drafters that draft from the target's features ([`super::featdraft`]) keep it.
    fn observe_feature(&mut self, _feature: &[f32]) {}
}

/// How the tree is grown.
#[derive(Debug, Clone, PartialEq)]
pub enum TreeShape {
    /// A chain of up to `n` tokens, stopping below draft probability `p_min` (llama.cpp's
    /// `--draft-max` / `--draft-p-min`).
    Chain { n: usize, p_min: f32 },
    /// Fixed top-k tree: `widths[d]` children for every node of depth `d`.
    TopK { widths: Vec<usize> },
    /// Lever: best-first growth while a node's calibrated path probability pays for its row
    /// under the cost model (docs/speculative.md).
    CostAware {
        max_nodes: usize,
        max_depth: usize,
        top_k: usize,
    },
}

/// Lever's cost-aware tree with the limits `llada generate` uses by default (24 nodes, depth 8,
/// 3 children per node).
impl Default for TreeShape {
    fn default() -> Self {
        TreeShape::CostAware {
            max_nodes: 24,
            max_depth: 8,
            top_k: 3,
        }
    }
}

/// Grow a tree from `drafter`. With `sample` (chain rejection sampling), chain nodes are drawn
/// from the draft distribution instead of taken greedily; `q_full` receives each node's draft
/// distribution.
#[allow(clippy::too_many_arguments)]
pub fn grow(
    drafter: &mut dyn Drafter,
    context: &[u32],
    shape: &TreeShape,
    cal: &Calibration,
    cost: &CostModel,
    sample: Option<&mut Sampler>,
    q_full: &mut Vec<Vec<f32>>,
) -> Result<DraftTree, ModelError> {
    let mut t = DraftTree::default();
    q_full.clear();
    match shape {
        TreeShape::Chain { n, p_min } => {
            let mut node = None;
            let mut sampler = sample;
            for _ in 0..*n {
                let want_full = sampler.is_some();
                let p = drafter.propose(context, &t, node, if want_full { 0 } else { 1 })?;
                let (tok, q) = match (&mut sampler, &p.full) {
                    (Some(s), Some(full)) => {
                        let x = s.draw(full);
                        (x, full[x as usize])
                    }
                    _ => match p.top.first() {
                        Some(&(x, q)) if q >= *p_min => (x, q),
                        _ => break,
                    },
                };
                node = Some(t.push(node, tok, q, cal.accept(q)));
                q_full.push(p.full.unwrap_or_default());
            }
        }
        TreeShape::TopK { widths } => {
            let mut frontier: Vec<Option<usize>> = vec![None];
            for &w in widths {
                let mut next = vec![];
                for &f in &frontier {
                    let p = drafter.propose(context, &t, f, w)?;
                    for &(tok, q) in p.top.iter().take(w) {
                        next.push(Some(t.push(f, tok, q, cal.accept(q))));
                    }
                }
                frontier = next;
                if frontier.is_empty() {
                    break;
                }
            }
        }
        TreeShape::CostAware {
            max_nodes,
            max_depth,
            top_k,
        } => {
            // Candidates: (path probability, parent, token, q).
            let mut cands: Vec<(f32, Option<usize>, u32, f32)> = vec![];
            let root = drafter.propose(context, &t, None, *top_k)?;
            cands.extend(root.top.iter().map(|&(x, q)| (cal.accept(q), None, x, q)));
            while t.len() < *max_nodes {
                let Some(best) =
                    (0..cands.len()).max_by(|&a, &b| cands[a].0.total_cmp(&cands[b].0))
                else {
                    break;
                };
                let (a, parent, tok, q) = cands.swap_remove(best);
                if !cost.worth_adding(t.expected_accepted() as f64, t.len(), a as f64) {
                    break;
                }
                let id = t.push(parent, tok, q, cal.accept(q));
                if (t.depth[id] as usize) < *max_depth {
                    let p = drafter.propose(context, &t, Some(id), *top_k)?;
                    let pp = t.path_prob[id];
                    cands.extend(
                        p.top
                            .iter()
                            .map(|&(x, q)| (pp * cal.accept(q), Some(id), x, q)),
                    );
                }
            }
        }
    }
    Ok(t)
}

/// Prompt lookup (n-gram) drafting: no model. The continuation of the most recent earlier
/// occurrence of the longest matching suffix (3, 2 or 1 tokens), with probabilities from how
/// often each continuation followed that suffix.
#[derive(Debug, Default)]
pub struct NgramDrafter;

impl Drafter for NgramDrafter {
    fn name(&self) -> String {
        "ngram".into()
    }
    fn propose(
        &mut self,
        context: &[u32],
        tree: &DraftTree,
        node: Option<usize>,
        k: usize,
    ) -> Result<Proposal, ModelError> {
        let mut seq: Vec<u32> = context.to_vec();
        if let Some(n) = node {
            seq.extend(tree.path(n).iter().map(|&i| tree.tokens[i]));
        }
        for n in [3usize, 2, 1] {
            if seq.len() <= n {
                continue;
            }
            let suffix = &seq[seq.len() - n..];
            let mut counts: Vec<(u32, usize)> = vec![];
            for i in 0..seq.len() - n {
                if &seq[i..i + n] == suffix {
                    let next = seq[i + n];
                    match counts.iter_mut().find(|c| c.0 == next) {
                        Some(c) => c.1 += 1,
                        None => counts.push((next, 1)),
                    }
                }
            }
            if counts.is_empty() {
                continue;
            }
            let total: usize = counts.iter().map(|c| c.1).sum();
            counts.sort_by_key(|c| std::cmp::Reverse(c.1));
            // Longer matches are more trustworthy.
            let trust = [0.0, 0.35, 0.6, 0.8][n];
            let top = counts
                .iter()
                .take(k.max(1))
                .map(|&(t, c)| (t, trust * c as f32 / total as f32))
                .collect();
            return Ok(Proposal { top, full: None });
        }
        Ok(Proposal::default())
    }
}

/// A drafter plus prompt lookup: at every node the n-gram drafter's proposals (2- and 3-token
/// suffix matches only; single-token matches are worse than a model) are merged into the inner
/// drafter's. A token both propose gets `1 − (1 − q_inner)(1 − q_ngram)`. Greedy text of a
/// small target repeats itself — on SmolLM2-135M's own greedy continuations a 3-token suffix
/// recurs at 37 % of the first 48 generated positions and predicts the next token 87 % of the
/// time (87 % / 94 % over the next 48; docs/speculative.md) — and a draft model cannot know
/// which loop the target is in. The full distribution (chain rejection sampling) stays the
/// inner drafter's.
pub struct HybridDrafter<'a> {
    pub inner: Box<dyn Drafter + 'a>,
}

/// Lowest n-gram probability the hybrid takes (the n-gram drafter gives a 2-token match 0.6 and
/// a 3-token match 0.8 times the continuation's frequency; a 1-token match at most 0.35).
const HYBRID_MIN_NGRAM: f32 = 0.5;

impl Drafter for HybridDrafter<'_> {
    fn name(&self) -> String {
        format!("ngram+{}", self.inner.name())
    }
    fn wants_features(&self) -> bool {
        self.inner.wants_features()
    }
    fn observe_feature(&mut self, feature: &[f32]) {
        self.inner.observe_feature(feature)
    }
    fn propose(
        &mut self,
        context: &[u32],
        tree: &DraftTree,
        node: Option<usize>,
        k: usize,
    ) -> Result<Proposal, ModelError> {
        let mut p = self.inner.propose(context, tree, node, k)?;
        let ng = NgramDrafter.propose(context, tree, node, k)?;
        for &(tok, q) in ng.top.iter().filter(|c| c.1 >= HYBRID_MIN_NGRAM) {
            match p.top.iter_mut().find(|c| c.0 == tok) {
                Some(c) => c.1 = 1.0 - (1.0 - c.1) * (1.0 - q),
                None => p.top.push((tok, q)),
            }
        }
        p.top.sort_by(|a, b| b.1.total_cmp(&a.1));
        p.top.truncate(k.max(1));
        Ok(p)
    }
}

/// The sequence a model-based drafter holds in its KV cache (at least `context[..len − 1]`
/// after a sync; the last token is fed with every draft step, and a drafter may append it):
/// rolled back to the common prefix after rejections or a switch of branch, then extended.
pub(crate) struct ContextCache {
    pub cache: KvCache,
    cached: Vec<u32>,
}

impl ContextCache {
    pub fn new(cache: KvCache) -> Self {
        Self {
            cache,
            cached: vec![],
        }
    }
    /// Sync to `context`; `append(cache, tokens)` runs the model over the missing tokens (at
    /// the positions that follow the cache).
    pub fn sync(
        &mut self,
        context: &[u32],
        append: impl FnOnce(&mut KvCache, &[u32]) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        let want = &context[..context.len().saturating_sub(1)];
        let common = self
            .cached
            .iter()
            .zip(want)
            .take_while(|(a, b)| a == b)
            .count();
        self.cache.truncate(common);
        self.cached.truncate(common);
        if common < want.len() {
            append(&mut self.cache, &want[common..])?;
            self.cached.extend_from_slice(&want[common..]);
        }
        Ok(())
    }
}

/// Tokens and positions of one draft step: the last context token, then `node`'s path.
pub(crate) fn step_rows(
    context: &[u32],
    tree: &DraftTree,
    node: Option<usize>,
) -> (Vec<u32>, Vec<u32>) {
    let mut toks = vec![context[context.len() - 1]];
    if let Some(n) = node {
        toks.extend(tree.path(n).iter().map(|&i| tree.tokens[i]));
    }
    let p0 = (context.len() - 1) as u32;
    let pos = (p0..p0 + toks.len() as u32).collect();
    (toks, pos)
}

/// A proposal from draft `logits` over `ids` (`None`: over every id of `vocab`): softmax at
/// `temperature` (0: plain softmax), the `k` most likely (ties: lower index first) and the full
/// distribution over `vocab`.
pub(crate) fn proposal(
    mut logits: Vec<f32>,
    ids: Option<&[u32]>,
    vocab: usize,
    k: usize,
    temperature: f32,
) -> Proposal {
    if temperature > 0.0 {
        logits.iter_mut().for_each(|v| *v /= temperature);
    }
    if ids.is_none() {
        // An id whose logit lies more than 110 below the largest gets probability exactly 0
        // (`exp` underflows in f32), so leaving it out changes no probability and no sum. A
        // reduced-vocabulary draft scores every id outside its 8 193 rows −10³⁰: normalising
        // and ranking all 49 152 cost more than the draft's forward (0.66 against 0.42–1.2 ms
        // per proposal). The ranking is the same too unless the top k reach ids of
        // probability 0, whose order counts every id (lowest first): then, and with a NaN
        // logit, the full path decides.
        let mx = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut nan = false;
        let live: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| {
                let v = logits[i as usize];
                nan |= v.is_nan();
                v - mx >= -110.0
            })
            .collect();
        if !nan && live.len() < logits.len() && live.len() >= k.max(1) {
            let kept = live.iter().map(|&i| logits[i as usize]).collect();
            let p = proposal(kept, Some(&live), vocab, k, 0.0);
            if p.top.iter().all(|&(_, q)| q > 0.0) {
                return p;
            }
        }
    }
    softmax(&mut logits);
    let p = logits;
    let rank = |a: &usize, b: &usize| p[*b].total_cmp(&p[*a]).then(a.cmp(b));
    let mut idx: Vec<usize> = (0..p.len()).collect();
    let kk = k.max(1).min(idx.len());
    if kk > 0 {
        idx.select_nth_unstable_by(kk - 1, rank);
    }
    idx.truncate(kk);
    idx.sort_by(rank);
    let id = |i: usize| ids.map_or(i as u32, |ids| ids[i]);
    let top = idx.iter().map(|&i| (id(i), p[i])).collect();
    let full = match ids {
        None => p,
        Some(ids) => {
            let mut full = vec![0f32; vocab];
            for (&t, &q) in ids.iter().zip(&p) {
                full[t as usize] = q;
            }
            full
        }
    };
    Proposal {
        top,
        full: Some(full),
    }
}

/// A draft model sharing the target's token ids (e.g. `smollm2-draft`), with its own KV cache
/// of the committed context.
pub struct ModelDrafter<'m> {
    pub model: &'m Model,
    pub lane: &'m Lane,
    ctx: ContextCache,
    temperature: f32,
}

impl<'m> ModelDrafter<'m> {
    /// `temperature` shapes the draft distribution (0: greedy top-k; > 0: softmax(logits / T)).
    pub fn new(model: &'m Model, lane: &'m Lane, temperature: f32) -> Self {
        Self {
            model,
            lane,
            ctx: ContextCache::new(model.new_cache()),
            temperature,
        }
    }
}

impl Drafter for ModelDrafter<'_> {
    fn name(&self) -> String {
        "model".into()
    }
    fn propose(
        &mut self,
        context: &[u32],
        tree: &DraftTree,
        node: Option<usize>,
        k: usize,
    ) -> Result<Proposal, ModelError> {
        if context.is_empty() {
            return Ok(Proposal::default());
        }
        let (model, lane) = (self.model, self.lane);
        // The cache follows the sequence being extended: the context, then `node`'s path.
        // Best-first growth mostly extends the path it just grew, so a proposal costs one row;
        // another branch truncates the cache to the common prefix and appends its own tokens
        // (a path recomputed in full on every proposal made a 0.5B draft cost 87 ms a node).
        let mut seq = context.to_vec();
        if let Some(n) = node {
            seq.extend(tree.path(n).iter().map(|&i| tree.tokens[i]));
        }
        self.ctx.sync(&seq, |cache, toks| {
            super::append_context(model, lane, cache, toks)
        })?;
        let last = [seq[seq.len() - 1]];
        let pos = [(seq.len() - 1) as u32];
        let cache = &mut self.ctx.cache;
        let out = lane.run(|| {
            model.forward(
                &ForwardRequest {
                    tokens: &last,
                    positions: &pos,
                    mask: AttnMask::Causal,
                    kv_write: KvWrite::Append,
                    logits: LogitRows::Last,
                },
                cache,
            )
        })?;
        // Its KV stays: the next proposal down this path starts from it.
        self.ctx.cached.push(last[0]);
        Ok(proposal(
            out.row(0).to_vec(),
            None,
            model.config.vocab,
            k,
            self.temperature,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inner proposals the n-gram drafter does not back stay as they are; a confident n-gram
    /// continuation joins them (or raises the same token), single-token matches are ignored.
    #[test]
    fn hybrid_merges_confident_ngrams() {
        struct Fixed(Vec<(u32, f32)>);
        impl Drafter for Fixed {
            fn name(&self) -> String {
                "fixed".into()
            }
            fn propose(
                &mut self,
                _: &[u32],
                _: &DraftTree,
                _: Option<usize>,
                _: usize,
            ) -> Result<Proposal, ModelError> {
                Ok(Proposal {
                    top: self.0.clone(),
                    full: None,
                })
            }
        }
        let t = DraftTree::default();
        // "5 6 7 8 … 5 6 7" → the 3-gram drafter says 8 (q = 0.8).
        let ctx = [5u32, 6, 7, 8, 1, 2, 5, 6, 7];
        let mut h = HybridDrafter {
            inner: Box::new(Fixed(vec![(9, 0.5), (8, 0.2)])),
        };
        assert_eq!(h.name(), "ngram+fixed");
        let p = h.propose(&ctx, &t, None, 3).unwrap();
        assert_eq!(p.top[0].0, 8);
        assert!((p.top[0].1 - (1.0 - 0.8 * 0.2)).abs() < 1e-6);
        assert_eq!(p.top[1], (9, 0.5));
        let mut h = HybridDrafter {
            inner: Box::new(Fixed(vec![(9, 0.5)])),
        };
        let p = h.propose(&ctx, &t, None, 3).unwrap();
        assert_eq!(p.top, vec![(8, 0.8), (9, 0.5)]);
        // Only a 1-token match ("… 3" once before): the inner proposal alone.
        let p = h.propose(&[3, 4, 1, 3], &t, None, 3).unwrap();
        assert_eq!(p.top, vec![(9, 0.5)]);
    }

    /// Leaving out the ids a reduced vocabulary scores −10³⁰ changes nothing: the same top-k,
    /// bit for bit, and the same full distribution, as normalising every id.
    #[test]
    fn proposals_skip_ids_of_probability_zero() {
        let vocab = 5000;
        let mut logits = vec![-1e30f32; vocab];
        for i in (0..vocab).step_by(7) {
            logits[i] = ((i * 37) % 101) as f32 / 10.0 - 5.0;
        }
        logits[700] = logits[7]; // a tie: the lower id ranks first
        for (k, temperature) in [(1, 0.0), (8, 0.0), (8, 0.7)] {
            let got = proposal(logits.clone(), None, vocab, k, temperature);
            let mut p = logits.clone();
            if temperature > 0.0 {
                p.iter_mut().for_each(|v| *v /= temperature);
            }
            softmax(&mut p);
            let mut idx: Vec<usize> = (0..vocab).collect();
            idx.sort_by(|a, b| p[*b].total_cmp(&p[*a]).then(a.cmp(b)));
            let want: Vec<(u32, f32)> = idx[..k].iter().map(|&i| (i as u32, p[i])).collect();
            assert_eq!(got.top, want, "k {k} T {temperature}");
            let full = got.full.unwrap();
            assert_eq!(full.len(), vocab);
            assert!(full.iter().zip(&p).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        // Fewer live ids than k: every id is ranked, as before.
        let mut few = vec![-1e30f32; 50];
        few[3] = 1.0;
        let got = proposal(few, None, 50, 4, 0.0);
        assert_eq!(got.top.len(), 4);
        assert_eq!(got.top[0], (3, 1.0));
        // Kept ids whose probability is 0 all the same (105 below the top): the top k reach
        // them, so their order is the full path's (lowest id of all first, a dropped one here).
        let mut zero = vec![-1e30f32; 50];
        zero[3] = 0.0;
        zero[20] = -105.0;
        let got = proposal(zero, None, 50, 2, 0.0);
        assert_eq!(got.top, vec![(3, 1.0), (0, 0.0)]);
        // A NaN logit is not hidden by leaving ids out.
        let mut bad = vec![-1e30f32; 50];
        bad[3] = 0.0;
        bad[7] = f32::NAN;
        let got = proposal(bad, None, 50, 2, 0.0);
        assert!(got.full.unwrap().iter().all(|q| q.is_nan()));
    }

    #[test]
    fn ngram_finds_the_repeat() {
        let mut d = NgramDrafter;
        let ctx = [5u32, 6, 7, 8, 9, 5, 6, 7];
        let p = d.propose(&ctx, &DraftTree::default(), None, 2).unwrap();
        assert_eq!(p.top[0].0, 8);
        // A chain follows the earlier occurrence token by token.
        let t = grow(
            &mut d,
            &ctx,
            &TreeShape::Chain { n: 3, p_min: 0.1 },
            &Calibration::default(),
            &CostModel {
                io_s: 1.0,
                token_s: 0.01,
                draft_s: 0.0,
            },
            None,
            &mut vec![],
        )
        .unwrap();
        assert_eq!(t.tokens, vec![8, 9, 5]);
    }

    #[test]
    fn topk_tree_shape() {
        let mut d = NgramDrafter;
        let ctx = [1u32, 2, 1, 3, 1, 4, 1];
        let t = grow(
            &mut d,
            &ctx,
            &TreeShape::TopK { widths: vec![3, 1] },
            &Calibration::default(),
            &CostModel {
                io_s: 1.0,
                token_s: 0.01,
                draft_s: 0.0,
            },
            None,
            &mut vec![],
        )
        .unwrap();
        // Three continuations of "1" at depth 1, one child each at depth 2.
        assert_eq!(t.children(None).count(), 3);
        assert_eq!(t.len(), 6);
    }
}
