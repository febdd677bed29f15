//! One denoising step's plan: the decoder's state between steps ([`Decoder`]), the block
//! setup, which rows the dense pass computes ([`dense_plan`]), which masked positions it
//! predicts, which positions the sparse lane probes, and the commits that end the step.

use super::canvas::Canvas;
use super::commit::{self, transfer_schedule, StepInBlock};
use super::{CacheMode, DiffusionConfig, DiffusionOutput};
use crate::revision::{build_probe, ProbeBatch};
use crate::window::Window;
use llada_model::{ForwardOutput, Model};
use llada_runtime::KvCache;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::time::Instant;

/// Everything the diffusion loop keeps between steps.
pub(super) struct Decoder<'a> {
    pub model: &'a Model,
    pub cfg: &'a DiffusionConfig,
    /// Dream's shifted logits: position `i` reads the output row `i − 1`.
    pub shift: bool,
    pub steps_per_block: usize,
    pub canvas: Canvas,
    pub positions: Vec<u32>,
    pub cache: KvCache,
    /// The sparse lane's snapshot of the cache as of the step's start (the dense pass
    /// overwrites its rows meanwhile): a second cache kept equal to the live one row by row at
    /// every step end (a full clone per step cost more than the copies). Made at the first
    /// probe.
    pub shadow: Option<KvCache>,
    pub rng: StdRng,
    pub out: DiffusionOutput,
    /// The current block, the steps taken in it, and its per-step commit counts.
    pub block: Option<usize>,
    pub step: usize,
    pub schedule: Vec<usize>,
}

/// What one step computes.
pub(super) struct StepPlan {
    /// The current block's end (absolute).
    pub block_end: usize,
    pub dense: DensePlan,
    /// Masked positions predicted this pass (selective logits: nothing else gets the head),
    /// and the dense pass's rows holding their logits.
    pub targets: Vec<usize>,
    pub logit_rows: Vec<usize>,
    /// The sparse lane's probed positions (absolute, sorted) and its pass.
    pub probed: Vec<usize>,
    pub probe: Option<ProbeBatch>,
}

impl<'a> Decoder<'a> {
    pub fn new(model: &'a Model, cfg: &'a DiffusionConfig, prompt: &[u32], mask: u32) -> Self {
        let canvas = Canvas::new(prompt, cfg.gen_length, mask);
        let n = canvas.len();
        Self {
            model,
            cfg,
            shift: model.config.shift_logits,
            steps_per_block: cfg.steps / (cfg.gen_length / cfg.block_length),
            canvas,
            positions: (0..n as u32).collect(),
            cache: model.new_cache(),
            shadow: None,
            rng: StdRng::seed_from_u64(cfg.seed),
            out: DiffusionOutput::default(),
            block: None,
            step: 0,
            schedule: Vec::new(),
        }
    }

    /// Plan the step over `win`, entering its block first if it is a new one.
    pub fn plan_step(&mut self, win: &Window) -> StepPlan {
        let block_start = self.enter_block(win);
        let (cfg, shift) = (self.cfg, self.shift);
        let p = self.canvas.prompt_len();
        let block_end = p + ((win.current_block + 1) * cfg.block_length).min(cfg.gen_length);
        let (dense, probe_end) = self.dense_rows(win, block_start);
        let targets: Vec<usize> = (p + win.start..p + win.end)
            .filter(|&i| self.canvas.is_masked(i) && (cfg.multi_block.is_some() || i < block_end))
            .collect();
        let logit_rows = targets
            .iter()
            .map(|&i| if shift { i.max(1) - 1 } else { i } - dense.row0)
            .collect();
        let probed = match &cfg.revision {
            Some(r) => self.canvas.probe_candidates(probe_end, r.max_rows),
            None => vec![],
        };
        let probe = (!probed.is_empty())
            .then(|| build_probe(self.canvas.tokens(), &probed, self.canvas.mask(), shift));
        StepPlan {
            block_end,
            dense,
            targets,
            logit_rows,
            probed,
            probe,
        }
    }

    /// The dense pass's rows over `win`, and the row the sparse lane's probes end before.
    fn dense_rows(&self, win: &Window, block_start: bool) -> (DensePlan, usize) {
        let (cfg, shift) = (self.cfg, self.shift);
        let (p, n) = (self.canvas.prompt_len(), self.canvas.len());
        let bs = p + win.current_block * cfg.block_length;
        let rows = (bs, p + win.start, p + win.end, n);
        // A refreshing step recomputes every row and rewrites the whole cache: a block start
        // with `refresh_prefix`, or every `refresh_every`-th step of a block (its first included).
        let refresh = (block_start && cfg.refresh_prefix)
            || (cfg.refresh_every > 0 && self.step.is_multiple_of(cfg.refresh_every));
        // The rows a non-refreshing step computes; a refreshing step computes all of them
        // (a block-start plan keeping no cached row).
        let (cached, first_dirty) = (self.cache.len(), self.canvas.first_dirty());
        let plain = dense_plan(
            cfg.cache,
            cached,
            block_start,
            shift,
            rows,
            first_dirty,
            win,
        );
        // The sparse lane's probes take the Visible tokens left of `plain`'s rows, on
        // refreshing steps too (on the step-start snapshot, as ever): a refresh rewrites their
        // KV, but only a probe re-predicts a token, and without them a refresh at every step
        // left revision with no probe at all.
        let probe_end = plain.row0;
        let dense = if refresh {
            dense_plan(cfg.cache, 0, true, shift, rows, n, win)
        } else {
            plain
        };
        (dense, probe_end)
    }

    /// Block setup when `win`'s block is not the current one yet: its speculations join it
    /// and its schedule is laid out over its masked positions. Returns whether it was new.
    fn enter_block(&mut self, win: &Window) -> bool {
        let cur = win.current_block;
        if self.block == Some(cur) {
            return false;
        }
        let bl = self.cfg.block_length;
        let masked = self
            .canvas
            .start_block(cur * bl, ((cur + 1) * bl).min(self.cfg.gen_length));
        self.schedule = transfer_schedule(masked, self.steps_per_block);
        self.step = 0;
        self.block = Some(cur);
        true
    }

    /// The step's commits from the dense pass's logits, then the promotions they allow.
    pub fn commit(&mut self, plan: &StepPlan, dense_out: &ForwardOutput) {
        let cfg = self.cfg;
        let cand = commit::predict(dense_out, &plan.targets, cfg, &mut self.rng);
        let at = StepInBlock {
            step: self.step,
            steps_per_block: self.steps_per_block,
            plan: &self.schedule,
            block_end: plan.block_end,
        };
        // Final once its KV row holds it: without revision every commit, with revision one
        // committed at `Revision::stable_on_commit` confidence or more (not worth a probe).
        let sure_of = |confidence: f32| {
            cfg.revision
                .as_ref()
                .is_none_or(|r| r.stable_on_commit.is_some_and(|t| confidence >= t))
        };
        for (c, speculative) in commit::select(cand, &at, cfg, &mut self.rng) {
            self.canvas
                .commit(c.pos, c.token, sure_of(c.confidence), speculative);
        }
        self.canvas.promote_stable();
    }

    /// The answer and the run's statistics.
    pub fn finish(mut self, t0: Instant) -> DiffusionOutput {
        self.out.tokens = self.canvas.answer().to_vec();
        self.out.total_s = t0.elapsed().as_secs_f64();
        self.out
    }
}

/// Which rows one dense pass computes and where their K/V go.
pub(super) struct DensePlan {
    pub row0: usize,
    pub row1: usize,
    pub slots: Vec<Option<usize>>,
    /// Rows a static-shape accelerator would pad this pass with.
    pub padding: usize,
}

/// The dense lane's rows for this step: the cache mode decides what is recomputed.
///
/// `cache_len`: the rows a block-start pass keeps from the cache (0 refreshes everything).
/// `first_dirty`: the first row whose token was committed after its KV row was computed (`n`
/// if none); a dual block start recomputes from there.
fn dense_plan(
    cache_mode: CacheMode,
    cache_len: usize,
    block_start: bool,
    shift: bool,
    (bs, ws, we, n): (usize, usize, usize, usize),
    first_dirty: usize,
    win: &Window,
) -> DensePlan {
    let s = usize::from(shift);
    match (cache_mode, block_start) {
        (CacheMode::None, _) => DensePlan {
            row0: 0,
            row1: n,
            slots: vec![None; n],
            padding: 0,
        },
        // Prefix: the prompt and finished blocks are cached (refreshed at each block start);
        // Dream also recomputes row bs − 1 (its output predicts position bs).
        (CacheMode::Prefix, true) => {
            let r0 = cache_len.min(bs - s);
            DensePlan {
                row0: r0,
                row1: n,
                slots: (r0..n).map(|r| (r < bs).then_some(r)).collect(),
                padding: 0,
            }
        }
        (CacheMode::Prefix, false) => DensePlan {
            row0: bs - s,
            row1: n,
            slots: (bs - s..n).map(|r| (r < bs).then_some(r)).collect(),
            padding: 0,
        },
        // Dual: slot = position. At a block start everything from the window on is refreshed
        // (Fast-dLLM's dual cache), and so are the finished block's rows committed after their
        // KV was last computed — its last step's commits, whose rows still hold the mask's KV
        // (the prefix cache rewrites them when it appends the block); later steps recompute
        // only the window.
        (CacheMode::Dual, true) => {
            let r0 = cache_len.min(ws - s).min(first_dirty);
            DensePlan {
                row0: r0,
                row1: n,
                slots: (r0..n).map(Some).collect(),
                padding: 0,
            }
        }
        (CacheMode::Dual, false) => DensePlan {
            row0: ws - s,
            row1: we,
            slots: (ws - s..we).map(Some).collect(),
            padding: win.padding(),
        },
    }
}
