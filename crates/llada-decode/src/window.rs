//! Token states and the dense lane's window planner (multi-block speculative decoding).
//!
//! Every generated position is in one [`TokenState`] (docs/diffusion.md has the diagram):
//!
//! * `Invisible` — still the mask token. → `Visible` when the dense lane commits it.
//! * `Visible` — a concrete token that may still change: the sparse lane re-scores it and may
//!   revise its identity (stays `Visible`) or confirm it (→ `Stable`).
//! * `Stable` — trusted: never revised, never given logits again (selective logits skipping),
//!   its KV row is long-lived prefix cache.
//!
//! The window is the set of positions the dense lane recomputes in one pass. With multi-block
//! decoding it starts at the first *dirty* position (masked, or committed since its KV row was
//! last computed) — *continuous sliding* — and, when the current block has fewer than
//! `lookahead` masked positions left, extends past the block end into future blocks
//! (*adaptive lookahead*). Its length is rounded up to one of [`WINDOW_SHAPES`], the static
//! shapes an accelerator graph would be compiled for; the difference is padding.

use serde::Serialize;

/// The window shapes (tokens) a static-shape accelerator would be compiled for.
pub const WINDOW_SHAPES: [usize; 6] = [8, 16, 32, 64, 128, 256];

/// Where a generated position stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenState {
    Invisible,
    Visible,
    Stable,
}

/// Multi-block speculative decoding options.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MultiBlock {
    /// The execution window's length: the most rows the dense lane recomputes per pass, and
    /// what it is kept at once lookahead starts (a shape, e.g. 16).
    pub window: usize,
    /// Extend into future blocks when the current block has fewer masked positions than this.
    pub lookahead: usize,
}

/// The smallest static shape holding `rows` (rows beyond the largest shape are not planned).
pub fn shape_for(rows: usize) -> usize {
    WINDOW_SHAPES
        .iter()
        .copied()
        .find(|&s| s >= rows)
        .unwrap_or(rows)
}

/// One dense-lane window over answer positions `[start, end)`, padded to `shape`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: usize,
    pub end: usize,
    /// The block being finished (block commit semantics).
    pub current_block: usize,
    pub shape: usize,
}

impl Window {
    pub fn rows(&self) -> usize {
        self.end - self.start
    }
    pub fn padding(&self) -> usize {
        self.shape - self.rows()
    }
}

/// Plan the dense lane's window over answer positions. `dirty[i]`: position `i` was committed
/// since its KV row was last computed with its token. Without `multi`, the window is the
/// current block (block decoding); with it, see the module doc.
pub fn plan(
    states: &[TokenState],
    dirty: &[bool],
    block: usize,
    multi: Option<&MultiBlock>,
) -> Option<Window> {
    plan_by(states.len(), |i| states[i], |i| dirty[i], block, multi)
}

/// [`plan`] over `gen` positions whose state and dirtiness are read through `state` and
/// `dirty` (a decoder that keeps them per position, not in two slices).
pub fn plan_by(
    gen: usize,
    state: impl Fn(usize) -> TokenState,
    dirty: impl Fn(usize) -> bool,
    block: usize,
    multi: Option<&MultiBlock>,
) -> Option<Window> {
    let masked_at = |i: usize| state(i) == TokenState::Invisible;
    // The current block: the first with a masked position (none left: nothing to plan).
    let first_masked = (0..gen).find(|&i| masked_at(i))?;
    let cur = first_masked / block;
    let (bs, be) = (cur * block, ((cur + 1) * block).min(gen));
    let Some(mb) = multi else {
        return Some(Window {
            start: bs,
            end: be,
            current_block: cur,
            shape: shape_for(be - bs),
        });
    };
    // Continuous sliding: from the first position whose KV is not final yet.
    let start = (0..gen).find(|&i| masked_at(i) || dirty(i)).unwrap_or(bs);
    let masked = (bs..be).filter(|&i| masked_at(i)).count();
    let mut end = be;
    if masked < mb.lookahead {
        // Adaptive lookahead: keep the dense lane at `window` tokens.
        end = end.max(start + mb.window);
    }
    // The window is a fixed-size execution window: never more than `window` rows (on a CPU a
    // pass costs its rows, so rows far right of the frontier, which rarely reach the
    // threshold, are not recomputed every step), but always holding a masked position.
    let end = end.min(start + mb.window).max(first_masked + 1);
    let max = *WINDOW_SHAPES.last().unwrap_or(&256);
    let end = end.min(gen).min(start + max).max(start + 1);
    Some(Window {
        start,
        end,
        current_block: cur,
        shape: shape_for(end - start),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use TokenState::*;

    #[test]
    fn shapes_round_up() {
        assert_eq!(shape_for(1), 8);
        assert_eq!(shape_for(8), 8);
        assert_eq!(shape_for(9), 16);
        assert_eq!(shape_for(200), 256);
    }

    #[test]
    fn block_window_is_the_current_block() {
        let mut s = vec![Invisible; 32];
        s[..8].iter_mut().for_each(|x| *x = Stable);
        let w = plan(&s, &[false; 32], 8, None).unwrap();
        assert_eq!((w.start, w.end, w.current_block, w.shape), (8, 16, 1, 8));
        assert!(plan(&[Stable; 8], &[false; 8], 8, None).is_none());
    }

    #[test]
    fn window_slides_and_looks_ahead() {
        let mb = MultiBlock {
            window: 16,
            lookahead: 3,
        };
        let mut s = vec![Invisible; 32];
        let mut d = vec![false; 32];
        // Block 0 (0..8): five committed and clean, position 5 committed last step (dirty).
        s[..6].iter_mut().for_each(|x| *x = Visible);
        d[5] = true;
        // 2 masked left in block 0 (< 3): the window slides to 5 and extends to 5 + 16.
        let w = plan(&s, &d, 8, Some(&mb)).unwrap();
        assert_eq!((w.start, w.end, w.current_block, w.shape), (5, 21, 0, 16));
        // Enough masked (4 ≥ 3): no lookahead, the window ends at the block end.
        s[4] = Invisible;
        s[5] = Invisible;
        d[5] = false;
        let w = plan(&s, &d, 8, Some(&mb)).unwrap();
        assert_eq!((w.start, w.end, w.shape, w.padding()), (4, 8, 8, 4));
        // A window never exceeds `window` rows, even inside the current block ...
        let mb8 = MultiBlock {
            window: 8,
            lookahead: 3,
        };
        let mut s = vec![Invisible; 32];
        let w = plan(&s, &[false; 32], 16, Some(&mb8)).unwrap();
        assert_eq!((w.start, w.end, w.shape), (0, 8, 8));
        // ... but always holds the first masked position, past a run of dirty commits.
        s[..10].iter_mut().for_each(|x| *x = Visible);
        let mut d = vec![false; 32];
        d[..10].iter_mut().for_each(|x| *x = true);
        let w = plan(&s, &d, 16, Some(&mb8)).unwrap();
        assert_eq!((w.start, w.end, w.shape), (0, 11, 16));
        // Near the end of the answer the window is clipped.
        let mut s = vec![Stable; 32];
        s[30] = Invisible;
        let w = plan(&s, &[false; 32], 8, Some(&mb)).unwrap();
        assert_eq!((w.start, w.end, w.current_block), (30, 32, 3));
    }
}
