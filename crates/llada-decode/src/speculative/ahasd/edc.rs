//! EDC, entropy-history drafting control: whether the draft lane keeps drafting ahead of the
//! verifier (the module doc of [`super`] has the rule).

/// Entropy level of a batch: `floor(min(H, 10) / 10 · 7.99)`.
pub fn entropy_level(h: f32) -> u8 {
    (h.clamp(0.0, 10.0) / 10.0 * 7.99).floor() as u8
}

/// The EDC predictor.
#[derive(Debug, Clone)]
pub struct Edc {
    table: [u8; 512],
    ring: [u8; 8],
    committed: [u8; 8],
    head: usize,
    committed_head: usize,
    unverified: u8,
}

impl Default for Edc {
    fn default() -> Self {
        Self {
            table: [2; 512],
            ring: [0; 8],
            committed: [0; 8],
            head: 0,
            committed_head: 0,
            unverified: 0,
        }
    }
}

impl Edc {
    fn index(&self) -> usize {
        // Ring entries in age order: newest first.
        let age = |k: usize| self.ring[(self.head + 8 - 1 - k) % 8] as usize;
        let upper = (0..4).map(age).sum::<usize>() / 4;
        let lower = (4..8).map(age).sum::<usize>() / 4;
        (upper << 6) | (lower << 3) | self.unverified.min(7) as usize
    }
    /// Keep drafting?
    pub fn should_draft(&self) -> bool {
        self.table[self.index()] >= 2
    }
    /// A batch was drafted with mean entropy `h`; returns the table index to credit later.
    pub fn on_draft(&mut self, h: f32) -> usize {
        let idx = self.index();
        self.ring[self.head] = entropy_level(h);
        self.head = (self.head + 1) % 8;
        self.unverified = (self.unverified + 1).min(7);
        idx
    }
    /// A batch drafted at table index `idx` was verified.
    pub fn on_verify(&mut self, idx: usize, fully_accepted: bool) {
        self.unverified = self.unverified.saturating_sub(1);
        if fully_accepted {
            self.table[idx] = (self.table[idx] + 1).min(3);
            self.committed = self.ring;
            self.committed_head = self.head;
        } else {
            self.table[idx] = self.table[idx].saturating_sub(1);
            self.ring = self.committed;
            self.head = self.committed_head;
            self.unverified = 0;
        }
    }
    pub fn counter(&self, idx: usize) -> u8 {
        self.table[idx]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_levels() {
        assert_eq!(entropy_level(0.0), 0);
        assert_eq!(entropy_level(5.0), 3);
        assert_eq!(entropy_level(9.99), 7);
        assert_eq!(entropy_level(42.0), 7);
    }

    #[test]
    fn edc_counter_table() {
        let mut e = Edc::default();
        assert!(e.should_draft()); // weakly taken
        let i = e.on_draft(9.5);
        e.on_verify(i, false);
        // One failure at this index: 2 → 1, and drafting stops there.
        assert_eq!(e.counter(i), 1);
        assert!(!e.should_draft() || e.index() != i);
        // Successes saturate at 3.
        let mut e = Edc::default();
        for _ in 0..5 {
            let i = e.on_draft(0.5);
            e.on_verify(i, true);
        }
        assert!(e.should_draft());
        // A rejection rolls the history back to the committed ring.
        let before = (e.ring, e.head);
        let j = e.on_draft(9.9);
        assert_ne!((e.ring, e.head), before);
        e.on_verify(j, false);
        assert_eq!((e.ring, e.head), before);
        assert_eq!(e.unverified, 0);
    }
}
