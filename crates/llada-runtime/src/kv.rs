//! KV cache.
//!
//! Invariants: slots `0..len()` hold valid K/V rows for every layer, each with the position it
//! was computed at; a forward pass may overwrite any valid slot (token revision) or extend the
//! cache contiguously; `truncate` drops slots from the end (speculative rollback). Rows are
//! stored slot-major: `k[layer][slot * kv_dim + head * head_dim + d]`.

/// Errors from cache bookkeeping.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KvError {
    #[error("KV write to slot {slot} would leave a hole (cache holds {len} slots)")]
    Hole { slot: usize, len: usize },
    #[error("KV cache capacity {capacity} exceeded (need {need} slots); the prompt plus generation is longer than the context")]
    Capacity { need: usize, capacity: usize },
    #[error("KV slot {slot} written twice in one pass")]
    Duplicate { slot: usize },
}

/// Per-layer K and V rows for a growing set of slots. `Clone` gives a snapshot (the sparse lane
/// computes on one while the dense lane writes the live cache).
#[derive(Clone)]
pub struct KvCache {
    n_layers: usize,
    kv_dim: usize,
    capacity: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    pos: Vec<u32>,
}

impl KvCache {
    /// An empty cache for `n_layers` layers of `kv_dim = n_kv_heads · head_dim` floats per row,
    /// holding at most `capacity` slots (memory grows on demand).
    pub fn new(n_layers: usize, kv_dim: usize, capacity: usize) -> Self {
        Self {
            n_layers,
            kv_dim,
            capacity,
            len: 0,
            k: vec![Vec::new(); n_layers],
            v: vec![Vec::new(); n_layers],
            pos: Vec::new(),
        }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }
    pub fn n_layers(&self) -> usize {
        self.n_layers
    }
    /// Positions of the valid slots.
    pub fn positions(&self) -> &[u32] {
        &self.pos[..self.len]
    }
    /// Drop every slot at index `>= len` (rollback).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.pos.truncate(self.len);
    }
    /// Drop everything.
    pub fn clear(&mut self) {
        self.truncate(0)
    }
    /// K rows of a layer for valid slots.
    pub fn k(&self, layer: usize) -> &[f32] {
        &self.k[layer][..self.len * self.kv_dim]
    }
    /// V rows of a layer for valid slots.
    pub fn v(&self, layer: usize) -> &[f32] {
        &self.v[layer][..self.len * self.kv_dim]
    }
    /// Bytes held by valid rows.
    pub fn bytes(&self) -> usize {
        self.len * self.kv_dim * 4 * 2 * self.n_layers
    }

    /// Check a set of slots a pass will write and return the cache length after the pass.
    /// Slots below `len()` are overwritten; slots at or above must extend the cache contiguously.
    pub fn plan_write(&self, slots: &[usize]) -> Result<usize, KvError> {
        let mut sorted: Vec<usize> = slots.to_vec();
        sorted.sort_unstable();
        let mut new_len = self.len;
        for (i, &s) in sorted.iter().enumerate() {
            if i > 0 && sorted[i - 1] == s {
                return Err(KvError::Duplicate { slot: s });
            }
            if s > new_len {
                return Err(KvError::Hole {
                    slot: s,
                    len: new_len,
                });
            }
            if s == new_len {
                new_len += 1;
            }
        }
        if new_len > self.capacity {
            return Err(KvError::Capacity {
                need: new_len,
                capacity: self.capacity,
            });
        }
        Ok(new_len)
    }

    /// Make room for `new_len` slots (after [`KvCache::plan_write`]) and mark them valid.
    pub fn grow_to(&mut self, new_len: usize) {
        if new_len <= self.len {
            return;
        }
        let need = new_len * self.kv_dim;
        for l in 0..self.n_layers {
            if self.k[l].len() < need {
                let cap = need
                    .max(self.k[l].len() * 2)
                    .min(self.capacity * self.kv_dim);
                self.k[l].resize(cap, 0.0);
                self.v[l].resize(cap, 0.0);
            }
        }
        self.pos.resize(new_len, 0);
        self.len = new_len;
    }

    /// Write one row of layer `layer` at `slot` (must be `< len()`).
    pub fn write(&mut self, layer: usize, slot: usize, pos: u32, k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        assert!(slot < self.len, "KV write past the planned length");
        self.k[layer][slot * d..(slot + 1) * d].copy_from_slice(k);
        self.v[layer][slot * d..(slot + 1) * d].copy_from_slice(v);
        self.pos[slot] = pos;
    }
}

impl KvCache {
    /// Move slot `from` to slot `to` (both `< len()`), every layer: compacts the accepted path
    /// of a verified token tree before the rejected rows are truncated.
    pub fn move_slot(&mut self, from: usize, to: usize) {
        assert!(
            from < self.len && to < self.len,
            "KV move outside the cache"
        );
        if from == to {
            return;
        }
        let d = self.kv_dim;
        for l in 0..self.n_layers {
            self.k[l].copy_within(from * d..(from + 1) * d, to * d);
            self.v[l].copy_within(from * d..(from + 1) * d, to * d);
        }
        self.pos[to] = self.pos[from];
    }

    /// Whether `other` holds the same slots: length, positions and every layer's K/V rows.
    pub fn same_rows(&self, other: &KvCache) -> bool {
        let n = self.len * self.kv_dim;
        self.len == other.len
            && self.kv_dim == other.kv_dim
            && self.n_layers == other.n_layers
            && self.pos[..self.len] == other.pos[..other.len]
            && (0..self.n_layers)
                .all(|l| self.k[l][..n] == other.k[l][..n] && self.v[l][..n] == other.v[l][..n])
    }

    /// Copy slot `slot` (every layer, and its position) from `other`, a cache of the same shape
    /// whose `len()` covers it; grows `self` if needed. This is the deferred merge of rows
    /// refreshed on a snapshot.
    pub fn copy_slot_from(&mut self, other: &KvCache, slot: usize) -> Result<(), KvError> {
        if other.kv_dim != self.kv_dim || other.n_layers != self.n_layers || slot >= other.len {
            return Err(KvError::Hole {
                slot,
                len: other.len,
            });
        }
        let new_len = self.plan_write(&[slot])?;
        self.grow_to(new_len);
        let d = self.kv_dim;
        for l in 0..self.n_layers {
            let (k, v) = (
                &other.k[l][slot * d..(slot + 1) * d],
                &other.v[l][slot * d..(slot + 1) * d],
            );
            self.k[l][slot * d..(slot + 1) * d].copy_from_slice(k);
            self.v[l][slot * d..(slot + 1) * d].copy_from_slice(v);
        }
        self.pos[slot] = other.pos[slot];
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_overwrite_truncate() {
        let mut c = KvCache::new(2, 4, 8);
        assert_eq!(c.plan_write(&[0, 1, 2]), Ok(3));
        c.grow_to(3);
        for s in 0..3 {
            for l in 0..2 {
                c.write(l, s, s as u32, &[s as f32; 4], &[-(s as f32); 4]);
            }
        }
        assert_eq!(c.positions(), &[0, 1, 2]);
        // Revision: overwrite slot 1 and extend with slot 3 in one pass.
        assert_eq!(c.plan_write(&[1, 3]), Ok(4));
        assert_eq!(c.plan_write(&[5]), Err(KvError::Hole { slot: 5, len: 3 }));
        assert_eq!(c.plan_write(&[1, 1]), Err(KvError::Duplicate { slot: 1 }));
        c.grow_to(4);
        c.write(0, 1, 7, &[9.0; 4], &[9.0; 4]);
        assert_eq!(&c.k(0)[4..8], &[9.0; 4]);
        assert_eq!(c.positions()[1], 7);
        // Deferred merge from a snapshot.
        let mut snap = c.clone();
        snap.write(1, 2, 11, &[5.0; 4], &[6.0; 4]);
        assert_eq!(c.k(1)[8], 2.0);
        c.copy_slot_from(&snap, 2).unwrap();
        assert_eq!((c.k(1)[8], c.v(1)[11], c.positions()[2]), (5.0, 6.0, 11));
        assert!(c.copy_slot_from(&snap, 7).is_err());
        // Rollback.
        c.truncate(2);
        assert_eq!(c.len(), 2);
        assert_eq!(c.k(1).len(), 8);
        assert!(matches!(
            c.plan_write(&(2..9).collect::<Vec<_>>()),
            Err(KvError::Capacity {
                need: 9,
                capacity: 8
            })
        ));
    }
}
