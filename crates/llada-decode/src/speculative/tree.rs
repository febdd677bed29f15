//! Token trees: the draft's proposals, their attention mask, and Lever's cost-aware growth.
//!
//! Nodes are stored in topological order (a parent before its children). Node `i` of depth `d`
//! sits at position `base + d`; it attends to its ancestors and itself only.

/// A draft token tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DraftTree {
    pub tokens: Vec<u32>,
    /// Parent node (`None`: a child of the root, i.e. of the last committed token).
    pub parent: Vec<Option<usize>>,
    /// Depth (1 for the root's children).
    pub depth: Vec<u32>,
    /// Draft probability of the node's token given its parent.
    pub q: Vec<f32>,
    /// Product of the (calibrated) acceptance estimates along the path: the expected number of
    /// times this node is accepted.
    pub path_prob: Vec<f32>,
}

impl DraftTree {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
    /// The tree restricted to `keep` (ascending node indices, closed under parents), with the
    /// same tokens, draft probabilities and path estimates.
    pub fn subtree(&self, keep: &[usize]) -> DraftTree {
        let mut t = DraftTree::default();
        let mut map = vec![usize::MAX; self.len()];
        for &i in keep {
            let p = self.parent[i].map(|p| map[p]);
            map[i] = t.push(p, self.tokens[i], self.q[i], 1.0);
            t.path_prob[map[i]] = self.path_prob[i];
        }
        t
    }
    /// Add a node; returns its index. `parent` must already exist.
    pub fn push(&mut self, parent: Option<usize>, token: u32, q: f32, accept: f32) -> usize {
        let (depth, pp) = match parent {
            Some(p) => (self.depth[p] + 1, self.path_prob[p]),
            None => (1, 1.0),
        };
        self.tokens.push(token);
        self.parent.push(parent);
        self.depth.push(depth);
        self.q.push(q);
        self.path_prob.push(pp * accept);
        self.tokens.len() - 1
    }
    /// Children of `node` (`None`: of the root), in insertion order.
    pub fn children(&self, node: Option<usize>) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter(move |&i| self.parent[i] == node)
    }
    /// Tokens from the root to `node` inclusive.
    pub fn path(&self, node: usize) -> Vec<usize> {
        let mut v = vec![node];
        let mut n = node;
        while let Some(p) = self.parent[n] {
            v.push(p);
            n = p;
        }
        v.reverse();
        v
    }
    /// The tokens before verify row `row` (0 = the root, `j + 1` = node `j`), at most the last
    /// `window` of them: `ctx` (the committed context, ending with the root's token) and the
    /// draft path down to the row's node. What the repetition penalty looks back over.
    pub fn history(&self, ctx: &[u32], row: usize, window: usize) -> Vec<u32> {
        if window == 0 {
            return vec![]; // no penalty: nothing to look back over, no path to walk
        }
        let path = match row {
            0 => vec![],
            r => self.path(r - 1),
        };
        let from_ctx = window.saturating_sub(path.len()).min(ctx.len());
        let mut h = ctx[ctx.len() - from_ctx..].to_vec();
        h.extend(path.iter().map(|&j| self.tokens[j]));
        let cut = h.len().saturating_sub(window);
        h.drain(..cut);
        h
    }
    /// `i` is an ancestor of `j` or `j` itself.
    pub fn is_ancestor_or_self(&self, i: usize, j: usize) -> bool {
        let mut n = Some(j);
        while let Some(k) = n {
            if k == i {
                return true;
            }
            n = self.parent[k];
        }
        false
    }
    /// Row-major visibility of a verify pass whose rows are `[root, node 0, node 1, …]`: the
    /// root row sees itself; node `j` sees the root, its ancestors and itself.
    pub fn attention_mask(&self) -> Vec<bool> {
        let n = self.len() + 1;
        let mut m = vec![false; n * n];
        m[0] = true;
        for j in 0..self.len() {
            let r = j + 1;
            m[r * n] = true;
            for i in 0..self.len() {
                if self.is_ancestor_or_self(i, j) {
                    m[r * n + i + 1] = true;
                }
            }
        }
        m
    }
    /// Expected tokens accepted from this tree (sum of path acceptance probabilities).
    pub fn expected_accepted(&self) -> f32 {
        self.path_prob.iter().sum()
    }
}

/// Maps a draft probability to the acceptance rate measured so far (Lever's calibration):
/// ten probability bins with accepted / proposed counts and a prior of the raw probability.
#[derive(Debug, Clone)]
pub struct Calibration {
    proposed: [f64; 10],
    accepted: [f64; 10],
}

impl Default for Calibration {
    fn default() -> Self {
        Self {
            proposed: [0.0; 10],
            accepted: [0.0; 10],
        }
    }
}

impl Calibration {
    fn bin(q: f32) -> usize {
        ((q.clamp(0.0, 1.0) * 10.0) as usize).min(9)
    }
    /// Estimated probability that the target accepts a node with draft probability `q`.
    pub fn accept(&self, q: f32) -> f32 {
        let b = Self::bin(q);
        // Two pseudo-observations at the raw probability keep early estimates sane.
        ((self.accepted[b] + 2.0 * q as f64) / (self.proposed[b] + 2.0)) as f32
    }
    /// Record one verified node.
    pub fn observe(&mut self, q: f32, accepted: bool) {
        let b = Self::bin(q);
        self.proposed[b] += 1.0;
        self.accepted[b] += f64::from(u8::from(accepted));
    }
}

/// Cost of one step with a tree of `n` tokens: the verify pass `io_s + n · token_s` (Lever's
/// cost model: the weight I/O of a pass is paid once, compute grows with the rows) plus the
/// draft's proposals, `draft_s` each (one for the root and one per node it expands; 0 for a
/// drafter without a model, or on hardware of its own).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct CostModel {
    pub io_s: f64,
    pub token_s: f64,
    pub draft_s: f64,
}

impl CostModel {
    /// A run's model before its first measured passes: one pass costs what 16 rows cost.
    pub const START: CostModel = CostModel {
        io_s: 1e-2,
        token_s: 1e-2 / 16.0,
        draft_s: 0.0,
    };
    pub fn pass(&self, n: usize) -> f64 {
        self.io_s + n as f64 * self.token_s
    }
    /// A whole step: the pass and `n + 1` proposals.
    pub fn step(&self, n: usize) -> f64 {
        self.pass(n) + (n + 1) as f64 * self.draft_s
    }
    /// Grow the tree by a candidate of path probability `a` iff it raises the rate
    /// `(1 + E) / step(n)`: `(1 + E + a) / step(n + 1) > (1 + E) / step(n)`, i.e.
    /// `a > (1 + E) · (token_s + draft_s) / step(n)`.
    pub fn worth_adding(&self, expected: f64, n: usize, a: f64) -> bool {
        a > (1.0 + expected) * (self.token_s + self.draft_s) / self.step(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_tree() -> DraftTree {
        // root ─ a(0) ─ c(2)
        //      └ b(1) ─ d(3) ─ e(4)
        let mut t = DraftTree::default();
        let a = t.push(None, 10, 0.6, 0.6);
        let b = t.push(None, 11, 0.3, 0.3);
        t.push(Some(a), 12, 0.9, 0.9);
        let d = t.push(Some(b), 13, 0.5, 0.5);
        t.push(Some(d), 14, 0.5, 0.5);
        t
    }

    #[test]
    fn mask_follows_ancestry() {
        let t = sample_tree();
        let m = t.attention_mask();
        let n = 6;
        let sees = |r: usize, c: usize| m[r * n + c];
        // Root sees only itself; every node sees the root.
        assert!(sees(0, 0) && (1..n).all(|c| !sees(0, c)));
        assert!((1..n).all(|r| sees(r, 0)));
        // e (row 5) sees b, d, e but not a or c.
        assert!(sees(5, 2) && sees(5, 4) && sees(5, 5));
        assert!(!sees(5, 1) && !sees(5, 3));
        // c (row 3) sees a and itself only.
        assert!(sees(3, 1) && sees(3, 3) && !sees(3, 2) && !sees(3, 4));
        assert_eq!(t.path(4), vec![1, 3, 4]);
        assert_eq!(t.depth, vec![1, 1, 2, 2, 3]);
        assert!((t.path_prob[4] - 0.3 * 0.5 * 0.5).abs() < 1e-6);
        assert_eq!(t.children(None).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn cost_model_decides_growth() {
        // Weight I/O dominates: even unlikely nodes pay for themselves.
        let io = CostModel {
            io_s: 1.0,
            token_s: 0.001,
            draft_s: 0.0,
        };
        assert!(io.worth_adding(2.0, 10, 0.01));
        // Compute dominates: only likely nodes are worth a row.
        let cpu = CostModel {
            io_s: 0.001,
            token_s: 0.01,
            draft_s: 0.0,
        };
        assert!(!cpu.worth_adding(2.0, 10, 0.2));
        assert!(cpu.worth_adding(0.0, 1, 0.95));
        // A draft proposal that costs half a pass: a node must be likelier to pay for itself.
        let slow_draft = CostModel { draft_s: 0.5, ..io };
        // (threshold (0.001 + 0.5) / (1.001 + 2 · 0.5) ≈ 0.25 against 0.001 without the draft)
        assert!(io.worth_adding(0.0, 1, 0.2));
        assert!(!slow_draft.worth_adding(0.0, 1, 0.2));
        assert!(slow_draft.worth_adding(0.0, 1, 0.6));
    }

    #[test]
    fn calibration_learns_acceptance() {
        let mut c = Calibration::default();
        assert!((c.accept(0.85) - 0.85).abs() < 1e-6);
        for i in 0..100 {
            c.observe(0.85, i % 4 == 0);
        }
        assert!((c.accept(0.85) - 0.25).abs() < 0.05);
    }
}
