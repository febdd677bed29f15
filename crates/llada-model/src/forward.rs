//! The forward entry point shared by every decoder (autoregressive, diffusion, speculative).
//!
//! A request is a batch of `(token, position)` rows plus:
//! * an attention specification ([`AttnMask`]) saying which keys each row sees — keys are the
//!   valid KV-cache slots followed by the batch's own rows;
//! * which rows write their K/V into which cache slot ([`KvWrite`]) — a slot below the cache
//!   length is overwritten (revision) and is then read from the batch, not from the stale cache;
//! * for which rows logits are computed ([`LogitRows`]); the final norm and LM head run only
//!   for those rows (selective logits).
//!
//! Logits are returned raw, per row; Dream's one-position shift is the decoder's business.

use crate::store::Unit;
use crate::weights::Layer;
use crate::{Model, ModelError};
use llada_kernels::vecops::{attend_head, dot, KvRows};
use llada_runtime::trace::{OpSpan, Tracer};
use llada_runtime::KvCache;
use rayon::prelude::*;

/// Which keys a query row sees.
#[derive(Debug, Clone, Copy)]
pub enum AttnMask<'a> {
    /// Key visible iff its position ≤ the query's position.
    Causal,
    /// Every key visible.
    Bidirectional,
    /// Key visible iff `key_pos / block ≤ query_pos / block` (semi-autoregressive blocks).
    Blockwise { block: u32 },
    /// Row-major `n × n` visibility among the batch rows (`mask[i·n + j]`: row i sees row j);
    /// every cache slot is visible (token trees over a committed prefix).
    Explicit(&'a [bool]),
}

impl AttnMask<'_> {
    #[inline]
    fn by_pos(&self, q: u32, k: u32) -> bool {
        match *self {
            AttnMask::Causal => k <= q,
            AttnMask::Bidirectional | AttnMask::Explicit(_) => true,
            AttnMask::Blockwise { block } => k / block <= q / block,
        }
    }
}

/// Which rows write K/V into the cache.
#[derive(Debug, Clone, Copy)]
pub enum KvWrite<'a> {
    /// Nothing is written (the cache is only read).
    None,
    /// Every row is appended, in order, after the current cache length.
    Append,
    /// `slots[i]`: the cache slot row i writes, or `None`.
    Slots(&'a [Option<usize>]),
}

/// Rows whose logits are computed.
#[derive(Debug, Clone, Copy)]
pub enum LogitRows<'a> {
    None,
    All,
    Last,
    Rows(&'a [usize]),
}

/// One forward pass.
#[derive(Debug, Clone, Copy)]
pub struct ForwardRequest<'a> {
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    pub mask: AttnMask<'a>,
    pub kv_write: KvWrite<'a>,
    pub logits: LogitRows<'a>,
}

impl<'a> ForwardRequest<'a> {
    /// Causal rows appended to the cache, logits for the last row (AR prefill/decode).
    pub fn causal_append(tokens: &'a [u32], positions: &'a [u32]) -> Self {
        Self {
            tokens,
            positions,
            mask: AttnMask::Causal,
            kv_write: KvWrite::Append,
            logits: LogitRows::Last,
        }
    }
}

/// Early exit for [`Model::forward_with_exit`].
pub struct EarlyExit<'a> {
    /// Layer (0-based) after which rows may leave the batch.
    pub layer: usize,
    /// `keep(hidden, alive)`: `hidden` is `alive.len() × d_model`, the residual stream after
    /// `layer`; `alive[i]` is the original batch index of row `i`. One flag per row.
    #[allow(clippy::type_complexity)]
    pub keep: &'a (dyn Fn(&[f32], &[usize]) -> Vec<bool> + Sync),
}

/// Logits of the requested rows.
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    /// `rows.len() × vocab`, row-major.
    pub logits: Vec<f32>,
    /// Batch row index of each logits row.
    pub rows: Vec<usize>,
    pub vocab: usize,
    /// `rows.len() × d_model`: the final features of the same rows — the last hidden state
    /// after the final RMSNorm, what the LM head multiplies (with a tied head, `logits_t =
    /// ⟨feature, E_t⟩`). Read by drafters that draft from the target's own features
    /// (`speculative::featdraft`). Empty for [`Model::forward_hidden`].
    pub features: Vec<f32>,
}

impl ForwardOutput {
    /// Logits of the `i`-th returned row.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab..(i + 1) * self.vocab]
    }
    /// Logits of batch row `r`, if computed.
    pub fn for_batch_row(&self, r: usize) -> Option<&[f32]> {
        self.rows.iter().position(|&x| x == r).map(|i| self.row(i))
    }
}

fn rmsnorm(x: &[f32], w: &[f32], eps: f64, rows: &[usize], layer: i32) -> Vec<f32> {
    let d = w.len();
    let _s = OpSpan::begin("rmsnorm", layer, &[rows.len() as u64, d as u64], "F32").cost(
        (rows.len() * d * 4 + d * 4) as u64,
        (rows.len() * d * 4) as u64,
        (rows.len() * d * 3) as u64,
    );
    let mut out = vec![0f32; rows.len() * d];
    for (o, &r) in out.chunks_exact_mut(d).zip(rows) {
        let xr = &x[r * d..(r + 1) * d];
        let ss: f64 = xr.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        let inv = 1.0 / ((ss / d as f64) + eps).sqrt();
        for ((o, v), g) in o.iter_mut().zip(xr).zip(w) {
            *o = ((*v as f64) * inv) as f32 * g;
        }
    }
    out
}

/// Rotate-half RoPE (HF layout) on `n` rows of `heads` heads, in place.
fn rope(x: &mut [f32], heads: usize, hd: usize, cos: &[f32], sin: &[f32]) {
    let half = hd / 2;
    for (r, row) in x.chunks_exact_mut(heads * hd).enumerate() {
        let (c, s) = (
            &cos[r * half..(r + 1) * half],
            &sin[r * half..(r + 1) * half],
        );
        for h in row.chunks_exact_mut(hd) {
            let (a, b) = h.split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                a[i] = x1 * c[i] - x2 * s[i];
                b[i] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}

impl Model {
    /// Run one forward pass. `cache` is read (its valid slots are keys) and written as
    /// `req.kv_write` says.
    pub fn forward(
        &self,
        req: &ForwardRequest,
        cache: &mut KvCache,
    ) -> Result<ForwardOutput, ModelError> {
        self.forward_with_exit(req, cache, None)
    }

    /// [`Model::forward`] with early exit: after layer `exit.layer`, `exit.keep` sees the hidden
    /// states of the live rows and the rows it rejects leave the batch — no further layers, no
    /// logits (absent from [`ForwardOutput::rows`]), and their cache slots hold K/V only up to
    /// that layer (the caller rolls them back). The caller keeps the batch consistent: a row
    /// that others attend to must not leave while they stay (tree verification drops whole
    /// subtrees).
    pub fn forward_with_exit(
        &self,
        req: &ForwardRequest,
        cache: &mut KvCache,
        exit: Option<&EarlyExit>,
    ) -> Result<ForwardOutput, ModelError> {
        self.forward_impl(req, cache, exit, None)
    }

    /// The residual stream after the first `layers` layers (no final norm, no head) of the
    /// requested rows, as a [`ForwardOutput`] whose rows are `d_model` wide; K/V of those layers
    /// only are written. The first `layers` layers must be resident (early-exit self-drafting
    /// reads them between the target's passes; a streamed layer is an error).
    pub fn forward_hidden(
        &self,
        req: &ForwardRequest,
        cache: &mut KvCache,
        layers: usize,
    ) -> Result<ForwardOutput, ModelError> {
        if layers == 0 || layers > self.config.n_layers {
            return Err(ModelError::BadRequest(format!(
                "cannot stop after {layers} of {} layers",
                self.config.n_layers
            )));
        }
        if let Some(i) = self.weights.layers[..layers]
            .iter()
            .position(|l| l.is_none())
        {
            return Err(ModelError::BadRequest(format!(
                "layer {i} is streamed under the memory budget; self-drafting needs its layers resident"
            )));
        }
        self.forward_impl(req, cache, None, Some(layers))
    }

    fn forward_impl(
        &self,
        req: &ForwardRequest,
        cache: &mut KvCache,
        exit: Option<&EarlyExit>,
        stop: Option<usize>,
    ) -> Result<ForwardOutput, ModelError> {
        let c = &self.config;
        let w = &self.weights;
        let n = req.tokens.len();
        if n == 0 || req.positions.len() != n {
            return Err(ModelError::BadRequest(format!(
                "{} tokens but {} positions",
                n,
                req.positions.len()
            )));
        }
        if let Some(&p) = req.positions.iter().find(|&&p| p as usize >= c.max_ctx) {
            return Err(ModelError::ContextOverflow {
                pos: p,
                ctx: c.max_ctx,
            });
        }
        if let AttnMask::Explicit(m) = req.mask {
            if m.len() != n * n {
                return Err(ModelError::BadRequest(format!(
                    "explicit mask has {} entries, need {}",
                    m.len(),
                    n * n
                )));
            }
        }
        if let AttnMask::Blockwise { block: 0 } = req.mask {
            return Err(ModelError::BadRequest("block size 0".into()));
        }
        if cache.n_layers() != c.n_layers || cache.kv_dim() != c.kv_dim() {
            return Err(ModelError::BadRequest(
                "KV cache shape does not match the model".into(),
            ));
        }
        let mut logit_rows: Vec<usize> = match req.logits {
            LogitRows::None => vec![],
            LogitRows::All => (0..n).collect(),
            LogitRows::Last => vec![n - 1],
            LogitRows::Rows(r) => {
                if let Some(&bad) = r.iter().find(|&&r| r >= n) {
                    return Err(ModelError::BadRequest(format!(
                        "logit row {bad} outside the batch of {n}"
                    )));
                }
                r.to_vec()
            }
        };

        if let Some(&t) = req.tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(ModelError::BadToken {
                id: t,
                vocab: c.vocab,
            });
        }
        // Where each row's K/V goes (validated before the cache is touched).
        let old_len = cache.len();
        let mut slots: Vec<Option<usize>> = match req.kv_write {
            KvWrite::None => vec![None; n],
            KvWrite::Append => (0..n).map(|i| Some(old_len + i)).collect(),
            KvWrite::Slots(s) => {
                if s.len() != n {
                    return Err(ModelError::BadRequest(format!(
                        "{} KV slots for {n} rows",
                        s.len()
                    )));
                }
                s.to_vec()
            }
        };
        let written: Vec<usize> = slots.iter().flatten().copied().collect();
        let new_len = cache.plan_write(&written)?;
        let mut excluded = vec![false; old_len];
        for &s in &written {
            if s < old_len {
                excluded[s] = true;
            }
        }
        let cache_pos: Vec<u32> = cache.positions().to_vec();
        cache.grow_to(new_len);
        Tracer::global().next_pass();
        let (d, hd, nh, nkv) = (c.d_model, c.head_dim, c.n_heads, c.n_kv_heads);
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        let mut all_rows: Vec<usize> = (0..n).collect();
        // Early exit shrinks the batch: the live rows' original indices, positions and mask.
        let mut n = n;
        let mut alive: Vec<usize> = (0..n).collect();
        let mut positions: Vec<u32> = req.positions.to_vec();
        let mut emask: Option<Vec<bool>> = match req.mask {
            AttnMask::Explicit(m) => Some(m.to_vec()),
            _ => None,
        };

        let mut x = vec![0f32; n * d];
        {
            let _s = OpSpan::begin("embed", -1, &[n as u64, d as u64], w.embed.view().ty.name())
                .cost(
                    (n * w.embed.view().len / w.embed.vocab.max(1)) as u64,
                    (n * d * 4) as u64,
                    0,
                );
            for (row, &t) in x.chunks_exact_mut(d).zip(req.tokens) {
                let r = w.vocab_map.as_ref().map_or(t, |m| m.row(t));
                w.embed.lookup(r, row)?;
            }
        }
        // RoPE tables for the batch positions (angles in f64).
        let half = hd / 2;
        let mut cos = vec![0f32; n * half];
        let mut sin = vec![0f32; n * half];
        for (r, &p) in positions.iter().enumerate() {
            for i in 0..half {
                let inv = c.rope_theta.powf(-2.0 * i as f64 / hd as f64);
                let a = p as f64 * inv;
                cos[r * half + i] = a.cos() as f32;
                sin[r * half + i] = a.sin() as f32;
            }
        }
        let scale = 1.0 / (hd as f32).sqrt();
        let group = nh / nkv;

        // Streamed weights (memory budget): a prefetch thread builds the next streamed layer
        // while this one computes; resident layers are used in place.
        std::thread::scope(|scope| -> Result<ForwardOutput, ModelError> {
            let rx = match stop {
                Some(_) => None,
                None => self.store.as_ref().map(|st| (st, st.start(scope, c))),
            };
            for (li, slot) in w.layers.iter().enumerate() {
                if stop == Some(li) {
                    break;
                }
                let staged;
                let layer: &Layer = match (slot, &rx) {
                    (Some(l), _) => l,
                    (None, Some((st, rx))) => match st.next(rx)? {
                        Unit::Layer(l) => {
                            staged = l;
                            &staged
                        }
                        Unit::HeadRows(..) => {
                            return Err(ModelError::Other("weight stream out of order".into()))
                        }
                    },
                    (None, None) => {
                        return Err(ModelError::Other(format!("layer {li} is not loaded")))
                    }
                };
                let l = li as i32;
                let h = rmsnorm(&x, &layer.attn_norm, c.rms_eps, &all_rows, l);
                let mut qkv = layer.qkv.forward(&h, n, l, "attn_qkv")?.into_iter();
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
                {
                    let _s =
                        OpSpan::begin("rope", l, &[n as u64, (nh + nkv) as u64, hd as u64], "F32")
                            .cost(
                                ((qd + kvd) * n * 4) as u64,
                                ((qd + kvd) * n * 4) as u64,
                                ((qd + kvd) * n * 3) as u64,
                            );
                    rope(&mut q, nh, hd, &cos, &sin);
                    rope(&mut k, nkv, hd, &cos, &sin);
                }
                let ck = &cache.k(li)[..old_len * kvd];
                let cv = &cache.v(li)[..old_len * kvd];
                let mut attn = vec![0f32; n * qd];
                {
                    let visible_keys = old_len - excluded.iter().filter(|e| **e).count() + n;
                    let _s = OpSpan::begin(
                        "attention",
                        l,
                        &[n as u64, visible_keys as u64, nh as u64, hd as u64],
                        "F32",
                    )
                    .cost(
                        (2 * visible_keys * kvd * 4 + n * qd * 4) as u64,
                        (n * qd * 4) as u64,
                        (4 * n * visible_keys * qd) as u64,
                    );
                    let mask = match &emask {
                        Some(m) => AttnMask::Explicit(m),
                        None => req.mask,
                    };
                    let positions = &positions;
                    let (q, k, v, excluded, cache_pos) = (&q, &k, &v, &excluded, &cache_pos);
                    // Cache slots every row sees (no per-row position test needed): all but
                    // the slots this pass rewrites, for masks that do not look at positions.
                    let all_cache: Option<Vec<u32>> =
                        matches!(mask, AttnMask::Bidirectional | AttnMask::Explicit(_)).then(
                            || {
                                (0..old_len as u32)
                                    .filter(|&s| !excluded[s as usize])
                                    .collect()
                            },
                        );
                    let all_cache = &all_cache;
                    // One task per (row, KV group): the group's query heads share every key/value
                    // row they read (GQA), and the visible-key list is built once.
                    attn.par_chunks_mut(group * hd)
                        .enumerate()
                        .for_each(|(idx, out)| {
                            let (i, g) = (idx / nkv, idx % nkv);
                            let pi = positions[i];
                            let mut keys: Vec<u32> = match all_cache {
                                Some(c) => {
                                    let mut v = Vec::with_capacity(c.len() + n);
                                    v.extend_from_slice(c);
                                    v
                                }
                                None => (0..old_len)
                                    .filter(|&s| !excluded[s] && mask.by_pos(pi, cache_pos[s]))
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
                            let rows = KvRows {
                                cache_k: ck,
                                cache_v: cv,
                                new_k: k,
                                new_v: v,
                                split: old_len as u32,
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
                }
                // Deferred cache write for this layer (after every row has read the old cache).
                for (i, s) in slots.iter().enumerate() {
                    if let Some(s) = *s {
                        cache.write(
                            li,
                            s,
                            positions[i],
                            &k[i * kvd..(i + 1) * kvd],
                            &v[i * kvd..(i + 1) * kvd],
                        );
                    }
                }
                let mut aq = None;
                let o = layer.wo.forward(&attn, &mut aq, n, l, "attn_output")?;
                x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

                let h = rmsnorm(&x, &layer.ffn_norm, c.rms_eps, &all_rows, l);
                let mut gu = layer.gate_up.forward(&h, n, l, "ffn_gate_up")?.into_iter();
                let (mut g, u) = match (gu.next(), gu.next()) {
                    (Some(g), Some(u)) => (g, u),
                    _ => {
                        return Err(ModelError::Other(
                            "gate/up projection returned too few outputs".into(),
                        ))
                    }
                };
                {
                    let _s = OpSpan::begin("silu_mul", l, &[n as u64, c.ffn as u64], "F32").cost(
                        (2 * n * c.ffn * 4) as u64,
                        (n * c.ffn * 4) as u64,
                        (5 * n * c.ffn) as u64,
                    );
                    g.iter_mut()
                        .zip(&u)
                        .for_each(|(a, b)| *a = *a / (1.0 + (-*a).exp()) * b);
                }
                let mut gq = None;
                let dn = layer.w_down.forward(&g, &mut gq, n, l, "ffn_down")?;
                x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
                if let Some(e) = exit.filter(|e| e.layer == li) {
                    let keep = (e.keep)(&x, &alive);
                    if keep.len() != n || !keep.iter().any(|k| *k) {
                        return Err(ModelError::BadRequest(format!(
                            "early exit must keep at least one of {n} rows (got {} flags)",
                            keep.len()
                        )));
                    }
                    if keep.iter().any(|k| !k) {
                        let idx: Vec<usize> = (0..n).filter(|&i| keep[i]).collect();
                        let _s =
                            OpSpan::begin("early_exit", l, &[n as u64, idx.len() as u64], "F32");
                        let pick = |v: &[f32], w: usize| -> Vec<f32> {
                            idx.iter()
                                .flat_map(|&i| v[i * w..(i + 1) * w].iter().copied())
                                .collect()
                        };
                        x = pick(&x, d);
                        cos = pick(&cos, half);
                        sin = pick(&sin, half);
                        positions = idx.iter().map(|&i| positions[i]).collect();
                        slots = idx.iter().map(|&i| slots[i]).collect();
                        if let Some(m) = &emask {
                            emask = Some(
                                idx.iter()
                                    .flat_map(|&a| idx.iter().map(move |&b| m[a * n + b]))
                                    .collect(),
                            );
                        }
                        let mut local = vec![usize::MAX; n];
                        for (new, &old) in idx.iter().enumerate() {
                            local[old] = new;
                        }
                        logit_rows = logit_rows
                            .iter()
                            .map(|&r| local[r])
                            .filter(|&r| r != usize::MAX)
                            .collect();
                        alive = idx.iter().map(|&i| alive[i]).collect();
                        n = idx.len();
                        all_rows = (0..n).collect();
                    }
                }
            }

            if stop.is_some() {
                return Ok(ForwardOutput {
                    logits: logit_rows
                        .iter()
                        .flat_map(|&r| x[r * d..(r + 1) * d].iter().copied())
                        .collect(),
                    rows: logit_rows.iter().map(|&r| alive[r]).collect(),
                    vocab: d,
                    features: vec![],
                });
            }
            let vocab = c.vocab;
            let m = logit_rows.len();
            let out_rows: Vec<usize> = logit_rows.iter().map(|&r| alive[r]).collect();
            let h = if m == 0 {
                vec![]
            } else {
                rmsnorm(&x, &w.final_norm, c.rms_eps, &logit_rows, -1)
            };
            let mut hq = None;
            let mut logits = match (&w.lm_head, &rx) {
                (Some(head), _) if m > 0 => head.forward(&h, &mut hq, m, -1, "lm_head")?,
                (Some(_), _) => vec![],
                // A streamed head arrives in row chunks, each multiplied as it lands (the read
                // of chunk j + 1 overlaps it). Every chunk is received, even when no row needs
                // logits: the prefetch thread must finish its pass.
                (None, Some((st, rx))) => {
                    let rows = c.embedding_rows();
                    let mut out = vec![0f32; m * rows];
                    let mut done = 0;
                    while done < rows {
                        match st.next(rx)? {
                            Unit::HeadRows(r0, part) => {
                                let n = part.rows();
                                if m > 0 {
                                    let y = part.forward(&h, &mut hq, m, -1, "lm_head")?;
                                    for (o, yr) in out.chunks_exact_mut(rows).zip(y.chunks_exact(n))
                                    {
                                        o[r0..r0 + n].copy_from_slice(yr);
                                    }
                                }
                                done += n;
                            }
                            Unit::Layer(_) => {
                                return Err(ModelError::Other("weight stream out of order".into()))
                            }
                        }
                    }
                    out
                }
                (None, None) => return Err(ModelError::Other("the LM head is not loaded".into())),
            };
            if m == 0 {
                return Ok(ForwardOutput {
                    logits: vec![],
                    rows: vec![],
                    vocab,
                    features: vec![],
                });
            }
            if let Some(map) = &w.vocab_map {
                logits = map.scatter(&logits, vocab);
            }
            Ok(ForwardOutput {
                logits,
                rows: out_rows,
                vocab,
                features: h,
            })
        })
    }

    /// Logit-lens scores of `toks` from one residual-stream row `h` (any layer): the final
    /// RMSNorm, then the dot product with each token's embedding row — the model's exact logit
    /// when the head is tied to the embedding, a proxy otherwise. `d` MACs per token.
    pub fn lens_logits(&self, h: &[f32], toks: &[u32]) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let w = &self.weights;
        if h.len() != c.d_model {
            return Err(ModelError::BadRequest(format!(
                "hidden row of {} values, model width {}",
                h.len(),
                c.d_model
            )));
        }
        let ss: f64 = h.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        let inv = (1.0 / ((ss / c.d_model as f64) + c.rms_eps).sqrt()) as f32;
        let hn: Vec<f32> = h
            .iter()
            .zip(&w.final_norm)
            .map(|(v, g)| v * inv * g)
            .collect();
        let mut e = vec![0f32; c.d_model];
        toks.iter()
            .map(|&t| {
                if t as usize >= c.vocab {
                    return Err(ModelError::BadToken {
                        id: t,
                        vocab: c.vocab,
                    });
                }
                let r = w.vocab_map.as_ref().map_or(t, |m| m.row(t));
                w.embed.lookup(r, &mut e)?;
                Ok(dot(&hn, &e))
            })
            .collect()
    }
}
