//! The speculative-decoding benchmark's measurements (`llada bench spec`): under each weight
//! budget, AR and every configuration of every drafter on the same prompts, interleaved prompt
//! by prompt, with the tokens, timings, weight traffic and memory peaks of each, checked
//! against AR's output; and the summary ratios at the tightest budget.

pub use super::prompts::PromptSet;
use crate::error::{Context, Result};
use crate::progress::Progress;
use llada::draft::DraftSource;
use llada_decode::speculative::drafter::TreeShape;
use llada_decode::speculative::prune::ExitProbe;
use llada_decode::speculative::{generate as spec_generate, SpecConfig};
use llada_decode::{generate, GenerateConfig, SamplingParams};
use llada_kernels::GgmlType;
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use serde::Serialize;
use std::path::Path;

/// One configuration of one drafter under one budget: what its runs added up to.
#[derive(Serialize, Clone, Debug)]
pub struct SpecRun {
    pub config: String,
    pub draft: String,
    pub budget: String,
    pub tokens_per_s: f64,
    /// Weight bytes read from storage per generated token.
    pub bytes_per_token: f64,
    pub peak_rss_bytes: Option<u64>,
    /// Peak weight memory (resident + staged) during this configuration's runs, counted
    /// exactly: the target's and every loaded draft model's (the drafters of a budget stay
    /// loaded while their runs are interleaved).
    pub weights_peak_bytes: u64,
    /// This run's draft model's packed weights (0 without a draft model); the budget bounds
    /// the target's weights, `weights_peak_bytes` minus all loaded drafts' (the report's
    /// `memory[].draft_weight_bytes`).
    pub draft_weight_bytes: u64,
    /// Bytes of idle staging buffers the pool freed during this configuration's runs to make
    /// room for buffers of other shapes (`recycle::make_room`): 0 in a steady state, more when
    /// a run meets pooled buffers it does not take.
    pub pool_evicted_bytes: u64,
    pub accepted_len: f64,
    pub tree_nodes_per_pass: f64,
    pub verify_passes: usize,
    pub identical: usize,
    pub prompts: usize,
    /// Early exit: fraction of the verify passes' layer-rows skipped.
    pub compute_saved: f64,
    /// Busy fraction of the draft and verify lanes over the decoding wall time (lane timers;
    /// `scripts/trace_lanes.py` gives the same from a `--trace` file).
    pub draft_util: f64,
    pub verify_util: f64,
    /// AHASD with TVC: tokens pre-verified on the draft lane, and idle moments where no
    /// pre-verification fit the verifier's predicted time left.
    pub preverified: usize,
    pub tvc_skips: usize,
    /// TVC: why it stayed off in this configuration's runs (`ahasd::tvc_gate`), if it did.
    pub tvc_gated: Option<String>,
    /// Lever: steps that verified the root alone because drafting did not pay.
    pub declined_steps: usize,
    /// A row of the llama.cpp peer (its text is not compared with ours: `identical` is 0).
    pub peer: bool,
}

/// How a bench cell decodes: a tree shape verified in lock-step (optionally with early exit),
/// or the AHASD pipeline.
enum CellMode {
    Tree {
        shape: TreeShape,
        exit: Option<ExitProbe>,
    },
    Ahasd {
        edc: bool,
        tvc: bool,
        synchronous: bool,
    },
    /// llama.cpp's speculative example with at most `n_max` drafts a step.
    Peer { n_max: usize },
}

/// One configuration of one drafter under one budget, and what its runs have added up.
struct Cell {
    name: &'static str,
    /// Index into the budget's loaded drafters.
    draft: usize,
    mode: CellMode,
    tally: Tally,
}

impl Cell {
    fn new(name: &'static str, draft: usize, mode: CellMode) -> Self {
        Self {
            name,
            draft,
            mode,
            tally: Tally::default(),
        }
    }
}

/// A drafter of the bench, loaded once per budget.
struct Loaded {
    /// As given in `--drafts`.
    name: String,
    src: DraftSource,
    /// Its packed weights (resident, outside the target's budget).
    weight_bytes: u64,
    probe: Option<ExitProbe>,
}

/// Sums over a configuration's generations (one per prompt).
#[derive(Default)]
struct Tally {
    /// Decoding seconds (prefill excluded).
    secs: f64,
    tokens: usize,
    accepted: usize,
    passes: usize,
    nodes: usize,
    same: usize,
    rows_saved: usize,
    rows_total: usize,
    draft_busy: f64,
    verify_busy: f64,
    preverified: usize,
    tvc_skips: usize,
    tvc_gated: Option<String>,
    declined: usize,
    /// Weight bytes streamed from storage.
    bytes: u64,
    peak_rss: Option<u64>,
    weights_peak: u64,
    pool_evicted: u64,
}

impl Tally {
    /// Fold in the peaks since the last [`reset_peak_rss`].
    fn note_peaks(&mut self) {
        self.peak_rss = self.peak_rss.max(llada_model::store::peak_rss_bytes());
        self.weights_peak = self.weights_peak.max(llada_kernels::weight_memory::peak());
    }

    fn rate(&self) -> f64 {
        self.tokens as f64 / self.secs
    }

    /// One generation measured into the tally: the peaks are reset before it, and the weight
    /// bytes it streams, its tokens and its peaks are added after it; `f` runs it, adds its
    /// own counters and returns its tokens.
    fn measure(
        &mut self,
        streamed: impl Fn() -> u64,
        f: impl FnOnce(&mut Tally) -> Result<Vec<u32>>,
    ) -> Result<Vec<u32>> {
        reset_peak_rss();
        let b0 = streamed();
        let e0 = llada_kernels::recycle::evicted_bytes();
        let tokens = f(self)?;
        self.tokens += tokens.len();
        self.bytes += streamed() - b0;
        self.pool_evicted += llada_kernels::recycle::evicted_bytes() - e0;
        self.note_peaks();
        Ok(tokens)
    }

    fn run(
        &self,
        config: &str,
        draft: &str,
        budget: &str,
        prompts: usize,
        draft_w: u64,
    ) -> SpecRun {
        let per_pass = |x: usize| x as f64 / self.passes.max(1) as f64;
        SpecRun {
            config: config.into(),
            draft: draft.into(),
            budget: budget.into(),
            tokens_per_s: self.rate(),
            bytes_per_token: self.bytes as f64 / self.tokens.max(1) as f64,
            peak_rss_bytes: self.peak_rss,
            weights_peak_bytes: self.weights_peak,
            draft_weight_bytes: draft_w,
            pool_evicted_bytes: self.pool_evicted,
            accepted_len: per_pass(self.accepted),
            tree_nodes_per_pass: per_pass(self.nodes),
            verify_passes: self.passes,
            identical: self.same,
            prompts,
            compute_saved: self.rows_saved as f64 / self.rows_total.max(1) as f64,
            draft_util: self.draft_busy / self.secs,
            verify_util: self.verify_busy / self.secs,
            preverified: self.preverified,
            tvc_skips: self.tvc_skips,
            tvc_gated: self.tvc_gated.clone(),
            declined_steps: self.declined,
            peer: false,
        }
    }
}

/// The order in which prompt `i` (of `prompts`) runs the `cells`: all of them, starting at
/// `i · cells / prompts` and wrapping, so that over the prompts each cell's starting offsets
/// spread evenly over the round instead of one cell always running first.
fn cell_order(i: usize, cells: usize, prompts: usize) -> impl Iterator<Item = usize> {
    let start = if cells == 0 {
        0
    } else {
        (i % prompts.max(1)) * cells / prompts.max(1)
    };
    (0..cells).map(move |j| (start + j) % cells)
}

/// Reset the peak-RSS counter (Linux: `5` → /proc/self/clear_refs) and the weight-memory
/// high-water mark, so each configuration's peak is its own. The staging pool is left as the
/// previous run left it, as in a long-lived process: a run after a TVC run (two streamed
/// passes at once, other buffer shapes pooled) frees what it cannot use before allocating
/// (`recycle::make_room`), so its peak stays its own.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    llada_kernels::weight_memory::reset_peak();
}

/// What `llada bench spec` measures: the target at `path` under each of `budgets`
/// (`unlimited`, bytes or percentages), with each of `drafts` (draft models requantized to
/// `draft_quant`), on `prompts` prompts of `max_tokens` greedy tokens each.
#[derive(Clone, Debug)]
pub struct SpecBench {
    pub drafts: Vec<String>,
    pub draft_quant: Option<GgmlType>,
    pub prompts: PromptSet,
    pub max_tokens: usize,
    pub budgets: Vec<String>,
    /// Emulated storage read bandwidth (GB/s) for streamed weights.
    pub storage_bw: Option<f64>,
    pub threads: usize,
    /// The llama.cpp peer's binaries: `llama-speculative-simple` with each draft model file,
    /// resident (the unlimited budget only), on the same prompts ([`super::peer_spec`]).
    pub peer_dir: Option<std::path::PathBuf>,
}

/// `--spec-draft-n-max` of the peer's rows: llama.cpp's own example settings (4), and the
/// longest draft our chain baseline uses (16).
pub const PEER_N_MAX: [usize; 2] = [4, 16];

/// Weight memory and RSS under one budget.
#[derive(Serialize, Clone, Debug)]
pub struct BudgetMemory {
    pub budget: String,
    pub budget_bytes: Option<u64>,
    pub rss_before_load_bytes: Option<u64>,
    pub resident_weight_bytes: Option<u64>,
    pub staging_bytes: Option<u64>,
    pub draft_weight_bytes: u64,
    pub weights_peak_bytes: u64,
    pub weights_peak_without_tvc_bytes: u64,
    pub weights_within_budget_plus_staging_10pct: Option<bool>,
    pub peak_rss_bytes: Option<u64>,
    // The bound read on the whole process: at SmolLM2-135M's size the runtime
    // (tokenizer, KV caches, drafts, buffers) alone exceeds it; at 8B it holds
    // (docs/architecture.md, "Weight store").
    pub rss_within_budget_plus_staging_10pct: Option<bool>,
}

/// AR's rate in its first and last pass over a budget's prompts (the AR row pools both).
#[derive(Serialize, Clone, Debug)]
pub struct ArDrift {
    pub budget: String,
    pub first_tokens_per_s: f64,
    pub last_tokens_per_s: f64,
    pub last_identical: usize,
}

/// Everything a spec bench measured.
#[derive(Clone, Debug, Default)]
pub struct SpecMeasurements {
    pub runs: Vec<SpecRun>,
    pub memory: Vec<BudgetMemory>,
    pub ar_drift: Vec<ArDrift>,
}

/// Speculative decoding, its drafts and probes serve a left-to-right target: a diffusion model
/// is refused (`bench spec`, and the train-* commands, whose output could never run).
pub fn left_to_right(target: &Model, path: &Path) -> Result<()> {
    crate::left_to_right(
        target,
        &format!("--target {}", path.display()),
        "speculative decoding and its drafts need a left-to-right target",
    )
}

/// Run the benchmark of the target at `path`; `progress` counts generations.
pub fn run(path: &Path, a: &SpecBench, progress: &dyn Progress) -> Result<SpecMeasurements> {
    let lane = Lane::new("dense", a.threads)?;
    let mut runs: Vec<SpecRun> = vec![];
    // Per budget: RSS before the target is loaded, weights kept resident, staging buffers
    // (two streamed units), and the highest peak RSS of its configurations.
    let mut memory: Vec<BudgetMemory> = vec![];
    // Per budget: AR's rate before and after the configurations (the AR row pools both).
    let mut ar_drift: Vec<ArDrift> = vec![];
    let mut reference: Vec<Vec<u32>> = vec![];
    // The prompts are the same under every budget (one target, one tokenizer): built once, so
    // the held-out corpora past the first 8 are tokenized once, not per budget.
    let mut prompts_once: Option<(Vec<Vec<u32>>, Vec<String>)> = None;
    progress.set_len((a.budgets.len() * (2 + 8 * a.drafts.len())) as u64);
    for budget in &a.budgets {
        let mem_budget = if budget == "unlimited" {
            None
        } else {
            Some(llada_model::store::Budget::parse(budget).map_err(crate::error::msg)?)
        };
        let rss_before = llada_model::store::rss_bytes();
        reset_peak_rss();
        let target = llada::load::load_model(
            path,
            &LoadOptions {
                mem_budget,
                storage_bw: a.storage_bw.map(|g| g * 1e9),
                ..Default::default()
            },
        )?;
        left_to_right(&target, path)?;
        let load_weights_peak = llada_kernels::weight_memory::peak();
        let (resident_w, staging_w, budget_b) =
            target.store.as_ref().map_or((None, None, None), |st| {
                (
                    Some(st.plan.resident_bytes()),
                    Some(st.plan.staging_bytes()),
                    st.plan.budget,
                )
            });
        let runs_before = runs.len();
        let tok = target
            .tokenizer
            .as_ref()
            .context("the target has no tokenizer")?;
        let (prompts, texts) = match &mut prompts_once {
            Some(p) => (&p.0, &p.1),
            slot @ None => {
                let texts = a.prompts.texts(tok)?;
                let ids = PromptSet::encode(tok, &texts)?;
                let p = slot.insert((ids, texts));
                (&p.0, &p.1)
            }
        };
        let streamed = |m: &Model| {
            m.store.as_ref().map_or(0, |s| {
                s.stats
                    .bytes_read
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
        };
        let gcfg = GenerateConfig {
            max_tokens: a.max_tokens,
            sampling: SamplingParams::default(),
            stop_at_eos: false,
            ..Default::default()
        };
        // Every configuration of every drafter is a cell. The prompts are the outer loop: each
        // prompt runs AR, then every cell (in an order rotated from prompt to prompt, see
        // [`cell_order`]), then AR again. This machine's speed (and a streamed pass's storage
        // rate) drifts within minutes; interleaved, every cell meets the same moments, so the
        // ratios between configurations and between drafters do not hang on their place in
        // the run (run one after the other, the drafter listed first was the faster in three
        // runs out of three). AR's first runs give the lossless reference.
        let mut sources: Vec<Loaded> = vec![];
        for draft in &a.drafts {
            let live_before = llada_kernels::weight_memory::live();
            let src = match DraftSource::load(draft, &target, a.draft_quant) {
                Ok(s) => s,
                // A self-drafter whose layers are streamed at this budget cannot run: say so.
                Err(e) if draft.starts_with("self") => {
                    progress.note(&format!("skipping {draft} at budget {budget}: {e}"));
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let draft_w = llada_kernels::weight_memory::live().saturating_sub(live_before);
            let probe = DraftSource::probe(draft)?.filter(|p| p.layer + 1 < target.config.n_layers);
            sources.push(Loaded {
                name: draft.clone(),
                src,
                weight_bytes: draft_w,
                probe,
            });
        }
        // Every loaded draft model stays resident through every run of this budget.
        let drafts_w: u64 = sources.iter().map(|s| s.weight_bytes).sum();
        let dlane = Lane::new("draft", 1)?;
        let sparse = Lane::new("sparse", 1)?;
        let lever = TreeShape::CostAware {
            max_nodes: 24,
            max_depth: 8,
            top_k: 3,
        };
        let mut cells: Vec<Cell> = vec![];
        for (d, Loaded { probe, src, .. }) in sources.iter().enumerate() {
            let mut trees = vec![
                ("chain", TreeShape::Chain { n: 16, p_min: 0.75 }, None),
                (
                    "topk-tree",
                    TreeShape::TopK {
                        widths: vec![3, 2, 2, 1],
                    },
                    None,
                ),
                ("lever-tree", lever.clone(), None),
            ];
            if probe.is_some() {
                trees.push(("lever-tree+early-exit", lever.clone(), probe.clone()));
            }
            for (name, shape, exit) in trees {
                cells.push(Cell::new(name, d, CellMode::Tree { shape, exit }));
            }
            // AHASD: the same drafter on its own lane, lock-step vs asynchronous, with the gates
            // (not for a drafter that reads the target's features: the draft lane has none).
            if src.reads_features() {
                continue;
            }
            for (name, edc, tvc, synchronous) in [
                ("ahasd-sync", false, false, true),
                ("ahasd-async", false, false, false),
                ("ahasd-async+edc", true, false, false),
                ("ahasd-async+edc+tvc", true, true, false),
            ] {
                cells.push(Cell::new(
                    name,
                    d,
                    CellMode::Ahasd {
                        edc,
                        tvc,
                        synchronous,
                    },
                ));
            }
        }
        // The peer's rows: resident only, for each drafter that is a GGUF draft model.
        let mut peer_cells: Vec<(usize, Cell)> = vec![];
        let mut peer_paths: Vec<std::path::PathBuf> = vec![];
        let mut peer_names: Vec<String> = vec![];
        if a.peer_dir.is_some() && mem_budget.is_none() {
            for draft in &a.drafts {
                let Ok(p) = llada::models::resolve(draft, true) else {
                    continue;
                };
                if p.extension().is_none_or(|e| e != "gguf") || !p.is_file() {
                    continue;
                }
                for n_max in PEER_N_MAX {
                    let name = if n_max == 4 {
                        "llama.cpp-spec-n4"
                    } else {
                        "llama.cpp-spec-n16"
                    };
                    peer_cells.push((
                        peer_paths.len(),
                        Cell::new(name, 0, CellMode::Peer { n_max }),
                    ));
                }
                peer_paths.push(p);
                peer_names.push(draft.clone());
            }
        }
        progress.set_len(
            (a.budgets.len() * prompts.len() * (2 + cells.len() + peer_cells.len())) as u64,
        );
        // AR: both passes pool into one row; `ar_pass` keeps each pass's seconds, tokens and
        // prompts identical to the reference (the drift line).
        let mut ar = Tally::default();
        let mut ar_pass = [(0.0, 0, 0); 2];
        // AR pass `k` over prompt `i`; the first generation of a prompt is its reference.
        let mut ar_once = |i: usize, k: usize, reference: &mut Vec<Vec<u32>>| -> Result<()> {
            let mut secs = 0.0;
            let tokens = ar.measure(
                || streamed(&target),
                |t| {
                    let o = generate(&target, &lane, &prompts[i], &gcfg, |_| true)?;
                    secs = o.decode_s;
                    t.secs += o.decode_s;
                    t.passes += o.tokens.len();
                    Ok(o.tokens)
                },
            )?;
            if reference.len() <= i {
                reference.push(tokens.clone());
            }
            let same = usize::from(tokens == reference[i]);
            ar.same += same;
            ar_pass[k].0 += secs;
            ar_pass[k].1 += tokens.len();
            ar_pass[k].2 += same;
            Ok(())
        };
        for i in 0..prompts.len() {
            let p = &prompts[i];
            progress.status(&format!("{budget}: prompt {}: ar", i + 1));
            ar_once(i, 0, &mut reference)?;
            progress.inc(1);
            for c in cell_order(i, cells.len(), prompts.len()) {
                let cell = &mut cells[c];
                let Loaded {
                    name: draft, src, ..
                } = &sources[cell.draft];
                progress.status(&format!(
                    "{budget}: prompt {}: {} ({draft})",
                    i + 1,
                    cell.name
                ));
                let mode = &cell.mode;
                let tokens = cell.tally.measure(
                    || streamed(&target),
                    |t| {
                        // Tree steps draft then verify: the draft runs on every core (the
                        // dense lane). AHASD's drafter has its own lane beside the verifier.
                        let own_lane = matches!(mode, CellMode::Ahasd { .. });
                        let mut d =
                            src.drafter(&target, if own_lane { &dlane } else { &lane }, 0.0)?;
                        Ok(match mode {
                            CellMode::Peer { .. } => {
                                return Err(crate::error::Error::Invalid(
                                    "a peer row runs outside our decoders".into(),
                                ))
                            }
                            CellMode::Tree { shape, exit } => {
                                let o = spec_generate(
                                    &target,
                                    &lane,
                                    Some(&sparse),
                                    d.as_mut(),
                                    p,
                                    &SpecConfig {
                                        max_tokens: a.max_tokens,
                                        sampling: SamplingParams::default(),
                                        shape: shape.clone(),
                                        stop_ids: vec![],
                                        exit: exit.clone(),
                                        probe_log: None,
                                        fixed_cost: None,
                                    },
                                )?;
                                t.declined += o.declined_steps;
                                t.rows_saved += o.layer_rows_saved;
                                t.rows_total += o.layer_rows_total;
                                t.draft_busy += o.draft_s;
                                t.verify_busy += o.verify_s;
                                t.secs += o.total_s - o.prefill_s;
                                t.accepted += o.accepted;
                                t.passes += o.verify_passes;
                                t.nodes += o.tree_nodes;
                                o.tokens
                            }
                            CellMode::Ahasd {
                                edc,
                                tvc,
                                synchronous,
                            } => {
                                let o = llada_decode::speculative::ahasd::generate(
                                    &target,
                                    &lane,
                                    &dlane,
                                    d.as_mut(),
                                    p,
                                    &llada_decode::speculative::ahasd::AsyncConfig {
                                        max_tokens: a.max_tokens,
                                        batch: 4,
                                        max_verify: 16,
                                        edc: *edc,
                                        tvc: *tvc,
                                        tvc_on_shared: false,
                                        synchronous: *synchronous,
                                        stop_ids: vec![],
                                        sampling: SamplingParams::default(),
                                    },
                                )?;
                                t.secs += o.total_s - o.prefill_s;
                                t.draft_busy += o.draft_busy_s;
                                t.verify_busy += o.verify_busy_s;
                                t.preverified += o.preverified;
                                t.tvc_skips += o.tvc_skips;
                                t.tvc_gated = o.tvc_gated.or(t.tvc_gated.take());
                                t.accepted += o.accepted;
                                t.passes += o.verify_passes;
                                o.tokens
                            }
                        })
                    },
                )?;
                cell.tally.same += usize::from(tokens == reference[i]);
                progress.inc(1);
            }
            for (d, cell) in peer_cells.iter_mut() {
                let (Some(bin), draft_path) = (&a.peer_dir, &peer_paths[*d]) else {
                    continue;
                };
                progress.status(&format!("{budget}: prompt {}: {}", i + 1, cell.name));
                let CellMode::Peer { n_max } = cell.mode else {
                    continue;
                };
                let r = super::peer_spec::run(
                    bin,
                    path,
                    draft_path,
                    &texts[i],
                    a.max_tokens,
                    a.threads,
                    n_max,
                )?;
                let t = &mut cell.tally;
                t.secs += r.secs;
                t.tokens += r.tokens;
                t.accepted += r.accepted;
                // Every step emits its accepted drafts and one token of the target's.
                t.passes += r.tokens.saturating_sub(r.accepted);
                t.nodes += r.drafted;
                progress.inc(1);
            }
            progress.status(&format!("{budget}: prompt {}: ar (again)", i + 1));
            ar_once(i, 1, &mut reference)?;
            progress.inc(1);
        }
        let mut ar_run = ar.run("ar", "-", budget, prompts.len(), 0);
        ar_run.identical = ar_pass[0].2.min(ar_pass[1].2);
        ar_run.verify_util = 1.0;
        runs.push(ar_run);
        for cell in &cells {
            let Loaded {
                name: draft,
                weight_bytes: draft_w,
                ..
            } = &sources[cell.draft];
            runs.push(
                cell.tally
                    .run(cell.name, draft, budget, prompts.len(), *draft_w),
            );
        }
        for (d, cell) in &peer_cells {
            let mut r = cell
                .tally
                .run(cell.name, &peer_names[*d], budget, prompts.len(), 0);
            r.peer = true;
            runs.push(r);
        }
        ar_drift.push(ArDrift {
            budget: budget.clone(),
            first_tokens_per_s: ar_pass[0].1 as f64 / ar_pass[0].0,
            last_tokens_per_s: ar_pass[1].1 as f64 / ar_pass[1].0,
            last_identical: ar_pass[1].2,
        });
        // Weight memory is counted exactly (every packed weight and staging read buffer); RSS
        // also holds the tokenizer, KV caches, logits, drafts and the allocator's slack.
        // Loading, then each configuration (TVC, where it runs, pre-verifies with the target on
        // the draft lane: a second pass, so twice the staging while both run if the target
        // streams — which is why TVC stays off for a streamed target, `tvc_gate`, and every
        // configuration is held to the bound; the peak without the TVC row is kept for
        // comparison with earlier reports). The budget is
        // the target's: the draft models' weights (resident, outside the budget, all of them
        // loaded through every run of the budget: `drafts_w`) are left out of the bound.
        let peak_of = |with_tvc: bool| {
            runs[runs_before..]
                .iter()
                .filter(|r| with_tvc || !r.config.contains("tvc"))
                .map(|r| r.weights_peak_bytes.saturating_sub(drafts_w))
                .chain([load_weights_peak])
                .max()
                .unwrap_or(0)
        };
        let (weights_peak, peak_without_tvc) = (peak_of(true), peak_of(false));
        let bound = budget_b.zip(staging_w).map(|(b, s)| b + s);
        // The bound, budget + staging + 10 % (None without a budget).
        let within = |x: u64| bound.map(|b| x as f64 <= 1.1 * b as f64);
        let peak_rss = runs[runs_before..]
            .iter()
            .filter_map(|r| r.peak_rss_bytes)
            .max();
        memory.push(BudgetMemory {
            budget: budget.clone(),
            budget_bytes: budget_b,
            rss_before_load_bytes: rss_before,
            resident_weight_bytes: resident_w,
            staging_bytes: staging_w,
            draft_weight_bytes: drafts_w,
            weights_peak_bytes: weights_peak,
            weights_peak_without_tvc_bytes: peak_without_tvc,
            weights_within_budget_plus_staging_10pct: within(weights_peak),
            peak_rss_bytes: peak_rss,
            rss_within_budget_plus_staging_10pct: peak_rss.and_then(within),
        });
    }
    progress.finish();
    Ok(SpecMeasurements {
        runs,
        memory,
        ar_drift,
    })
}

/// One drafter's figures at the summary budget: its Lever tree (with early exit when a probe
/// shipped with it) against AR and against its chain, and AHASD async against sync.
#[derive(Serialize, Clone, Debug)]
pub struct DraftSummary {
    pub draft: String,
    pub config: &'static str,
    pub tokens_per_s: Option<f64>,
    pub speedup_vs_ar: Option<f64>,
    pub speedup_vs_chain: Option<f64>,
    pub async_speedup: Option<f64>,
}

/// The summary at the last (tightest) budget: every drafter's figures, and the headline
/// drafter, the one whose Lever tree is fastest there (ties and missing runs: the first listed).
#[derive(Clone, Debug)]
pub struct Summary {
    pub budget: String,
    /// The headline drafter and its Lever configuration.
    pub draft: String,
    pub config: &'static str,
    pub head: Option<DraftSummary>,
    pub per_draft: Vec<DraftSummary>,
}

/// [`Summary`] of `runs` for `drafts` under `budgets`.
pub fn summarise(runs: &[SpecRun], drafts: &[String], budgets: &[String]) -> Summary {
    let low = budgets.last().cloned().unwrap_or_default();
    let find = |config: &str, draft: &str| {
        runs.iter()
            .find(|r| r.config == config && r.budget == low && (r.draft == draft || config == "ar"))
            .map(|r| r.tokens_per_s)
    };
    let summarise = |d: &str| {
        let lever_name = if find("lever-tree+early-exit", d).is_some() {
            "lever-tree+early-exit"
        } else {
            "lever-tree"
        };
        let lever = find(lever_name, d);
        DraftSummary {
            draft: d.to_string(),
            config: lever_name,
            tokens_per_s: lever,
            speedup_vs_ar: lever.zip(find("ar", d)).map(|(l, b)| l / b),
            speedup_vs_chain: lever.zip(find("chain", d)).map(|(l, c)| l / c),
            async_speedup: find("ahasd-async+edc+tvc", d)
                .zip(find("ahasd-sync", d))
                .map(|(x, y)| x / y),
        }
    };
    let per_draft: Vec<DraftSummary> = drafts.iter().map(|d| summarise(d)).collect();
    let best = per_draft
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.tokens_per_s.map(|l| (i, l)))
        .fold(None, |acc: Option<(usize, f64)>, (i, l)| match acc {
            Some((_, b)) if b >= l => acc,
            _ => Some((i, l)),
        })
        .map_or(0, |(i, _)| i);
    let head = per_draft.get(best).cloned();
    Summary {
        budget: low,
        draft: drafts.get(best).cloned().unwrap_or_default(),
        config: head.as_ref().map_or("lever-tree", |h| h.config),
        head,
        per_draft,
    }
}

#[cfg(test)]
mod tests {
    use super::cell_order;

    #[test]
    fn every_prompt_runs_every_cell_once_from_spread_starts() {
        for (cells, prompts) in [(15, 4), (8, 8), (3, 6), (1, 2), (0, 3)] {
            let mut firsts = vec![];
            for i in 0..prompts {
                let order: Vec<usize> = cell_order(i, cells, prompts).collect();
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(
                    sorted,
                    (0..cells).collect::<Vec<_>>(),
                    "{cells} cells, prompt {i}"
                );
                firsts.extend(order.first().copied());
            }
            firsts.sort_unstable();
            firsts.dedup();
            assert_eq!(
                firsts.len(),
                prompts.min(cells),
                "{cells} cells, {prompts} prompts"
            );
        }
        // As many prompts as cells: every cell runs once at every place of the round.
        let n = 7;
        for c in 0..n {
            let mut places: Vec<usize> = (0..n)
                .filter_map(|i| cell_order(i, n, n).position(|x| x == c))
                .collect();
            places.sort_unstable();
            assert_eq!(places, (0..n).collect::<Vec<_>>(), "cell {c}");
        }
    }
}
