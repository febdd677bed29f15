//! Request checks and the pass's cache plan.
//!
//! Invariants: every check runs before the cache is touched, in a fixed order (batch shape,
//! context length, mask, cache shape, logit rows, token ids, KV slots, then the cache's own
//! write plan), so a refused request leaves the cache as it was and always reports the same
//! error; only [`CacheRead::plan`] grows the cache.

use super::{AttnMask, ForwardRequest, KvWrite, LogitRows};
use crate::{ModelConfig, ModelError};
use llada_runtime::KvCache;

/// A checked request: the rows that get logits and the cache slot each row writes.
pub(super) struct Checked {
    pub logit_rows: Vec<usize>,
    pub slots: Vec<Option<usize>>,
}

/// Check `req` against the model `c` and `cache`.
pub(super) fn validate(
    req: &ForwardRequest,
    c: &ModelConfig,
    cache: &KvCache,
) -> Result<Checked, ModelError> {
    let n = req.tokens.len();
    check_shape(req, c, cache)?;
    let logit_rows = logit_rows(req.logits, n)?;
    if let Some(&t) = req.tokens.iter().find(|&&t| t as usize >= c.vocab) {
        return Err(ModelError::BadToken {
            id: t,
            vocab: c.vocab,
        });
    }
    let slots = kv_slots(req.kv_write, n, cache.len())?;
    Ok(Checked { logit_rows, slots })
}

/// The batch is non-empty with one position per token, inside the context; the mask fits the
/// batch; the cache has the model's shape.
fn check_shape(req: &ForwardRequest, c: &ModelConfig, cache: &KvCache) -> Result<(), ModelError> {
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
    Ok(())
}

/// The batch rows (of `n`) whose logits are computed.
fn logit_rows(rows: LogitRows, n: usize) -> Result<Vec<usize>, ModelError> {
    Ok(match rows {
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
    })
}

/// Where each of the `n` rows writes its K/V (`old_len`: the cache's length before the pass).
fn kv_slots(w: KvWrite, n: usize, old_len: usize) -> Result<Vec<Option<usize>>, ModelError> {
    Ok(match w {
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
    })
}

/// The cache as the pass reads it: its valid slots before the pass, those the pass rewrites
/// (read from the batch instead of the stale cache) and every slot's position.
pub(super) struct CacheRead {
    pub old_len: usize,
    /// `excluded[s]`: slot `s < old_len` is rewritten by this pass.
    pub excluded: Vec<bool>,
    pub cache_pos: Vec<u32>,
}

impl CacheRead {
    /// Check the pass's writes `slots` against the cache without touching it.
    pub fn check(cache: &KvCache, slots: &[Option<usize>]) -> Result<(), ModelError> {
        let written: Vec<usize> = slots.iter().flatten().copied().collect();
        cache.plan_write(&written)?;
        Ok(())
    }

    /// Check the pass's writes `slots` against the cache (no hole past its end), then grow it
    /// to hold them.
    pub fn plan(cache: &mut KvCache, slots: &[Option<usize>]) -> Result<Self, ModelError> {
        let old_len = cache.len();
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
        Ok(Self {
            old_len,
            excluded,
            cache_pos,
        })
    }
}
