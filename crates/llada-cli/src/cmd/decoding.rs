//! Decoding options shared by several commands: diffusion ([`DiffusionArgs`]: `generate --mode
//! diffusion`, `eval`) and speculative ([`SpecArgs`]: `generate --mode speculative`), with their
//! conversion into the library's strategy, tree and AHASD options.

use anyhow::{bail, Context, Result};
use clap::Args;
use llada::draft::{DraftSource, DRAFT_QUANT};
use llada_decode::diffusion::{Confidence, Revision};
use llada_decode::speculative::drafter::TreeShape;
use llada_decode::speculative::prune::ExitProbe;
use llada_decode::strategy::{Strategy, StrategyOptions};

/// Diffusion decoding options (shared by `generate --mode diffusion` and `eval`).
#[derive(Args, Clone)]
pub struct DiffusionArgs {
    /// Strategy [default: vanilla]; multi-block, revision and full commit by confidence
    /// threshold (default 0.95). The table of what each caches and commits:
    /// `llada_decode::strategy` (docs/diffusion.md).
    #[arg(long, value_enum)]
    pub strategy: Option<Strategy>,
    /// Commit every masked token whose confidence reaches this (at least one per step).
    #[arg(long)]
    pub threshold: Option<f32>,
    /// Multi-block: the execution window's length, the most rows the dense lane recomputes
    /// per pass (a static shape: 8, 16, 32, 64, 128, 256). The default holds the whole current
    /// block and a block of lookahead: a narrower window reads the block's other masked rows
    /// from stale cache rows and loses sorts (docs/diffusion.md, "Defaults").
    #[arg(long, default_value_t = StrategyOptions::default().window)]
    pub window: usize,
    /// Multi-block: look ahead into future blocks when the current block has fewer masked
    /// tokens than this.
    #[arg(long, default_value_t = StrategyOptions::default().lookahead)]
    pub lookahead: usize,
    /// Revision: change a token when the re-prediction differs with at least this probability.
    #[arg(long, default_value_t = 0.9)]
    pub revise_threshold: f32,
    /// Revision: a token becomes stable when re-predicted with at least this probability.
    #[arg(long, default_value_t = 0.9)]
    pub stable_threshold: f32,
    /// Revision: probes after which a token becomes stable regardless.
    #[arg(long, default_value_t = Revision::default().max_probes)]
    pub max_probes: u8,
    /// Revision: a token committed with at least this confidence becomes stable without a
    /// probe; `off` probes every commit.
    #[arg(long, default_value = "0.99", value_parser = parse_stable_on_commit)]
    pub stable_on_commit: StableOnCommit,
    /// Revision: run the sparse lane after the dense lane instead of concurrently (same
    /// result; a deterministic schedule).
    #[arg(long)]
    pub sequential_revision: bool,
    /// Prefix and dual caches: recompute the whole cached prefix (prompt and finished blocks)
    /// at every block start, as Fast-dLLM's block-wise cache does, instead of keeping the
    /// prompt's KV from the first pass and appending each finished block. More rows per block;
    /// on the task models it bought no accuracy (docs/diffusion.md).
    #[arg(long)]
    pub prefix_refresh: bool,
    /// Prefix and dual caches: also recompute every row, and rewrite the whole cache, every N
    /// steps inside a block (a block's first step included; 0 = off): the cached rows are
    /// then at most N − 1 steps stale, at one full pass per N steps (dLLM-Cache's interval
    /// refresh). The fast strategies' lost accuracy on tiny-llada-tasks' sorts is that
    /// staleness (docs/diffusion.md).
    #[arg(long, default_value_t = 0)]
    pub refresh_every: usize,
    /// Revision: give the concurrent sparse lane a one-thread pool of its own instead of
    /// sharing the dense lane's threads (for machines with a core to spare; on 2 cores it
    /// slows the dense lane down).
    #[arg(long)]
    pub sparse_pool: bool,
    /// Redraw the answer in the terminal as it denoises (stderr): masked positions as ░,
    /// committed tokens in yellow, revised in magenta, stable in the default colour.
    #[arg(long)]
    pub visual: bool,
    /// Classifier-free guidance scale (vanilla only; 0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub cfg_scale: f32,
    /// Dream's alg_temp: sample which positions a step commits from softmax(confidence /
    /// alg_temp) instead of taking the most confident (0 = off; schedules only, not with a
    /// threshold).
    #[arg(long, default_value_t = 0.0)]
    pub alg_temp: f32,
    /// Answer length in tokens (diffusion).
    #[arg(long, default_value_t = 64)]
    pub gen_length: usize,
    /// Denoising steps (default: gen-length, one token per step).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Semi-autoregressive block length.
    #[arg(long, default_value_t = 32)]
    pub block_length: usize,
    /// Confidence for remasking: top-prob (LLaDA low_confidence / Dream maskgit_plus), margin,
    /// entropy, random.
    #[arg(long, default_value = "top-prob", value_parser = ["top-prob", "margin", "entropy", "random"])]
    pub confidence: String,
    /// Commit schedule: uniform (LLaDA) or timesteps (Dream; one block over the whole answer).
    #[arg(long, default_value = "uniform", value_parser = ["uniform", "timesteps"])]
    pub schedule: String,
}

/// `--stable-on-commit`: a confidence, or `off` (`None`).
#[derive(Debug, Clone, Copy)]
pub struct StableOnCommit(pub Option<f32>);

pub fn parse_stable_on_commit(s: &str) -> Result<StableOnCommit, String> {
    if s == "off" {
        return Ok(StableOnCommit(None));
    }
    match s.parse::<f32>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(StableOnCommit(Some(v))),
        _ => Err(format!(
            "expected a confidence in (0, 1] or `off`, got '{s}'"
        )),
    }
}

impl DiffusionArgs {
    /// The strategy options for an answer of `gen_length` tokens.
    pub fn options(&self, gen_length: usize, temperature: f32, seed: u64) -> StrategyOptions {
        StrategyOptions {
            strategy: self.strategy.unwrap_or(Strategy::Vanilla),
            gen_length,
            steps: self.steps,
            block_length: self.block_length,
            timesteps: self.schedule == "timesteps",
            confidence: match self.confidence.as_str() {
                "margin" => Confidence::Margin,
                "entropy" => Confidence::NegEntropy,
                "random" => Confidence::Random,
                _ => Confidence::TopProb,
            },
            temperature,
            seed,
            threshold: self.threshold,
            window: self.window,
            lookahead: self.lookahead,
            revise_threshold: self.revise_threshold,
            stable_threshold: self.stable_threshold,
            max_probes: self.max_probes,
            stable_on_commit: self.stable_on_commit.0,
            concurrent_revision: !self.sequential_revision,
            prefix_refresh: self.prefix_refresh,
            refresh_every: self.refresh_every,
            cfg_scale: self.cfg_scale,
            alg_temp: self.alg_temp,
        }
    }
    /// A short name for reports.
    pub fn name(&self) -> String {
        self.options(self.gen_length, 0.0, 0).name()
    }
}

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
    /// Requantize a float draft checkpoint's matrices at load: q8_0 (default: a quarter of the
    /// f32 bytes its proposals read), q4_0, q4_1, q4_k, or none (compute it as stored). A draft
    /// file that is already quantized (a Q4_K_M GGUF) keeps its own types.
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
