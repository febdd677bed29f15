//! `llada generate --mode speculative` options and `llada bench spec`.

use crate::LoadContext;
use anyhow::{bail, Context, Result};
use clap::Args;
use llada_decode::speculative::drafter::{Drafter, TreeShape};
use llada_decode::speculative::featdraft::{FeatureDrafter, FeatureHead, FeatureModel};
use llada_decode::speculative::prune::{self, ExitProbe, ProbeData};
use llada_decode::speculative::selfdraft::{fit_head, SelfDrafter};
use llada_decode::speculative::{generate as spec_generate, SpecConfig};
use llada_decode::{generate, GenerateConfig, SamplingParams};
use llada_kernels::GgmlType;
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use serde::Serialize;
use std::path::PathBuf;

/// Speculative decoding options (shared by `generate --mode speculative` and `bench spec`).
#[derive(Args, Clone)]
pub struct SpecArgs {
    /// Drafter [default: ngram]: `ngram` (prompt lookup, no model), a draft model (path,
    /// shipped name or alias) sharing the target's token ids, e.g. smollm2-draft, or `self` / `self:HEAD.safetensors`
    /// (the target's first layers plus a head from `llada train-self-draft`), or `feature` /
    /// `feature:HEAD.safetensors` (a small network drafting from the target's own final
    /// features, from `llada train-feature-draft`; not with --ahasd); `ngram+SOURCE` merges
    /// prompt lookup into SOURCE's proposals (e.g. `ngram+models/smollm2-draft`).
    #[arg(long)]
    pub draft: Option<String>,
    /// Requantize a draft model's matrices at load: q8_0 (default: a quarter of the f32 bytes
    /// its proposals read), q4_0, q4_1, q4_k, or none (compute the checkpoint as stored).
    #[arg(long, default_value = DRAFT_QUANT)]
    pub draft_quantize: String,
    /// Tree: chain (llama.cpp style), topk (fixed widths), lever (cost-aware growth)
    /// [default: lever].
    #[arg(long, value_parser = ["chain", "topk", "lever"])]
    pub tree: Option<String>,
    /// Chain: tokens drafted per step.
    #[arg(long, default_value_t = 16)]
    pub n_draft: usize,
    /// Chain: stop drafting below this draft probability.
    #[arg(long, default_value_t = 0.75)]
    pub p_min: f32,
    /// Top-k tree: children per node at each depth.
    #[arg(long, value_delimiter = ',', default_value = "3,2,2,1")]
    pub widths: Vec<usize>,
    /// Lever tree: at most this many drafted nodes per verify pass (the cost model usually
    /// stops growth earlier).
    #[arg(long, default_value_t = 24)]
    pub max_nodes: usize,
    /// Lever tree: deepest path (drafted tokens after the last committed one).
    #[arg(long, default_value_t = 8)]
    pub max_depth: usize,
    /// Lever tree: candidate children per node (the drafter's top k).
    #[arg(long, default_value_t = 3)]
    pub tree_top_k: usize,
    /// Early-exit verification pruning with the draft's `probe.json` (made by `llada
    /// train-probe`): tree nodes the probe rejects at a middle layer skip the remaining layers.
    #[arg(long)]
    pub early_exit: bool,
    /// AHASD (asynchronous, hardware-aware speculative decoding) pipeline instead of one-pass
    /// tree verification (greedy only): `async` runs the drafter on its own lane and thread,
    /// drafting ahead while the target verifies; `sync` is the same pipeline in lock-step
    /// (its baseline).
    #[arg(long, value_parser = ["sync", "async"])]
    pub ahasd: Option<String>,
    /// AHASD: EDC, entropy-history drafting control (stop drafting ahead when the history of
    /// draft entropies predicts rejection).
    #[arg(long)]
    pub edc: bool,
    /// AHASD: TVC, time-aware pre-verification (the draft lane verifies pending drafts with the
    /// target while it would idle). It runs only where the draft lane has idle hardware of its
    /// own: a resident target (no `--mem-budget` below its size) and a core the verifier does
    /// not use (`--threads` at most the cores − 1: the verifier takes every core by default);
    /// otherwise the run says why TVC stayed off. Asynchronous runs only.
    #[arg(long)]
    pub tvc: bool,
    /// AHASD: run TVC's pre-verification even where it competes with the verifier for the
    /// cores or the streamed weights (AHASD's rule as the paper states it; measured 0.55x of
    /// lock-step at a 25 % budget on 2 cores). Asynchronous runs only: lock-step has nothing to pre-verify
    /// beside the verifier.
    #[arg(long, requires = "tvc")]
    pub tvc_shared: bool,
    /// AHASD: tokens per draft batch.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
}

impl SpecArgs {
    pub fn shape(&self) -> Result<TreeShape> {
        Ok(match self.tree_name() {
            "chain" => {
                if self.n_draft == 0 {
                    bail!("--n-draft must be at least 1");
                }
                if !(0.0..=1.0).contains(&self.p_min) {
                    bail!("--p-min {}: a draft probability, in [0, 1]", self.p_min);
                }
                TreeShape::Chain {
                    n: self.n_draft,
                    p_min: self.p_min,
                }
            }
            "topk" => {
                if self.widths.is_empty() || self.widths.contains(&0) {
                    bail!("--widths must be positive, e.g. 3,2,2,1");
                }
                TreeShape::TopK {
                    widths: self.widths.clone(),
                }
            }
            _ => {
                if self.max_nodes == 0 || self.max_depth == 0 || self.tree_top_k == 0 {
                    bail!("--max-nodes, --max-depth and --tree-top-k must be at least 1");
                }
                TreeShape::CostAware {
                    max_nodes: self.max_nodes,
                    max_depth: self.max_depth,
                    top_k: self.tree_top_k,
                }
            }
        })
    }
}

pub use llada::draft::{
    draft_quant, feature_head_path, same_token_ids, DraftSource, DRAFT_QUANT, FEATURE_HEAD,
    SELF_HEAD,
};

impl SpecArgs {
    /// The drafter's name (`ngram` when not given).
    pub fn draft_name(&self) -> &str {
        self.draft.as_deref().unwrap_or("ngram")
    }
    /// The tree's name (`lever` when not given).
    fn tree_name(&self) -> &str {
        self.tree.as_deref().unwrap_or("lever")
    }
    /// Whether any option of speculative decoding was given (refused in other modes).
    pub fn any_given(&self) -> bool {
        self.draft.is_some()
            || self.tree.is_some()
            || self.early_exit
            || self.ahasd.is_some()
            || self.edc
            || self.tvc
    }
    /// The early-exit probe `--early-exit` asks for: the draft's, checked.
    pub fn exit_probe(&self) -> Result<Option<ExitProbe>> {
        if !self.early_exit {
            return Ok(None);
        }
        let draft = self.draft_name();
        let base = draft.strip_prefix("ngram+").unwrap_or(draft);
        if DraftSource::probe_less(base) {
            bail!(
                "--early-exit prunes with a probe trained for a draft model or a feature head; \
                 `{draft}` has none (e.g. --draft smollm2-draft)"
            );
        }
        Ok(Some(DraftSource::probe(draft)?.with_context(|| {
            format!("--early-exit needs {base}/probe.json: run `llada train-probe --draft {base}`")
        })?))
    }
    /// The AHASD options `--ahasd` asks for (sampled at `temperature`), checked.
    pub fn ahasd(&self, temperature: f32) -> Result<Option<llada::Ahasd>> {
        let Some(mode) = &self.ahasd else {
            if self.edc || self.tvc {
                bail!(
                    "--edc and --tvc are gates of the AHASD pipeline: add --ahasd async (or sync)"
                );
            }
            return Ok(None);
        };
        if temperature > 0.0 {
            bail!("--ahasd verifies greedily: use -t 0 (without -t, --ahasd decodes greedily)");
        }
        if self.early_exit {
            bail!("--early-exit prunes tree verification; the AHASD pipeline verifies chains");
        }
        if self.batch == 0 {
            bail!("--batch must be at least 1");
        }
        Ok(Some(llada::Ahasd {
            synchronous: mode == "sync",
            edc: self.edc,
            tvc: self.tvc,
            tvc_shared: self.tvc_shared,
            batch: self.batch,
        }))
    }
    /// A name for reports: the tree, or the AHASD pipeline and its gates.
    pub fn describe(&self) -> String {
        match &self.ahasd {
            Some(m) => format!(
                "AHASD {m}{}{}",
                if self.edc { " + EDC" } else { "" },
                if self.tvc { " + TVC" } else { "" }
            ),
            None => format!("tree {}", self.tree_name()),
        }
    }
}

#[derive(Args)]
pub struct SpecBenchArgs {
    /// Target model (alias, GGUF or HF directory).
    #[arg(long, default_value = "smollm2")]
    target: String,
    /// Drafters to compare (`ngram`, draft model paths, `self`, `feature`, `ngram+SOURCE`;
    /// feature drafters skip the AHASD configurations).
    #[arg(long, value_delimiter = ',', default_value = "ngram")]
    drafts: Vec<String>,
    /// Requantize draft models' matrices at load (as `generate --draft-quantize`).
    #[arg(long, default_value = DRAFT_QUANT)]
    draft_quantize: String,
    /// Prompts, alternating raw prose continuations and chat requests (chat template);
    /// each is generated greedily. The first 8 are fixed; more (e.g. `--prompts 50` for the
    /// lossless check) are 32-token windows of the held-out Austen + KJV split, alternately raw
    /// and inside a "Continue this passage" request (needs `python3 scripts/fetch_corpora.py`).
    #[arg(long, default_value_t = 6)]
    prompts: usize,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Weight memory budgets to run under (`unlimited`, bytes, or percentages).
    #[arg(long, value_delimiter = ',', default_value = "unlimited,50%,25%")]
    budgets: Vec<String>,
    /// EMULATION: storage read bandwidth (GB/s) for streamed weights.
    #[arg(long)]
    storage_bw: Option<f64>,
    /// Worker threads of the dense lane (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Directory for report.md, runs.csv, report.json and tokens_per_s.svg.
    #[arg(long, default_value = "bench-out/spec")]
    out_dir: PathBuf,
    /// Print the report (report.json's content) as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct SpecRun {
    config: String,
    draft: String,
    budget: String,
    tokens_per_s: f64,
    /// Weight bytes read from storage per generated token.
    bytes_per_token: f64,
    peak_rss_bytes: Option<u64>,
    /// Peak weight memory (resident + staged) during this configuration's runs, counted
    /// exactly: the target's and every loaded draft model's (the drafters of a budget stay
    /// loaded while their runs are interleaved).
    weights_peak_bytes: u64,
    /// This run's draft model's packed weights (0 without a draft model); the budget bounds
    /// the target's weights, `weights_peak_bytes` minus all loaded drafts' (the report's
    /// `memory[].draft_weight_bytes`).
    draft_weight_bytes: u64,
    /// Bytes of idle staging buffers the pool freed during this configuration's runs to make
    /// room for buffers of other shapes (`recycle::make_room`): 0 in a steady state, more when
    /// a run meets pooled buffers it does not take.
    pool_evicted_bytes: u64,
    accepted_len: f64,
    tree_nodes_per_pass: f64,
    verify_passes: usize,
    identical: usize,
    prompts: usize,
    /// Early exit: fraction of the verify passes' layer-rows skipped.
    compute_saved: f64,
    /// Busy fraction of the draft and verify lanes over the decoding wall time (lane timers;
    /// `scripts/trace_lanes.py` gives the same from a `--trace` file).
    draft_util: f64,
    verify_util: f64,
    /// AHASD with TVC: tokens pre-verified on the draft lane, and idle moments where no
    /// pre-verification fit the verifier's predicted time left.
    preverified: usize,
    tvc_skips: usize,
    /// TVC: why it stayed off in this configuration's runs (`ahasd::tvc_gate`), if it did.
    tvc_gated: Option<String>,
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

/// Bench prompts, alternating prose continuations (raw text, no template: held-out-style
/// prose) and chat requests (rendered with the target's chat template).
const PROMPTS: [(&str, bool); 8] = [
    ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.", false),
    ("Write a Python function that returns the n-th Fibonacci number, then explain how it works.", true),
    ("In the beginning God created the heaven and the earth. And the earth was without form, and void;", false),
    ("List the planets of the solar system in order from the Sun, one per line.", true),
    ("Mr. Darcy walked towards them with Mr. Bingley, and Elizabeth, who had been", false),
    ("Explain what a hash map is and give an example of using one.", true),
    ("Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox", false),
    ("Summarise the rules of chess in five sentences.", true),
];

/// `n` bench prompts as token ids: [`PROMPTS`] first, then held-out corpus windows (see
/// `--prompts`), each rendered with the target's chat template when it is a chat request.
fn bench_prompts(tok: &llada_formats::tokenizer::Tokenizer, n: usize) -> Result<Vec<Vec<u32>>> {
    let mut texts: Vec<(String, bool)> = PROMPTS
        .iter()
        .take(n)
        .map(|&(p, chat)| (p.to_string(), chat))
        .collect();
    if n > texts.len() {
        let files = [
            crate::models::data_file("austen.txt"),
            crate::models::data_file("kjv.txt"),
        ];
        if let Some(f) = files.iter().find(|f| !f.exists()) {
            bail!(
                "--prompts {n}: prompts past the first {} are held-out corpus windows, and {} is \
                 missing; run `python3 scripts/fetch_corpora.py` first",
                PROMPTS.len(),
                f.display()
            );
        }
        // Lines joined by the newline token, so a window decodes to the text as written.
        let nl = tok
            .encode("\n")
            .map_err(anyhow::Error::msg)?
            .last()
            .copied()
            .context("the tokenizer encodes no newline")?;
        let corpus = llada_train::prose::Corpus::load(&files, &tok.inner, nl)?;
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(50);
        for (i, w) in corpus
            .windows(true, n - texts.len(), 32, &mut rng)
            .into_iter()
            .enumerate()
        {
            let text = tok.decode(&w);
            texts.push(if i % 2 == 1 {
                (format!("Continue this passage:\n{text}"), true)
            } else {
                (text, false)
            });
        }
    }
    texts
        .iter()
        .map(|(p, chat)| {
            let text = if *chat {
                tok.template
                    .render(&[llada_formats::tokenizer::Message::new("user", p)], true)
            } else {
                p.clone()
            };
            tok.encode(&text).map_err(anyhow::Error::msg)
        })
        .collect()
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

pub fn bench(a: SpecBenchArgs) -> Result<()> {
    if a.prompts == 0 {
        bail!("--prompts must be at least 1");
    }
    if a.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    if let Some(bw) = a.storage_bw {
        crate::check_storage_bw(bw)?;
    }
    crate::check_output_dir(&a.out_dir, "--out-dir")?;
    for b in a.budgets.iter().filter(|b| *b != "unlimited") {
        llada_model::store::Budget::parse(b).map_err(|e| anyhow::anyhow!("--budgets {b}: {e}"))?;
    }
    let dq = draft_quant(&a.draft_quantize)?;
    let path = crate::models::resolve(&a.target, a.json)?;
    let threads = crate::threads(a.threads)?;
    let lane = Lane::new("dense", threads)?;
    let mut runs: Vec<SpecRun> = vec![];
    // Per budget: RSS before the target is loaded, weights kept resident, staging buffers
    // (two streamed units), and the highest peak RSS of its configurations.
    let mut memory: Vec<serde_json::Value> = vec![];
    // Per budget: AR's rate before and after the configurations (the AR row pools both).
    let mut ar_drift: Vec<serde_json::Value> = vec![];
    let mut reference: Vec<Vec<u32>> = vec![];
    // The prompts are the same under every budget (one target, one tokenizer): built once, so
    // the held-out corpora past the first 8 are tokenized once, not per budget.
    let mut prompts_once: Option<Vec<Vec<u32>>> = None;
    eprintln!(
        "benchmarking speculative decoding: drafters {} at budgets {}, {} prompts of {} tokens",
        a.drafts.join(", "),
        a.budgets.join(", "),
        a.prompts,
        a.max_tokens
    );
    let pb = crate::progress_bar((a.budgets.len() * (2 + 8 * a.drafts.len())) as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}] {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    for budget in &a.budgets {
        let mem_budget = if budget == "unlimited" {
            None
        } else {
            Some(llada_model::store::Budget::parse(budget).map_err(anyhow::Error::msg)?)
        };
        let rss_before = llada_model::store::rss_bytes();
        reset_peak_rss();
        let target = crate::load_model(
            &path,
            &LoadOptions {
                mem_budget,
                storage_bw: a.storage_bw.map(|g| g * 1e9),
                ..Default::default()
            },
        )?;
        left_to_right(&target, &path)?;
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
        let prompts: &Vec<Vec<u32>> = match &mut prompts_once {
            Some(p) => p,
            slot @ None => slot.insert(bench_prompts(tok, a.prompts)?),
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
            let src = match DraftSource::load(draft, &target, dq) {
                Ok(s) => s,
                // A self-drafter whose layers are streamed at this budget cannot run: say so.
                Err(e) if draft.starts_with("self") => {
                    pb.suspend(|| eprintln!("skipping {draft} at budget {budget}: {e}"));
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
        pb.set_length((a.budgets.len() * prompts.len() * (2 + cells.len())) as u64);
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
            pb.set_message(format!("{budget}: prompt {}: ar", i + 1));
            ar_once(i, 0, &mut reference)?;
            pb.inc(1);
            for c in cell_order(i, cells.len(), prompts.len()) {
                let cell = &mut cells[c];
                let Loaded {
                    name: draft, src, ..
                } = &sources[cell.draft];
                pb.set_message(format!(
                    "{budget}: prompt {}: {} ({draft})",
                    i + 1,
                    cell.name
                ));
                let mode = &cell.mode;
                let tokens = cell.tally.measure(
                    || streamed(&target),
                    |t| {
                        let mut d = src.drafter(&target, &dlane, 0.0)?;
                        Ok(match mode {
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
                pb.inc(1);
            }
            pb.set_message(format!("{budget}: prompt {}: ar (again)", i + 1));
            ar_once(i, 1, &mut reference)?;
            pb.inc(1);
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
        ar_drift.push(serde_json::json!({
            "budget": budget,
            "first_tokens_per_s": ar_pass[0].1 as f64 / ar_pass[0].0,
            "last_tokens_per_s": ar_pass[1].1 as f64 / ar_pass[1].0,
            "last_identical": ar_pass[1].2,
        }));
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
        memory.push(serde_json::json!({
            "budget": budget,
            "budget_bytes": budget_b,
            "rss_before_load_bytes": rss_before,
            "resident_weight_bytes": resident_w,
            "staging_bytes": staging_w,
            "draft_weight_bytes": drafts_w,
            "weights_peak_bytes": weights_peak,
            "weights_peak_without_tvc_bytes": peak_without_tvc,
            "weights_within_budget_plus_staging_10pct": within(weights_peak),
            "peak_rss_bytes": peak_rss,
            // The bound read on the whole process: at SmolLM2-135M's size the runtime
            // (tokenizer, KV caches, drafts, buffers) alone exceeds it; at 8B it holds
            // (docs/architecture.md, "Weight store").
            "rss_within_budget_plus_staging_10pct": peak_rss.and_then(within),
        }));
    }
    pb.finish_and_clear();
    // Summary ratios at the last (tightest) budget, per drafter: its Lever tree (with early
    // exit when a probe shipped with it) against AR and against its chain, and AHASD async
    // against sync. The headline drafter is the one whose Lever tree is fastest there (ties
    // and missing runs: the first listed).
    let low = a.budgets.last().cloned().unwrap_or_default();
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
        let summary = serde_json::json!({
            "draft": d,
            "config": lever_name,
            "tokens_per_s": lever,
            "speedup_vs_ar": lever.zip(find("ar", d)).map(|(l, b)| l / b),
            "speedup_vs_chain": lever.zip(find("chain", d)).map(|(l, c)| l / c),
            "async_speedup": find("ahasd-async+edc+tvc", d)
                .zip(find("ahasd-sync", d))
                .map(|(x, y)| x / y),
        });
        (lever_name, lever, summary)
    };
    let per_draft: Vec<_> = a.drafts.iter().map(|d| summarise(d)).collect();
    let best = per_draft
        .iter()
        .enumerate()
        .filter_map(|(i, (_, l, _))| l.map(|l| (i, l)))
        .fold(None, |acc: Option<(usize, f64)>, (i, l)| match acc {
            Some((_, b)) if b >= l => acc,
            _ => Some((i, l)),
        })
        .map_or(0, |(i, _)| i);
    let sd = a.drafts.get(best).cloned().unwrap_or_default();
    let (lever_name, head) = per_draft
        .get(best)
        .map(|(n, _, s)| (*n, s.clone()))
        .unwrap_or(("lever-tree", serde_json::Value::Null));
    let per_draft: Vec<serde_json::Value> = per_draft.into_iter().map(|(_, _, s)| s).collect();
    let total: usize = runs.iter().map(|r| r.prompts).sum();
    let same: usize = runs.iter().map(|r| r.identical).sum();
    let report = serde_json::json!({
        "runs": runs,
        "summary_budget": low,
        "summary_draft": sd,
        "summary_config": lever_name,
        "speedup_vs_ar_25pct": head["speedup_vs_ar"],
        "speedup_vs_chain_25pct": head["speedup_vs_chain"],
        "async_speedup": head["async_speedup"],
        "per_draft": per_draft,
        "memory": memory,
        "ar_drift": ar_drift,
        "lossless_identical": same,
        "lossless_total": total,
        "storage_bw_emulated_gbps": a.storage_bw,
        "target": path.display().to_string(),
        "threads": threads,
        "draft_quantize": a.draft_quantize,
    });
    std::fs::create_dir_all(&a.out_dir)?;
    let mut md = String::from("| config | draft | budget | tok/s | MB read / token | peak RSS MB | weights peak MB | accepted / pass | tree nodes / pass | verify passes | compute saved | draft / verify lane busy | identical to AR |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut csv = String::from(
        "config,draft,budget,tokens_per_s,bytes_per_token,peak_rss_bytes,weights_peak_bytes,accepted_len,tree_nodes_per_pass,verify_passes,compute_saved,draft_util,verify_util,identical,prompts,tvc_gated\n",
    );
    for r in &runs {
        md.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {} | {:.1} | {:.2} | {:.1} | {} | {:.0}% | {:.0}% / {:.0}% | {}/{} |\n",
            r.config,
            r.draft,
            r.budget,
            r.tokens_per_s,
            r.bytes_per_token / 1e6,
            r.peak_rss_bytes
                .map_or("–".into(), |b| format!("{:.0}", b as f64 / 1e6)),
            r.weights_peak_bytes as f64 / 1e6,
            r.accepted_len,
            r.tree_nodes_per_pass,
            r.verify_passes,
            100.0 * r.compute_saved,
            100.0 * r.draft_util,
            100.0 * r.verify_util,
            r.identical,
            r.prompts
        ));
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            r.config,
            r.draft,
            r.budget,
            r.tokens_per_s,
            r.bytes_per_token,
            r.peak_rss_bytes.map(|b| b.to_string()).unwrap_or_default(),
            r.weights_peak_bytes,
            r.accepted_len,
            r.tree_nodes_per_pass,
            r.verify_passes,
            r.compute_saved,
            r.draft_util,
            r.verify_util,
            r.identical,
            r.prompts,
            // Quoted: the reason holds commas.
            r.tvc_gated
                .as_deref()
                .map_or(String::new(), |w| format!("\"{}\"", w.replace('"', "'")))
        ));
    }
    md.push_str("\n| budget | budget MB | resident weights MB | staging MB | weights peak MB | peak RSS MB (before load) | peak RSS ≤ budget + staging + 10 % |\n|---|---|---|---|---|---|---|\n");
    let mb = |v: &serde_json::Value| {
        v.as_u64()
            .map_or("–".into(), |b| format!("{:.1}", b as f64 / 1e6))
    };
    for m in &memory {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} ({}) | {} |\n",
            m["budget"].as_str().unwrap_or("?"),
            mb(&m["budget_bytes"]),
            mb(&m["resident_weight_bytes"]),
            mb(&m["staging_bytes"]),
            mb(&m["weights_peak_bytes"]),
            mb(&m["peak_rss_bytes"]),
            mb(&m["rss_before_load_bytes"]),
            match m["rss_within_budget_plus_staging_10pct"].as_bool() {
                Some(true) => "yes",
                Some(false) => "no",
                None => "–",
            },
        ));
    }
    md.push_str("\nPrompts are the outer loop: each runs AR, every configuration (in an order rotated from prompt to prompt), then AR again; the AR row pools both AR passes:");
    for d in &ar_drift {
        md.push_str(&format!(
            " {} {:.1} then {:.1} tok/s;",
            d["budget"].as_str().unwrap_or("?"),
            d["first_tokens_per_s"].as_f64().unwrap_or(f64::NAN),
            d["last_tokens_per_s"].as_f64().unwrap_or(f64::NAN),
        ));
    }
    md.push('\n');
    for r in runs.iter().filter(|r| r.tvc_gated.is_some()) {
        md.push_str(&format!(
            "\nTVC pre-verified nothing in {} ({}, {}): {} (`llada generate --tvc-shared` runs it anyway).\n",
            r.config,
            r.draft,
            r.budget,
            r.tvc_gated.as_deref().unwrap_or("")
        ));
    }
    md.push_str(&format!(
        "\nTarget {}, {threads} threads, draft models requantized to {} at load{}.\n",
        path.display(),
        a.draft_quantize,
        a.storage_bw.map_or(String::new(), |g| format!(
            ", EMULATED storage bandwidth {g} GB/s"
        ))
    ));
    llada_formats::atomic::write(&a.out_dir.join("report.md"), md.as_bytes())?;
    llada_formats::atomic::write(&a.out_dir.join("runs.csv"), csv.as_bytes())?;
    plot_spec(&runs, &sd, &a.budgets, &a.out_dir.join("tokens_per_s.svg"))?;
    llada_formats::atomic::write(
        &a.out_dir.join("report.json"),
        serde_json::to_string_pretty(&report)?.as_bytes(),
    )?;
    if a.json {
        println!("{report}");
    } else {
        println!("{md}");
        if let Some(bw) = a.storage_bw {
            println!("storage bandwidth EMULATED at {bw} GB/s for streamed weights");
        }
        println!(
            "{lever_name} ({sd}) at budget {low}: {} vs AR, {} vs chain; greedy output identical to AR in {same}/{total} runs",
            report["speedup_vs_ar_25pct"]
                .as_f64()
                .map_or("–".into(), |v| format!("{v:.2}x")),
            report["speedup_vs_chain_25pct"]
                .as_f64()
                .map_or("–".into(), |v| format!("{v:.2}x"))
        );
    }
    Ok(())
}

/// Bars of tokens/s per configuration (AR and the summary drafter), one colour per budget,
/// written atomically by [`crate::write_svg`] (nothing is written when there is nothing to plot).
fn plot_spec(
    runs: &[SpecRun],
    draft: &str,
    budgets: &[String],
    path: &std::path::Path,
) -> Result<()> {
    let mut configs: Vec<&str> = vec![];
    for r in runs.iter().filter(|r| r.draft == draft || r.config == "ar") {
        if !configs.contains(&r.config.as_str()) {
            configs.push(&r.config);
        }
    }
    if configs.is_empty() {
        return Ok(());
    }
    let size = (160 + 110 * configs.len() as u32, 420);
    crate::write_svg(path, size, |root| {
        draw_spec(runs, draft, budgets, &configs, root)
    })
}

/// Draw [`plot_spec`]'s bars, one group per entry of `configs`.
fn draw_spec(
    runs: &[SpecRun],
    draft: &str,
    budgets: &[String],
    configs: &[&str],
    root: &crate::SvgArea<'_>,
) -> Result<()> {
    use plotters::prelude::*;
    let ymax = runs.iter().map(|r| r.tokens_per_s).fold(0.0, f64::max) * 1.15;
    root.fill(&WHITE)?;
    let n = configs.len();
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("bench spec: tokens/s ({draft})"),
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(60)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..n as f64, 0f64..ymax.max(1e-3))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.01 && i < n {
                configs[i].to_string()
            } else {
                String::new()
            }
        })
        .y_desc("tokens/s")
        .draw()?;
    let w = 0.8 / budgets.len().max(1) as f64;
    for (bi, b) in budgets.iter().enumerate() {
        let color = Palette99::pick(bi).to_rgba();
        chart
            .draw_series(configs.iter().enumerate().filter_map(|(i, c)| {
                runs.iter()
                    .find(|r| {
                        r.config == *c && &r.budget == b && (r.draft == draft || r.config == "ar")
                    })
                    .map(|r| {
                        let x0 = i as f64 + 0.1 + bi as f64 * w;
                        Rectangle::new([(x0, 0.0), (x0 + w * 0.9, r.tokens_per_s)], color.filled())
                    })
            }))?
            .label(b.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// `llada train-probe`: calibrate the early-exit verification probe of a draft.
#[derive(Args)]
pub struct TrainProbeArgs {
    /// Target model (alias, GGUF or HF directory).
    #[arg(long, default_value = "smollm2")]
    target: String,
    /// Draft the probe ships with: a draft model (`probe.json` is written into its directory)
    /// or a feature head (`feature`, `feature:PATH`; written beside the head file).
    #[arg(long, default_value = "models/smollm2-draft")]
    draft: String,
    /// Exit layer, 0-based (default: the middle of the target).
    #[arg(long)]
    layer: Option<usize>,
    /// Calibration prompts: 32-token windows of the Austen + KJV *training* split (the last
    /// quarter of the prompts is held out to measure recall).
    #[arg(long, default_value_t = 96)]
    prompts: usize,
    /// Tokens generated per prompt (greedy, Lever tree).
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Fraction of the accepted nodes the threshold must keep on the fitting split.
    #[arg(long, default_value_t = 0.995)]
    recall: f64,
    /// Worker threads of the dense lane (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print the probe as JSON.
    #[arg(long)]
    json: bool,
}

/// The cost model `llada train-probe` grows its calibration trees under, fixed so that the
/// calibration nodes, and the probe fitted on them, are the same on every run (refitted from
/// measured passes, as `generate` does, they followed the machine's speed: 2 847 and 2 997
/// nodes in two runs for one draft). A pass's fixed cost is 40 rows' worth — the order of a
/// streamed pass at the 25 % budget (≈ 0.1 s of weight reads), the regime early exit serves —
/// so trees grow as they do there rather than as on the resident target calibration runs on.
const PROBE_COST: llada_decode::speculative::tree::CostModel =
    llada_decode::speculative::tree::CostModel {
        io_s: 0.1,
        token_s: 0.0025,
    };

/// Speculative decoding, its drafts and probes serve a left-to-right target: a diffusion model
/// is refused (`bench spec`, and the train-* commands, whose output could never run).
fn left_to_right(target: &Model, path: &std::path::Path) -> Result<()> {
    crate::left_to_right(
        target,
        &format!("--target {}", path.display()),
        "speculative decoding and its drafts need a left-to-right target",
    )
}

pub fn train_probe(a: TrainProbeArgs) -> Result<()> {
    if !(0.5..=1.0).contains(&a.recall) {
        bail!("--recall must be in [0.5, 1]");
    }
    if a.prompts < 4 {
        bail!("--prompts must be at least 4 (a quarter is held out to measure recall)");
    }
    let threads = crate::threads(a.threads)?;
    let path = crate::models::resolve(&a.target, a.json)?;
    let target = Model::load(&path, &LoadOptions::default()).load_context(&path)?;
    left_to_right(&target, &path)?;
    let layers = target.config.n_layers;
    let layer = a.layer.unwrap_or(layers / 2);
    if layer + 1 >= layers {
        bail!("--layer must be below the last layer ({})", layers - 1);
    }
    let tok = target
        .tokenizer
        .as_ref()
        .context("the target has no tokenizer")?;
    let files = crate::zoo::prose_files()?;
    let corpus =
        llada_train::prose::Corpus::load(&files, &tok.inner, target.config.eos_id.unwrap_or(0))?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    let prompts = corpus.windows(false, a.prompts, 32, &mut rng);
    // Calibrated on the draft as `generate` and `bench spec` run it by default.
    let src = DraftSource::load(&a.draft, &target, draft_quant(DRAFT_QUANT)?)?;
    let draft_dir = match &src {
        DraftSource::Ngram | DraftSource::SelfDraft(_) | DraftSource::Hybrid(_) => {
            bail!(
                "the probe ships with a draft model directory or a feature head, not `{}`",
                a.draft
            )
        }
        DraftSource::Model(_) => crate::models::resolve(&a.draft, true)?,
        // Beside the head file.
        DraftSource::Feature(..) => feature_head_path(&a.draft)
            .and_then(|p| p.parent().map(|d| d.to_path_buf()))
            .context("a feature head's directory")?,
    };
    let lane = Lane::new("dense", threads)?;
    let dlane = Lane::new("draft", 1)?;
    let pb = crate::progress_bar(prompts.len() as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] calibrating",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let split = prompts.len() * 3 / 4;
    let (mut fit_data, mut held) = (ProbeData::default(), ProbeData::default());
    for (i, p) in prompts.iter().enumerate() {
        let log = std::sync::Arc::new(std::sync::Mutex::new(ProbeData::default()));
        let mut d = src.drafter(&target, &dlane, 0.0)?;
        spec_generate(
            &target,
            &lane,
            None,
            d.as_mut(),
            p,
            &SpecConfig {
                max_tokens: a.tokens,
                sampling: SamplingParams::default(),
                shape: TreeShape::CostAware {
                    max_nodes: 24,
                    max_depth: 8,
                    top_k: 3,
                },
                stop_ids: vec![],
                exit: None,
                probe_log: Some((layer, log.clone())),
                fixed_cost: Some(PROBE_COST),
            },
        )?;
        let got = std::mem::take(&mut *log.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
        let dst = if i < split { &mut fit_data } else { &mut held };
        dst.x.extend(got.x);
        dst.y.extend(got.y);
        pb.inc(1);
    }
    pb.finish_and_clear();
    if !fit_data.y.iter().any(|y| *y) {
        bail!("no drafted node was accepted during calibration: nothing to fit");
    }
    let probe = prune::fit(layer, &fit_data, &held, a.recall);
    let out = draft_dir.join("probe.json");
    probe.save(&out)?;
    let saved = probe.heldout_pruned * (layers - layer - 1) as f64 / layers as f64;
    if a.json {
        println!("{}", serde_json::to_string(&probe)?);
    } else {
        println!(
            "probe after layer {layer} of {layers}: {} fit / {} held-out nodes ({:.0}% / {:.0}% accepted)",
            fit_data.y.len(),
            held.y.len(),
            100.0 * fit_data.y.iter().filter(|y| **y).count() as f64 / fit_data.y.len().max(1) as f64,
            100.0 * held.y.iter().filter(|y| **y).count() as f64 / held.y.len().max(1) as f64,
        );
        println!(
            "held-out: recall of accepted nodes {:.2}%, nodes pruned {:.1}% (≈ {:.1}% of the verify compute)",
            100.0 * probe.heldout_recall,
            100.0 * probe.heldout_pruned,
            100.0 * saved
        );
        println!("wrote {}", out.display());
    }
    Ok(())
}

/// `llada train-self-draft`: fit the head of the early-exit self-drafter.
#[derive(Args)]
pub struct TrainSelfDraftArgs {
    /// Target model (alias, GGUF or HF directory).
    #[arg(long, default_value = "smollm2")]
    target: String,
    /// Layers of the target the drafter runs.
    #[arg(long, default_value_t = 6)]
    layers: usize,
    /// Token ids the head proposes (the most frequent in the calibration windows).
    #[arg(long, default_value_t = 4096)]
    vocab: usize,
    /// Calibration windows of 128 tokens from the Austen + KJV training split.
    #[arg(long, default_value_t = 48)]
    windows: usize,
    /// Ridge strength, relative to the mean diagonal of HᵀH.
    #[arg(long, default_value_t = 1e-3)]
    lambda: f64,
    /// Output file.
    #[arg(long, default_value = SELF_HEAD)]
    out: PathBuf,
    /// Worker threads of the dense lane (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

pub fn train_self_draft(a: TrainSelfDraftArgs) -> Result<()> {
    if a.vocab == 0 || a.windows == 0 {
        bail!("--vocab and --windows must be at least 1");
    }
    if !(a.lambda.is_finite() && a.lambda > 0.0) {
        bail!(
            "--lambda {}: the ridge strength must be a positive number",
            a.lambda
        );
    }
    crate::check_output_file(&a.out, "--out")?;
    let threads = crate::threads(a.threads)?;
    let path = crate::models::resolve(&a.target, false)?;
    let target = Model::load(&path, &LoadOptions::default()).load_context(&path)?;
    left_to_right(&target, &path)?;
    if a.layers == 0 || a.layers >= target.config.n_layers {
        bail!(
            "--layers must be between 1 and {}",
            target.config.n_layers - 1
        );
    }
    let tok = target
        .tokenizer
        .as_ref()
        .context("the target has no tokenizer")?;
    let files = crate::zoo::prose_files()?;
    let corpus =
        llada_train::prose::Corpus::load(&files, &tok.inner, target.config.eos_id.unwrap_or(0))?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(5);
    let windows = corpus.windows(false, a.windows, 128, &mut rng);
    let lane = Lane::new("dense", threads)?;
    let pb = indicatif::ProgressBar::new(windows.len() as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] fitting the self-draft head",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let head = fit_head(&target, &lane, &windows, a.layers, a.vocab, a.lambda, |i| {
        pb.set_position(i as u64)
    })?;
    pb.finish_and_clear();
    if let Some(dir) = a.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    head.save(&a.out).map_err(anyhow::Error::msg)?;
    // Held-out agreement: the head's argmax vs the target's, on held-out windows.
    let held = corpus.windows(true, 8, 128, &mut rng);
    let mut d = SelfDrafter::new(&target, &lane, head, 0.0)?;
    let (mut agree, mut total) = (0usize, 0usize);
    for w in &held {
        let pos: Vec<u32> = (0..w.len() as u32).collect();
        let out = lane.run(|| {
            target.forward(
                &llada_model::ForwardRequest {
                    tokens: w,
                    positions: &pos,
                    mask: llada_model::AttnMask::Causal,
                    kv_write: llada_model::KvWrite::None,
                    logits: llada_model::LogitRows::All,
                },
                &mut target.new_cache(),
            )
        })?;
        for i in (8..w.len()).step_by(4) {
            let want = llada_decode::sampling::argmax(out.row(i - 1));
            let p = d.propose(
                &w[..i],
                &llada_decode::speculative::tree::DraftTree::default(),
                None,
                1,
            )?;
            agree += usize::from(p.top.first().map(|t| t.0) == Some(want));
            total += 1;
        }
    }
    println!(
        "self-draft head: {} of {} layers, {} ids; top-1 agreement with the full target on held-out prose: {:.1}% ({total} positions); wrote {}",
        a.layers,
        target.config.n_layers,
        // `fit_head` keeps at most the target's ids.
        a.vocab.min(target.config.vocab),
        100.0 * agree as f64 / total.max(1) as f64,
        a.out.display()
    );
    Ok(())
}

/// `llada train-feature-draft`: train the feature drafter's head on the target's features.
#[derive(Args)]
pub struct TrainFeatureDraftArgs {
    /// Target model (alias, GGUF or HF directory).
    #[arg(long, default_value = "smollm2")]
    target: String,
    /// Training windows of 128 tokens from the Austen + KJV training split (see --source; the
    /// target runs one causal pass over each to record its features, cached in data/).
    #[arg(long, default_value_t = 2048)]
    windows: usize,
    /// Where the training windows come from: `corpus` (training-split prose), `generated`
    /// (the target continues each window's first 32 tokens greedily, as raw text or inside a
    /// chat request: the text speculation meets) or `mixed` (every other window written).
    #[arg(long, default_value = "mixed", value_parser = ["corpus", "generated", "mixed"])]
    source: String,
    /// Held-out windows for the agreement report.
    #[arg(long, default_value_t = 64)]
    held_out: usize,
    /// Token ids the head proposes (the most frequent target choices and tokens of the windows).
    #[arg(long, default_value_t = 8192)]
    vocab: usize,
    /// Hidden width of the head.
    #[arg(long, default_value_t = 1536)]
    hidden: usize,
    /// Passes over the training examples.
    #[arg(long, default_value_t = 3.0)]
    epochs: f64,
    /// Training examples (recorded positions) per optimizer step.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Weight of the feature regression term beside the cross-entropy.
    #[arg(long, default_value_t = 0.1)]
    feature_weight: f64,
    /// Steps the head is trained to take in a row, from the second on from its own predicted
    /// feature (as deeper tree nodes do).
    #[arg(long, default_value_t = 2)]
    unroll: usize,
    /// Seed of the initialisation and the batch order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also report a draft model's agreement on the same held-out positions (e.g.
    /// `models/smollm2-draft`).
    #[arg(long)]
    compare: Option<String>,
    /// Output file.
    #[arg(long, default_value = FEATURE_HEAD)]
    out: PathBuf,
    /// Worker threads of the dense lane (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

pub fn train_feature_draft(a: TrainFeatureDraftArgs) -> Result<()> {
    use llada_decode::speculative::featdraft::embed;
    let t0 = std::time::Instant::now();
    let path = crate::models::resolve(&a.target, false)?;
    let target = Model::load(&path, &LoadOptions::default()).load_context(&path)?;
    left_to_right(&target, &path)?;
    if a.windows == 0
        || a.vocab == 0
        || a.hidden == 0
        || a.batch == 0
        || a.epochs.is_nan()
        || a.epochs <= 0.0
    {
        bail!("--windows, --vocab, --hidden, --batch and --epochs must be positive");
    }
    if !(a.lr.is_finite() && a.lr > 0.0) {
        bail!("--lr {}: the learning rate must be a positive number", a.lr);
    }
    if a.held_out == 0 {
        bail!("--held-out must be at least 1 (the agreement is measured on them)");
    }
    if !(a.feature_weight.is_finite() && a.feature_weight >= 0.0) {
        bail!(
            "--feature-weight {}: must be a number ≥ 0",
            a.feature_weight
        );
    }
    crate::check_output_file(&a.out, "--out")?;
    let threads = crate::threads(a.threads)?;
    // The comparison draft loads before the training, so a wrong name costs nothing.
    let other = match &a.compare {
        Some(name) => Some(DraftSource::load(name, &target, Some(GgmlType::Q8_0))?),
        None => None,
    };
    if !(1..64).contains(&a.unroll) {
        bail!("--unroll must be between 1 and 63");
    }
    let tok = target
        .tokenizer
        .as_ref()
        .context("the target has no tokenizer")?;
    let files = crate::zoo::prose_files()?;
    let corpus =
        llada_train::prose::Corpus::load(&files, &tok.inner, target.config.eos_id.unwrap_or(0))?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    let windows = crate::zoo::feature_windows(&a.target, &corpus.train, a.windows, 128, &a.source)?;
    let held = corpus.windows(true, a.held_out, 128, &mut rng);
    let lane = Lane::new("dense", threads)?;
    let d = target.config.d_model;
    let (feats, best) =
        crate::zoo::record_features(&a.target, &windows, "recording the target's features")?;
    // The head's ids: the most frequent target choices and input tokens of the windows.
    let vocab = target.config.vocab;
    let mut count = vec![0u64; vocab];
    for &t in windows.iter().flatten().chain(&best) {
        if let Some(c) = count.get_mut(t as usize) {
            *c += 1;
        }
    }
    let mut ids: Vec<u32> = (0..vocab as u32).collect();
    ids.sort_by_key(|&t| (std::cmp::Reverse(count[t as usize]), t));
    ids.truncate(a.vocab.min(vocab));
    let mut index = vec![u32::MAX; vocab];
    for (i, &t) in ids.iter().enumerate() {
        index[t as usize] = i as u32;
    }
    let mut rows = vec![0f32; ids.len() * d];
    for (r, &t) in rows.chunks_exact_mut(d).zip(&ids) {
        embed(&target, t, r)?;
    }
    // Every position: its feature, its token's embedding row, the target's choice there.
    // The target's embedding row of every window token.
    let embed_all = |ws: &[Vec<u32>]| -> Result<Vec<f32>> {
        let mut out = vec![0f32; ws.iter().map(Vec::len).sum::<usize>() * d];
        for (e, &t) in out.chunks_exact_mut(d).zip(ws.iter().flatten()) {
            embed(&target, t, e)?;
        }
        Ok(out)
    };
    let embeds = embed_all(&windows)?;
    let data = llada_train::featdraft::FeatureData {
        d,
        window: 128,
        feats,
        embeds,
        labels: best.iter().map(|&y| index[y as usize]).collect(),
    };
    let opts = llada_train::featdraft::FitOptions {
        hidden: a.hidden,
        epochs: a.epochs,
        batch: a.batch,
        lr: a.lr,
        feature_weight: a.feature_weight,
        unroll: a.unroll,
        seed: a.seed,
    };
    let pb = indicatif::ProgressBar::new(1);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let examples = data.len();
    let fitted = lane.run(|| {
        llada_train::featdraft::fit(&data, &rows, &opts, |s, n, ce| {
            pb.set_length(n as u64);
            pb.set_position(s as u64);
            pb.set_message(format!("training the feature head, cross-entropy {ce:.3}"));
            // A log line now and then too (the bar is hidden when stderr is not a terminal).
            if s % 500 == 1 || s == n {
                pb.suspend(|| eprintln!("step {s}/{n}: cross-entropy {ce:.3}"));
            }
        })
    })?;
    pb.finish_and_clear();
    drop(data);
    // Cross-entropy of the first step on the held-out windows (train: the last batches').
    let (hfeats, hbest) = crate::zoo::record_features(&a.target, &held, "held-out features")?;
    let hembeds = embed_all(&held)?;
    let held_data = llada_train::featdraft::FeatureData {
        d,
        window: 128,
        feats: hfeats,
        embeds: hembeds,
        labels: hbest.iter().map(|&y| index[y as usize]).collect(),
    };
    let held_ce = llada_train::featdraft::mean_ce(&fitted, &held_data, &rows)?;
    let hfeats = held_data.feats;
    let head = FeatureHead {
        d,
        hidden: fitted.hidden,
        w1: fitted.w1,
        b1: fitted.b1,
        w2: fitted.w2,
        b2: fitted.b2,
        ids,
    };
    if let Some(dir) = a.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    head.save(&a.out).map_err(anyhow::Error::msg)?;
    let train_s = t0.elapsed().as_secs_f64();
    // Held-out agreement: the drafter's first proposal after each held-out position, given
    // the target's feature one position back (what it gets after a verification), against
    // the target's argmax.
    let fm = FeatureModel::new(&target, head, draft_quant(DRAFT_QUANT)?)?;
    let mut fd = FeatureDrafter::new(&target, &fm, 0.0);
    let mut od = match &other {
        Some(src) => Some(src.drafter(&target, &lane, 0.0)?),
        None => None,
    };
    let empty = llada_decode::speculative::tree::DraftTree::default();
    let (mut agree, mut agree_other, mut total) = (0usize, 0usize, 0usize);
    let mut off = 0;
    for w in &held {
        for t in 0..w.len().saturating_sub(1) {
            let want = hbest[off + t + 1];
            fd.observe_feature(&hfeats[(off + t) * d..(off + t + 1) * d]);
            let p = fd.propose(&w[..t + 2], &empty, None, 1)?;
            agree += usize::from(p.top.first().map(|x| x.0) == Some(want));
            if let Some(o) = od.as_mut() {
                let p = o.propose(&w[..t + 2], &empty, None, 1)?;
                agree_other += usize::from(p.top.first().map(|x| x.0) == Some(want));
            }
            total += 1;
        }
        off += w.len();
    }
    let pct = |n: usize| 100.0 * n as f64 / total.max(1) as f64;
    println!(
        "feature head: hidden {}, {} ids, {examples} positions, {:.1} min; held-out cross-entropy {held_ce:.3}; top-1 agreement with the target on held-out prose: {:.1}% ({total} positions){}; wrote {}",
        a.hidden,
        a.vocab.min(vocab),
        train_s / 60.0,
        pct(agree),
        a.compare
            .as_ref()
            .map(|n| format!(", {n}: {:.1}%", pct(agree_other)))
            .unwrap_or_default(),
        a.out.display()
    );
    Ok(())
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
