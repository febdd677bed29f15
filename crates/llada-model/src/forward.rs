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
//!
//! Several sequences can share a pass ([`Model::forward_many`], continuous batching): each
//! brings its own request and KV cache; norms, projections, the MLP and the head run over all
//! their rows at once (the weights are read once), attention runs per sequence over its own
//! cache. [`Model::forward`] is the one-sequence case of the same pass.
//!
//! The pass reads as its stages: `validate` the request, embed the rows and build their RoPE
//! tables (`batch`), then per layer a `block` — norm, `attention` (which writes the layer's
//! K/V), norm, `mlp` — with early exit between blocks (`batch`), and finally the `head` (final
//! norm, LM head for the logit rows). Streaming weights under a memory budget is plumbing
//! around the blocks: a streamed layer arrives from the prefetch threads and is computed like
//! a resident one.

mod attention;
mod batch;
mod head;
mod mlp;
mod ops;
mod validate;

use crate::store::Unit;
use crate::weights::Layer;
use crate::{Model, ModelError};
use batch::Batch;
use head::Stream;
use llada_kernels::vecops::dot;
use llada_runtime::trace::Tracer;
use llada_runtime::KvCache;
use validate::CacheRead;

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

/// One sequence's part of a shared pass ([`Model::forward_many`]).
pub struct SeqPass<'r, 'c> {
    pub req: ForwardRequest<'r>,
    pub cache: &'c mut KvCache,
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
        self.forward_one(req, cache, exit, None)
    }

    /// One pass over several sequences, each with its own request and cache (continuous
    /// batching): one output per sequence, in order. Every request is checked before any cache
    /// is touched; a sequence's outputs are those [`Model::forward`] would give it alone (the
    /// kernels compute each row independently of the others).
    pub fn forward_many(&self, seqs: &mut [SeqPass]) -> Result<Vec<ForwardOutput>, ModelError> {
        if seqs.is_empty() {
            return Ok(vec![]);
        }
        self.forward_impl(seqs, None, None)
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
        self.forward_one(req, cache, None, Some(layers))
    }

    fn forward_one(
        &self,
        req: &ForwardRequest,
        cache: &mut KvCache,
        exit: Option<&EarlyExit>,
        stop: Option<usize>,
    ) -> Result<ForwardOutput, ModelError> {
        let mut seqs = [SeqPass { req: *req, cache }];
        let mut out = self.forward_impl(&mut seqs, exit, stop)?;
        out.pop()
            .ok_or_else(|| ModelError::Other("a pass returned no output".into()))
    }

    /// The pass: checks, embedding, the layers (resident or streamed, early exit between
    /// them), then the head — or the residual stream when `stop` ends it after that many layers.
    fn forward_impl(
        &self,
        seqs: &mut [SeqPass],
        exit: Option<&EarlyExit>,
        stop: Option<usize>,
    ) -> Result<Vec<ForwardOutput>, ModelError> {
        let c = &self.config;
        let checked = seqs
            .iter()
            .map(|s| validate::validate(&s.req, c, s.cache))
            .collect::<Result<Vec<_>, _>>()?;
        for (s, ch) in seqs.iter().zip(&checked) {
            CacheRead::check(s.cache, &ch.slots)?;
        }
        let reqs: Vec<ForwardRequest> = seqs.iter().map(|s| s.req).collect();
        let mut parts = Vec::with_capacity(seqs.len());
        for ((s, ch), req) in seqs.iter_mut().zip(checked).zip(&reqs) {
            let kv = CacheRead::plan(s.cache, &ch.slots)?;
            parts.push((req, ch, kv));
        }
        Tracer::global().next_pass();
        let mut b = Batch::new(parts, c, &self.weights)?;
        // Streamed weights (memory budget): a prefetch thread builds the next streamed layer
        // while this one computes; resident layers are used in place.
        std::thread::scope(|scope| -> Result<Vec<ForwardOutput>, ModelError> {
            let mut stream: Option<Stream> = match stop {
                Some(_) => None,
                None => self.store.as_ref().map(|st| st.open(scope, c)),
            };
            for (li, slot) in self.weights.layers.iter().enumerate() {
                if stop == Some(li) {
                    break;
                }
                let staged;
                let layer: &Layer = match (slot, &mut stream) {
                    (Some(l), _) => l,
                    (None, Some(s)) => {
                        staged = match s.next()? {
                            Unit::Layer(l) => l,
                            Unit::HeadRows(..) => {
                                return Err(ModelError::Other("weight stream out of order".into()))
                            }
                        };
                        &staged
                    }
                    (None, None) => {
                        return Err(ModelError::Other(format!("layer {li} is not loaded")))
                    }
                };
                self.block(li, layer, &mut b, seqs)?;
                if let Some(e) = exit.filter(|e| e.layer == li) {
                    b.early_exit(e, li, c)?;
                }
            }
            match stop {
                Some(_) => Ok(b.hidden(c.d_model)),
                None => self.head(&b, stream.as_mut()),
            }
        })
    }

    /// One transformer layer on the live rows: `x += attention(norm(x))`, `x += mlp(norm(x))`.
    fn block(
        &self,
        li: usize,
        layer: &Layer,
        b: &mut Batch,
        seqs: &mut [SeqPass],
    ) -> Result<(), ModelError> {
        let (c, l) = (&self.config, li as i32);
        let h = ops::rmsnorm(&b.x, &layer.attn_norm, c.rms_eps, &b.rows, l);
        let o = attention::attention(layer, &h, li, b, c, seqs)?;
        b.x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let h = ops::rmsnorm(&b.x, &layer.ffn_norm, c.rms_eps, &b.rows, l);
        let dn = mlp::mlp(layer, &h, b.n, l, c)?;
        b.x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
        Ok(())
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
