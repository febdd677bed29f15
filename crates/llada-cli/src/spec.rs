//! `llada generate --mode speculative` options and `llada bench spec`.

use anyhow::{bail, Context, Result};
use clap::Args;
use llada_decode::speculative::drafter::{Drafter, ModelDrafter, NgramDrafter, TreeShape};
use llada_decode::speculative::{generate as spec_generate, SpecConfig, SpecOutput};
use llada_decode::{generate, GenerateConfig, SamplingParams};
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use serde::Serialize;
use std::path::PathBuf;

/// Speculative decoding options (shared by `generate --mode speculative` and `bench spec`).
#[derive(Args, Clone)]
pub struct SpecArgs {
    /// Drafter: `ngram` (prompt lookup, no model) or a draft model (path or alias) sharing the
    /// target's token ids, e.g. models/smollm2-draft.
    #[arg(long, default_value = "ngram")]
    pub draft: String,
    /// Tree: chain (llama.cpp style), topk (fixed widths), lever (cost-aware growth).
    #[arg(long, default_value = "lever", value_parser = ["chain", "topk", "lever"])]
    pub tree: String,
    /// Chain: tokens drafted per step.
    #[arg(long, default_value_t = 16)]
    pub n_draft: usize,
    /// Chain: stop drafting below this draft probability.
    #[arg(long, default_value_t = 0.75)]
    pub p_min: f32,
    /// Top-k tree: children per node at each depth.
    #[arg(long, value_delimiter = ',', default_value = "3,2,2,1")]
    pub widths: Vec<usize>,
    /// Lever tree: most nodes, deepest path, candidates per node.
    #[arg(long, default_value_t = 24)]
    pub max_nodes: usize,
    #[arg(long, default_value_t = 8)]
    pub max_depth: usize,
    #[arg(long, default_value_t = 3)]
    pub tree_top_k: usize,
}

impl SpecArgs {
    pub fn shape(&self) -> Result<TreeShape> {
        Ok(match self.tree.as_str() {
            "chain" => {
                if self.n_draft == 0 {
                    bail!("--n-draft must be at least 1");
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

/// A loaded drafter: the n-gram drafter, or a draft model (kept alive for the borrow).
pub enum DraftSource {
    Ngram,
    Model(Box<Model>),
}

impl DraftSource {
    pub fn load(name: &str, target: &Model) -> Result<Self> {
        if name == "ngram" {
            return Ok(Self::Ngram);
        }
        let path = crate::models::resolve(name, true)?;
        let m = Model::load(
            &path,
            &LoadOptions {
                no_tokenizer: true,
                ..Default::default()
            },
        )
        .with_context(|| format!("loading draft {}", path.display()))?;
        if m.config.vocab != target.config.vocab {
            bail!(
                "draft {} has {} token ids, the target {}: a draft must share the target's tokenizer",
                path.display(),
                m.config.vocab,
                target.config.vocab
            );
        }
        Ok(Self::Model(Box::new(m)))
    }
    pub fn drafter<'a>(&'a self, lane: &'a Lane, temperature: f32) -> Box<dyn Drafter + 'a> {
        match self {
            Self::Ngram => Box::new(NgramDrafter),
            Self::Model(m) => Box::new(ModelDrafter::new(m, lane, temperature)),
        }
    }
}

/// Run speculative generation for the CLI.
pub fn run_generate(
    target: &Model,
    lane: &Lane,
    ids: &[u32],
    cfg: &GenerateConfig,
    a: &SpecArgs,
) -> Result<SpecOutput> {
    let src = DraftSource::load(&a.draft, target)?;
    let draft_lane = Lane::new("draft", 1)?;
    let sparse = Lane::new("sparse", 1)?;
    let mut d = src.drafter(&draft_lane, cfg.sampling.temperature);
    let stop: Vec<u32> = if cfg.stop_at_eos {
        target
            .tokenizer
            .as_ref()
            .map(|t| t.stop_ids.clone())
            .unwrap_or_default()
            .into_iter()
            .chain(target.config.eos_id)
            .collect()
    } else {
        vec![]
    };
    Ok(spec_generate(
        target,
        lane,
        Some(&sparse),
        d.as_mut(),
        ids,
        &SpecConfig {
            max_tokens: cfg.max_tokens,
            sampling: cfg.sampling,
            shape: a.shape()?,
            stop_ids: stop,
        },
    )?)
}

#[derive(Args)]
pub struct SpecBenchArgs {
    /// Target model (alias, GGUF or HF directory).
    #[arg(long, default_value = "smollm2")]
    target: String,
    /// Drafters to compare (`ngram` and/or draft model paths).
    #[arg(long, value_delimiter = ',', default_value = "ngram")]
    drafts: Vec<String>,
    /// Prompts (held-out-style prose and chat); each is generated greedily.
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
    #[arg(long)]
    threads: Option<usize>,
    /// Directory for report.md, runs.csv and report.json.
    #[arg(long, default_value = "bench-out/spec")]
    out_dir: PathBuf,
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
    accepted_len: f64,
    tree_nodes_per_pass: f64,
    verify_passes: usize,
    identical: usize,
    prompts: usize,
}

const PROMPTS: [&str; 8] = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "Write a Python function that returns the n-th Fibonacci number, then explain how it works.",
    "In the beginning God created the heaven and the earth. And the earth was without form, and void;",
    "List the planets of the solar system in order from the Sun, one per line.",
    "Mr. Darcy walked towards them with Mr. Bingley, and Elizabeth, who had been",
    "Explain what a hash map is and give an example of using one.",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "Summarise the rules of chess in five sentences.",
];

/// Reset the peak-RSS counter (Linux: `5` → /proc/self/clear_refs), so each configuration's
/// peak is its own.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

pub fn bench(a: SpecBenchArgs) -> Result<()> {
    let path = crate::models::resolve(&a.target, a.json)?;
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let lane = Lane::new("dense", threads)?;
    let mut runs: Vec<SpecRun> = vec![];
    let mut reference: Vec<Vec<u32>> = vec![];
    let pb = if a.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new((a.budgets.len() * (1 + 7 * a.drafts.len())) as u64)
    };
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
        reset_peak_rss();
        let target = Model::load(
            &path,
            &LoadOptions {
                mem_budget,
                storage_bw: a.storage_bw.map(|g| g * 1e9),
                ..Default::default()
            },
        )
        .with_context(|| format!("loading {}", path.display()))?;
        let tok = target
            .tokenizer
            .as_ref()
            .context("the target has no tokenizer")?;
        let prompts: Vec<Vec<u32>> = PROMPTS
            .iter()
            .take(a.prompts.clamp(1, PROMPTS.len()))
            .map(|p| {
                let text = tok
                    .template
                    .render(&[llada_formats::tokenizer::Message::new("user", p)], true);
                tok.encode(&text).map_err(anyhow::Error::msg)
            })
            .collect::<Result<_>>()?;
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
        // The AR baseline; its tokens are the lossless reference.
        pb.set_message(format!("{budget}: ar"));
        let (mut ar_s, mut ar_tokens, mut same) = (0.0, 0, 0);
        let b0 = streamed(&target);
        for (i, p) in prompts.iter().enumerate() {
            let o = generate(&target, &lane, p, &gcfg, |_| true)?;
            ar_s += o.decode_s;
            ar_tokens += o.tokens.len();
            if reference.len() <= i {
                reference.push(o.tokens.clone());
            }
            same += usize::from(o.tokens == reference[i]);
        }
        pb.inc(1);
        runs.push(SpecRun {
            config: "ar".into(),
            draft: "-".into(),
            budget: budget.clone(),
            tokens_per_s: ar_tokens as f64 / ar_s,
            bytes_per_token: (streamed(&target) - b0) as f64 / ar_tokens.max(1) as f64,
            peak_rss_bytes: llada_model::store::peak_rss_bytes(),
            accepted_len: 0.0,
            tree_nodes_per_pass: 0.0,
            verify_passes: ar_tokens,
            identical: same,
            prompts: prompts.len(),
        });
        for draft in &a.drafts {
            let src = DraftSource::load(draft, &target)?;
            let dlane = Lane::new("draft", 1)?;
            let sparse = Lane::new("sparse", 1)?;
            for (name, shape) in [
                ("chain", TreeShape::Chain { n: 16, p_min: 0.75 }),
                (
                    "topk-tree",
                    TreeShape::TopK {
                        widths: vec![3, 2, 2, 1],
                    },
                ),
                (
                    "lever-tree",
                    TreeShape::CostAware {
                        max_nodes: 24,
                        max_depth: 8,
                        top_k: 3,
                    },
                ),
            ] {
                pb.set_message(format!("{budget}: {name} ({draft})"));
                let (mut s, mut toks, mut acc, mut passes, mut nodes, mut same) =
                    (0.0, 0, 0, 0, 0, 0);
                let b0 = streamed(&target);
                for (p, want) in prompts.iter().zip(&reference) {
                    let mut d = src.drafter(&dlane, 0.0);
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
                        },
                    )?;
                    s += o.total_s - o.prefill_s;
                    toks += o.tokens.len();
                    acc += o.accepted;
                    passes += o.verify_passes;
                    nodes += o.tree_nodes;
                    same += usize::from(&o.tokens == want);
                }
                pb.inc(1);
                runs.push(SpecRun {
                    config: name.into(),
                    draft: draft.clone(),
                    budget: budget.clone(),
                    tokens_per_s: toks as f64 / s,
                    bytes_per_token: (streamed(&target) - b0) as f64 / toks.max(1) as f64,
                    peak_rss_bytes: llada_model::store::peak_rss_bytes(),
                    accepted_len: acc as f64 / passes.max(1) as f64,
                    tree_nodes_per_pass: nodes as f64 / passes.max(1) as f64,
                    verify_passes: passes,
                    identical: same,
                    prompts: prompts.len(),
                });
            }
            // AHASD: the same drafter on its own lane, lock-step vs asynchronous, with the gates.
            for (name, edc, tvc, synchronous) in [
                ("ahasd-sync", false, false, true),
                ("ahasd-async", false, false, false),
                ("ahasd-async+edc", true, false, false),
                ("ahasd-async+edc+tvc", true, true, false),
            ] {
                pb.set_message(format!("{budget}: {name} ({draft})"));
                let (mut s, mut toks, mut acc, mut passes, mut same) = (0.0, 0, 0, 0, 0);
                let b0 = streamed(&target);
                for (p, want) in prompts.iter().zip(&reference) {
                    let mut d = src.drafter(&dlane, 0.0);
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
                            edc,
                            tvc,
                            synchronous,
                            stop_ids: vec![],
                        },
                    )?;
                    s += o.total_s;
                    toks += o.tokens.len();
                    acc += o.accepted;
                    passes += o.verify_passes;
                    same += usize::from(&o.tokens == want);
                }
                pb.inc(1);
                runs.push(SpecRun {
                    config: name.into(),
                    draft: draft.clone(),
                    budget: budget.clone(),
                    tokens_per_s: toks as f64 / s,
                    bytes_per_token: (streamed(&target) - b0) as f64 / toks.max(1) as f64,
                    peak_rss_bytes: llada_model::store::peak_rss_bytes(),
                    accepted_len: acc as f64 / passes.max(1) as f64,
                    tree_nodes_per_pass: 0.0,
                    verify_passes: passes,
                    identical: same,
                    prompts: prompts.len(),
                });
            }
        }
    }
    pb.finish_and_clear();
    let find = |config: &str, budget: &str| {
        runs.iter()
            .find(|r| r.config == config && r.budget == budget)
            .map(|r| r.tokens_per_s)
    };
    let low = a.budgets.last().cloned().unwrap_or_default();
    let lever = find("lever-tree", &low);
    let total: usize = runs.iter().map(|r| r.prompts).sum();
    let same: usize = runs.iter().map(|r| r.identical).sum();
    let report = serde_json::json!({
        "runs": runs,
        "summary_budget": low,
        "speedup_vs_ar_25pct": lever.zip(find("ar", &low)).map(|(l, b)| l / b),
        "speedup_vs_chain_25pct": lever.zip(find("chain", &low)).map(|(l, c)| l / c),
        "async_speedup": find("ahasd-async+edc+tvc", &low)
            .zip(find("ahasd-sync", &low))
            .map(|(x, y)| x / y),
        "lossless_identical": same,
        "lossless_total": total,
        "storage_bw_emulated_gbps": a.storage_bw,
        "target": path.display().to_string(),
        "threads": threads,
    });
    std::fs::create_dir_all(&a.out_dir)?;
    let mut md = String::from("| config | draft | budget | tok/s | MB read / token | peak RSS MB | accepted / pass | tree nodes / pass | verify passes | identical to AR |\n|---|---|---|---|---|---|---|---|---|---|\n");
    let mut csv = String::from(
        "config,draft,budget,tokens_per_s,bytes_per_token,peak_rss_bytes,accepted_len,tree_nodes_per_pass,verify_passes,identical,prompts\n",
    );
    for r in &runs {
        md.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {} | {:.2} | {:.1} | {} | {}/{} |\n",
            r.config,
            r.draft,
            r.budget,
            r.tokens_per_s,
            r.bytes_per_token / 1e6,
            r.peak_rss_bytes
                .map_or("–".into(), |b| format!("{:.0}", b as f64 / 1e6)),
            r.accepted_len,
            r.tree_nodes_per_pass,
            r.verify_passes,
            r.identical,
            r.prompts
        ));
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{}\n",
            r.config,
            r.draft,
            r.budget,
            r.tokens_per_s,
            r.bytes_per_token,
            r.peak_rss_bytes.map(|b| b.to_string()).unwrap_or_default(),
            r.accepted_len,
            r.tree_nodes_per_pass,
            r.verify_passes,
            r.identical,
            r.prompts
        ));
    }
    std::fs::write(a.out_dir.join("report.md"), &md)?;
    std::fs::write(a.out_dir.join("runs.csv"), csv)?;
    std::fs::write(
        a.out_dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    if a.json {
        println!("{report}");
    } else {
        println!("{md}");
        if let Some(bw) = a.storage_bw {
            println!("storage bandwidth EMULATED at {bw} GB/s for streamed weights");
        }
        println!(
            "lever tree at budget {low}: {} vs AR, {} vs chain; greedy output identical to AR in {same}/{total} runs",
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
