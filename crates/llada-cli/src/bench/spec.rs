//! `llada bench spec`: speculative decoding configurations against the AR baseline under weight
//! budgets (measured by [`llada_zoo::bench::spec`]); the report as Markdown, CSV, an SVG plot
//! and JSON.

use anyhow::{bail, Result};
use clap::Args;
use llada::draft::{draft_quant, DRAFT_QUANT};
use llada_zoo::bench::spec::{summarise, PromptSet, SpecBench, SpecRun};
use std::path::PathBuf;

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
    /// Prompts, each generated greedily. A count: alternating raw prose continuations and chat
    /// requests (chat template); the first 8 are fixed, more (e.g. `--prompts 50` for the
    /// lossless check) are 32-token windows of the held-out Austen + KJV split, alternately raw
    /// and inside a "Continue this passage" request (needs `python3 scripts/fetch_corpora.py`).
    /// Or HumanEval problems: `humaneval`, `humaneval[:N]`, `humaneval[A:B]`, the prompt field
    /// raw for even problems and inside a "Complete this function" chat request for odd ones
    /// (needs `python3 scripts/fetch_humaneval.py`).
    #[arg(long, default_value = "6")]
    prompts: PromptSet,
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
    /// Add llama.cpp's speculative example (`llama-speculative-simple`, built by
    /// scripts/peer/llama_cpp.sh, docs/peer.md) with each GGUF draft model, on the same files
    /// and prompts, at --spec-draft-n-max 4 and 16: rows at the unlimited budget (it cannot
    /// stream weights).
    #[arg(long)]
    peer: bool,
    /// The peer's binary directory (default: $LLADA_PEER_DIR, else the cache's peer/).
    #[arg(long, value_name = "DIR", requires = "peer")]
    peer_dir: Option<PathBuf>,
}

pub fn run(a: SpecBenchArgs) -> Result<()> {
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
    // Found before any model loads, so that a missing peer fails at once.
    let peer_dir = if a.peer {
        Some(llada_zoo::bench::peer::find_bin_dir(a.peer_dir.as_deref())?)
    } else {
        None
    };
    let dq = draft_quant(&a.draft_quantize)?;
    let path = crate::models::resolve(&a.target, a.json)?;
    let threads = crate::threads(a.threads)?;
    eprintln!(
        "benchmarking speculative decoding: drafters {} at budgets {}, {} prompts of {} tokens",
        a.drafts.join(", "),
        a.budgets.join(", "),
        a.prompts,
        a.max_tokens
    );
    let pb = crate::progress::Bar::styled(0, "{bar:30} {pos}/{len} [{elapsed_precise}] {msg}");
    let bench = SpecBench {
        drafts: a.drafts.clone(),
        draft_quant: dq,
        prompts: a.prompts.clone(),
        peer_dir,
        max_tokens: a.max_tokens,
        budgets: a.budgets.clone(),
        storage_bw: a.storage_bw,
        threads,
    };
    let m = llada_zoo::bench::spec::run(&path, &bench, &pb)?;
    let (runs, memory, ar_drift) = (m.runs, m.memory, m.ar_drift);
    // Summary ratios at the last (tightest) budget, per drafter: its Lever tree (with early
    // exit when a probe shipped with it) against AR and against its chain, and AHASD async
    // against sync. The headline drafter is the one whose Lever tree is fastest there (ties
    // and missing runs: the first listed).
    let summary = summarise(&runs, &a.drafts, &a.budgets);
    let (low, sd, lever_name) = (summary.budget, summary.draft, summary.config);
    let head = serde_json::to_value(&summary.head)?;
    let per_draft = summary.per_draft;
    // The peer's text is not compared (it prints it among its logs).
    let ours = runs.iter().filter(|r| !r.peer);
    let total: usize = ours.clone().map(|r| r.prompts).sum();
    let same: usize = ours.map(|r| r.identical).sum();
    // Resident (unlimited budget): the summary drafter's Lever tree against AR and against
    // the peer's best row.
    let rate = |f: &dyn Fn(&SpecRun) -> bool| {
        runs.iter()
            .filter(|r| r.budget == "unlimited" && f(r))
            .map(|r| r.tokens_per_s)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    };
    let lever_resident = rate(&|r| !r.peer && r.draft == sd && r.config == "lever-tree");
    let ar_resident = rate(&|r| r.config == "ar");
    let peer_resident = rate(&|r| r.peer);
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let report = serde_json::json!({
        "resident_lever_vs_ar": ratio(lever_resident, ar_resident),
        "resident_lever_vs_peer": ratio(lever_resident, peer_resident),
        "peer_resident_tokens_per_s": peer_resident,
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
        "prompts": a.prompts.to_string(),
        "max_tokens": a.max_tokens,
    });
    std::fs::create_dir_all(&a.out_dir)?;
    let mut md = String::from("| config | draft | budget | tok/s | MB read / token | peak RSS MB | weights peak MB | accepted / pass | tree nodes / pass | verify passes | compute saved | draft / verify lane busy | identical to AR |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut csv = String::from(
        "config,draft,budget,tokens_per_s,bytes_per_token,peak_rss_bytes,weights_peak_bytes,accepted_len,tree_nodes_per_pass,verify_passes,compute_saved,draft_util,verify_util,identical,prompts,tvc_gated\n",
    );
    for r in &runs {
        md.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {} | {:.1} | {:.2} | {:.1} | {} | {:.0}% | {:.0}% / {:.0}% | {} |\n",
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
            if r.peer {
                "–".to_string()
            } else {
                format!("{}/{}", r.identical, r.prompts)
            }
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
    let mb = |v: Option<u64>| v.map_or("–".into(), |b| format!("{:.1}", b as f64 / 1e6));
    for m in &memory {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} ({}) | {} |\n",
            m.budget,
            mb(m.budget_bytes),
            mb(m.resident_weight_bytes),
            mb(m.staging_bytes),
            mb(Some(m.weights_peak_bytes)),
            mb(m.peak_rss_bytes),
            mb(m.rss_before_load_bytes),
            match m.rss_within_budget_plus_staging_10pct {
                Some(true) => "yes",
                Some(false) => "no",
                None => "–",
            },
        ));
    }
    md.push_str("\nPrompts are the outer loop: each runs AR, every configuration (in an order rotated from prompt to prompt), then AR again; the AR row pools both AR passes:");
    let finite = |x: f64| if x.is_finite() { x } else { f64::NAN };
    for d in &ar_drift {
        md.push_str(&format!(
            " {} {:.1} then {:.1} tok/s;",
            d.budget,
            // As the JSON report reads them: a rate that is not finite is no number.
            finite(d.first_tokens_per_s),
            finite(d.last_tokens_per_s),
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
        "\nTarget {}, prompts {}, {} tokens each, {threads} threads, float draft checkpoints requantized to {} at load{}.\n",
        path.display(),
        a.prompts,
        a.max_tokens,
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
