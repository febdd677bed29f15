//! The sequence being denoised: the prompt, then one [`Cell`] per answer position.
//!
//! The tokens are one contiguous vector, prompt then answer, because every forward pass takes
//! a slice of it; everything else the decoder knows about an answer position lives in its
//! cell. The transitions are the methods below, and they keep these invariants:
//!
//! * a cell is `Invisible` until the dense lane commits it ([`Canvas::commit`]);
//! * `dirty`: committed since its KV row was last computed with its token ([`Canvas::commit`]
//!   sets it, [`Canvas::mark_clean`] clears it); dirty cells are neither probed nor promoted;
//! * `Stable` is set only by [`Canvas::promote_stable`] (a sure, clean, non-speculative
//!   commit), a probe's verdict ([`Canvas::apply_verdict`]) and [`Canvas::finish`]; only
//!   `Visible` cells are probed.

use super::StepView;
use crate::revision::Verdict;
use crate::window::{self, MultiBlock, TokenState, Window};

/// What the decoder knows about one answer position besides its token.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cell {
    pub state: TokenState,
    /// Committed since its KV row was computed with its token.
    pub dirty: bool,
    /// Committed ahead of its block (multi-block speculation); joins the block when the block
    /// becomes the current one.
    pub speculative: bool,
    /// Final once its KV row holds it: without revision every commit, with revision one
    /// committed at `Revision::stable_on_commit` confidence or more (not worth a probe).
    pub sure: bool,
    /// Sparse-lane probes so far.
    pub probes: u8,
    /// Its token was changed by revision at least once.
    pub revised: bool,
}

impl Cell {
    const MASKED: Cell = Cell {
        state: TokenState::Invisible,
        dirty: false,
        speculative: false,
        sure: false,
        probes: 0,
        revised: false,
    };
}

/// Prompt and answer tokens, and a [`Cell`] per answer position.
pub(super) struct Canvas {
    /// Prompt then answer (absolute positions; forward passes slice it).
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Answer positions (index = absolute position − `prompt_len`).
    cells: Vec<Cell>,
    mask: u32,
}

impl Canvas {
    /// The prompt followed by `gen` mask tokens.
    pub fn new(prompt: &[u32], gen: usize, mask: u32) -> Self {
        let mut tokens = prompt.to_vec();
        tokens.extend(std::iter::repeat_n(mask, gen));
        Self {
            tokens,
            prompt_len: prompt.len(),
            cells: vec![Cell::MASKED; gen],
            mask,
        }
    }
    /// The whole sequence (absolute positions).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }
    pub fn mask(&self) -> u32 {
        self.mask
    }
    /// The answer tokens.
    pub fn answer(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
    fn cell(&self, i: usize) -> &Cell {
        &self.cells[i - self.prompt_len]
    }
    fn cell_mut(&mut self, i: usize) -> &mut Cell {
        &mut self.cells[i - self.prompt_len]
    }
    /// Whether absolute position `i` still holds the mask token.
    pub fn is_masked(&self, i: usize) -> bool {
        self.tokens[i] == self.mask
    }

    /// The dense lane's next window over answer positions (`None`: nothing left masked).
    pub fn window(&self, block: usize, multi: Option<&MultiBlock>) -> Option<Window> {
        let c = &self.cells;
        window::plan_by(c.len(), |a| c[a].state, |a| c[a].dirty, block, multi)
    }
    /// A new current block over answer positions `[a0, a1)`: its speculations join it (block
    /// commit semantics); returns how many of its positions are masked.
    pub fn start_block(&mut self, a0: usize, a1: usize) -> usize {
        let block = &mut self.cells[a0..a1];
        block.iter_mut().for_each(|c| c.speculative = false);
        block
            .iter()
            .filter(|c| c.state == TokenState::Invisible)
            .count()
    }
    /// The first absolute position committed after its KV row was computed (`len()` if none).
    pub fn first_dirty(&self) -> usize {
        let p = self.prompt_len;
        self.cells
            .iter()
            .position(|c| c.dirty)
            .map_or(self.len(), |a| p + a)
    }
    /// The sparse lane's probes: `Visible`, clean positions before absolute position `end`,
    /// the least probed first (ties to the left), at most `max_rows`, in position order.
    pub fn probe_candidates(&self, end: usize, max_rows: usize) -> Vec<usize> {
        let p = self.prompt_len;
        let mut v: Vec<usize> = (p..end.max(p))
            .filter(|&i| {
                let c = self.cell(i);
                c.state == TokenState::Visible && !c.dirty
            })
            .collect();
        v.sort_by_key(|&i| (self.cell(i).probes, i));
        v.truncate(max_rows);
        v.sort_unstable();
        v
    }
    /// The dense pass computed rows `row0..` into `slots`: the answer rows written with their
    /// real token have clean KV now (every computed row when the cache keeps no slot = position
    /// mapping, i.e. without the dual cache).
    pub fn mark_clean(&mut self, row0: usize, slots: &[Option<usize>], dual: bool) {
        let p = self.prompt_len;
        for (r, slot) in (row0..).zip(slots) {
            if r >= p && (slot.is_some() || !dual) {
                self.cell_mut(r).dirty = false;
            }
        }
    }
    /// A probe's verdict on absolute position `i`; returns whether its token was revised.
    pub fn apply_verdict(&mut self, i: usize, verdict: Verdict) -> bool {
        let revised = match verdict {
            Verdict::Stable => {
                self.cell_mut(i).state = TokenState::Stable;
                false
            }
            Verdict::Revise(y) => {
                self.tokens[i] = y;
                let c = self.cell_mut(i);
                c.revised = true;
                c.sure = false;
                true
            }
            Verdict::Keep => false,
        };
        let c = self.cell_mut(i);
        c.probes = c.probes.saturating_add(1);
        revised
    }
    /// The probes absolute position `i` has had.
    pub fn probes(&self, i: usize) -> u8 {
        self.cell(i).probes
    }
    /// The dense lane commits `tok` at absolute position `i`.
    pub fn commit(&mut self, i: usize, tok: u32, sure: bool, speculative: bool) {
        self.tokens[i] = tok;
        let c = self.cell_mut(i);
        c.sure = sure;
        c.state = TokenState::Visible;
        c.dirty = true;
        c.speculative = speculative;
    }
    /// `Visible → Stable` for every sure commit whose KV row holds it, outside speculation.
    pub fn promote_stable(&mut self) {
        for c in &mut self.cells {
            if c.sure && c.state == TokenState::Visible && !c.dirty && !c.speculative {
                c.state = TokenState::Stable;
            }
        }
    }
    /// Everything is final.
    pub fn finish(&mut self) {
        self.cells
            .iter_mut()
            .for_each(|c| c.state = TokenState::Stable);
    }
    /// Show the answer to an observer.
    pub fn show(&self, observe: &mut dyn FnMut(&StepView)) {
        let states: Vec<TokenState> = self.cells.iter().map(|c| c.state).collect();
        let revised: Vec<bool> = self.cells.iter().map(|c| c.revised).collect();
        observe(&StepView {
            tokens: self.answer(),
            states: &states,
            revised: &revised,
            mask_id: self.mask,
        });
    }
}
