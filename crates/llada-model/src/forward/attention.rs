//! One layer's self-attention over the cache and the batch: fused q/k/v projection (plus
//! biases), RoPE, scaled dot-product attention, the layer's K/V written to the cache, and the
//! output projection.
//!
//! Invariants: a row attends within its own sequence only; its keys are the valid slots of
//! that sequence's cache the pass does not rewrite, then the sequence's own rows, in that order (one summation order per output: a pass's numbers do not depend on how
//! the rows were batched); every row reads the cache as it was before the pass — the layer's
//! K/V are written only after all rows have attended.

use super::batch::Batch;
use super::ops::rope;
use super::validate::CacheRead;
use super::{AttnMask, SeqPass};
use crate::weights::Layer;
use crate::{ModelConfig, ModelError};
use llada_kernels::vecops::{attend_head, KvRows};
use llada_runtime::trace::OpSpan;
use llada_runtime::KvCache;
use rayon::prelude::*;

/// Attention of layer `li` on the normed rows `h`; returns what the residual stream adds.
pub(super) fn attention(
    layer: &Layer,
    h: &[f32],
    li: usize,
    b: &Batch,
    c: &ModelConfig,
    seqs: &mut [SeqPass],
) -> Result<Vec<f32>, ModelError> {
    let (n, l) = (b.n, li as i32);
    let (hd, nh, nkv) = (c.head_dim, c.n_heads, c.n_kv_heads);
    let (qd, kvd) = (c.q_dim(), c.kv_dim());
    let (mut q, mut k, v) = qkv(layer, h, n, l)?;
    {
        let _s = OpSpan::begin("rope", l, &[n as u64, (nh + nkv) as u64, hd as u64], "F32").cost(
            ((qd + kvd) * n * 4) as u64,
            ((qd + kvd) * n * 4) as u64,
            ((qd + kvd) * n * 3) as u64,
        );
        rope(&mut q, nh, hd, &b.cos, &b.sin);
        rope(&mut k, nkv, hd, &b.cos, &b.sin);
    }
    let attn = {
        let caches: Vec<&KvCache> = seqs.iter().map(|sp| &*sp.cache).collect();
        attend((&q, &k, &v), b, c, &caches, li)
    };
    // Deferred cache writes for this layer (after every row has read the old caches).
    for (seg, sp) in b.segs.iter().zip(seqs.iter_mut()) {
        for i in seg.range() {
            if let Some(s) = b.slots[i] {
                sp.cache.write(
                    li,
                    s,
                    b.positions[i],
                    &k[i * kvd..(i + 1) * kvd],
                    &v[i * kvd..(i + 1) * kvd],
                );
            }
        }
    }
    let mut aq = None;
    layer.wo.forward(&attn, &mut aq, n, l, "attn_output")
}

/// The q, k and v rows of a batch (`n × q_dim`, `n × kv_dim`, `n × kv_dim`).
type Qkv = (Vec<f32>, Vec<f32>, Vec<f32>);

/// The q, k and v rows of `h` (one fused projection), biases added.
fn qkv(layer: &Layer, h: &[f32], n: usize, l: i32) -> Result<Qkv, ModelError> {
    let mut qkv = layer.qkv.forward(h, n, l, "attn_qkv")?.into_iter();
    let (mut q, mut k, mut v) = match (qkv.next(), qkv.next(), qkv.next()) {
        (Some(q), Some(k), Some(v)) => (q, k, v),
        _ => {
            return Err(ModelError::Other(
                "q/k/v projection returned too few outputs".into(),
            ))
        }
    };
    for (t, b) in [
        (&mut q, &layer.bq),
        (&mut k, &layer.bk),
        (&mut v, &layer.bv),
    ] {
        if let Some(b) = b {
            for row in t.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
            }
        }
    }
    Ok((q, k, v))
}

/// What one sequence's rows attend over: its cache's rows of this layer and its key lists.
struct SegKeys<'a> {
    ck: &'a [f32],
    cv: &'a [f32],
    /// Cache slots every row of the sequence sees, when the mask does not look at positions.
    all_cache: Option<Vec<u32>>,
}

/// Scaled dot-product attention of every live row over the visible keys of its own sequence
/// (`n × q_dim`): one parallel loop over all sequences' rows, so many short sequences (a
/// server's decode steps) cost one dispatch, not one each.
fn attend(
    (q, k, v): (&[f32], &[f32], &[f32]),
    b: &Batch,
    c: &ModelConfig,
    caches: &[&KvCache],
    li: usize,
) -> Vec<f32> {
    let n = b.n;
    let (hd, nh, nkv) = (c.head_dim, c.n_heads, c.n_kv_heads);
    let (qd, kvd) = (c.q_dim(), c.kv_dim());
    let (scale, group) = (1.0 / (hd as f32).sqrt(), nh / nkv);
    let mut attn = vec![0f32; n * qd];
    let visible_keys: usize = b
        .segs
        .iter()
        .map(|s| s.n * (s.kv.old_len - s.kv.excluded.iter().filter(|e| **e).count() + s.n))
        .sum::<usize>()
        / n.max(1);
    let _s = OpSpan::begin(
        "attention",
        li as i32,
        &[n as u64, visible_keys as u64, nh as u64, hd as u64],
        "F32",
    )
    .cost(
        (2 * visible_keys * kvd * 4 + n * qd * 4) as u64,
        (n * qd * 4) as u64,
        (4 * n * visible_keys * qd) as u64,
    );
    let keys: Vec<SegKeys> = b
        .segs
        .iter()
        .zip(caches)
        .map(|(seg, cache)| {
            let old_len = seg.kv.old_len;
            SegKeys {
                ck: &cache.k(li)[..old_len * kvd],
                cv: &cache.v(li)[..old_len * kvd],
                all_cache: shared_cache_keys(seg.mask(), &seg.kv),
            }
        })
        .collect();
    let seg_of: Vec<usize> = b
        .segs
        .iter()
        .enumerate()
        .flat_map(|(s, seg)| std::iter::repeat_n(s, seg.n))
        .collect();
    // One task per (row, KV group): the group's query heads share every key/value row they
    // read (GQA), and the visible-key list is built once.
    attn.par_chunks_mut(group * hd)
        .enumerate()
        .for_each(|(idx, out)| {
            let (i, g) = (idx / nkv, idx % nkv);
            let (seg, sk) = (&b.segs[seg_of[i]], &keys[seg_of[i]]);
            let r = seg.range();
            let keys = keys_of(
                i - r.start,
                seg.mask(),
                sk.all_cache.as_deref(),
                &seg.kv,
                &b.positions[r.clone()],
            );
            let rows = KvRows {
                cache_k: sk.ck,
                cache_v: sk.cv,
                new_k: &k[r.start * kvd..r.end * kvd],
                new_v: &v[r.start * kvd..r.end * kvd],
                split: seg.kv.old_len as u32,
                stride: kvd,
                offset: g * hd,
            };
            let mut scores = vec![0f32; keys.len()];
            for (hh, out) in out.chunks_exact_mut(hd).enumerate() {
                let head = g * group + hh;
                let qv = &q[i * qd + head * hd..i * qd + (head + 1) * hd];
                attend_head(qv, &rows, &keys, scale, &mut scores, out);
            }
        });
    attn
}

/// Cache slots every row sees (no per-row position test needed): all but the slots this pass
/// rewrites, for masks that do not look at positions.
fn shared_cache_keys(mask: AttnMask, kv: &CacheRead) -> Option<Vec<u32>> {
    matches!(mask, AttnMask::Bidirectional | AttnMask::Explicit(_)).then(|| {
        (0..kv.old_len as u32)
            .filter(|&s| !kv.excluded[s as usize])
            .collect()
    })
}

/// The keys row `i` sees: cache slots (`all_cache` when every row sees the same ones), then
/// batch rows as `old_len + j`.
fn keys_of(
    i: usize,
    mask: AttnMask,
    all_cache: Option<&[u32]>,
    kv: &CacheRead,
    positions: &[u32],
) -> Vec<u32> {
    let (n, old_len) = (positions.len(), kv.old_len);
    let pi = positions[i];
    let mut keys: Vec<u32> = match all_cache {
        Some(c) => {
            let mut v = Vec::with_capacity(c.len() + n);
            v.extend_from_slice(c);
            v
        }
        None => (0..old_len)
            .filter(|&s| !kv.excluded[s] && mask.by_pos(pi, kv.cache_pos[s]))
            .map(|s| s as u32)
            .collect(),
    };
    for j in 0..n {
        let vis = match mask {
            AttnMask::Explicit(m) => m[i * n + j],
            _ => mask.by_pos(pi, positions[j]),
        };
        if vis {
            keys.push((old_len + j) as u32);
        }
    }
    keys
}
