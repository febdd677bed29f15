//! `llada train-probe`: calibrate a draft's early-exit verification probe against its target
//! ([`llada_zoo::probe::calibrate`]) and report it.

use crate::progress::Bar;
use crate::LoadContext;
use anyhow::Result;
use clap::Args;
use llada_model::{LoadOptions, Model};
use llada_zoo::probe::ProbeRequest;

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

pub fn run(a: TrainProbeArgs) -> Result<()> {
    let req = ProbeRequest {
        draft: a.draft.clone(),
        layer: a.layer,
        prompts: a.prompts,
        tokens: a.tokens,
        recall: a.recall,
    };
    req.check()?;
    let threads = crate::threads(a.threads)?;
    let path = crate::models::resolve(&a.target, a.json)?;
    let target = Model::load(&path, &LoadOptions::default()).load_context(&path)?;
    llada_zoo::bench::spec::left_to_right(&target, &path)?;
    let pb = Bar::styled(
        0,
        "{bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] calibrating",
    );
    let c = llada_zoo::probe::calibrate(&target, &req, threads, &pb)?;
    let (probe, layer, layers) = (&c.probe, c.layer, c.layers);
    let saved = probe.heldout_pruned * (layers - layer - 1) as f64 / layers as f64;
    if a.json {
        println!("{}", serde_json::to_string(probe)?);
    } else {
        println!(
            "probe after layer {layer} of {layers}: {} fit / {} held-out nodes ({:.0}% / {:.0}% accepted)",
            c.fit_nodes,
            c.held_nodes,
            100.0 * c.fit_accepted as f64 / c.fit_nodes.max(1) as f64,
            100.0 * c.held_accepted as f64 / c.held_nodes.max(1) as f64,
        );
        println!(
            "held-out: recall of accepted nodes {:.2}%, nodes pruned {:.1}% (≈ {:.1}% of the verify compute)",
            100.0 * probe.heldout_recall,
            100.0 * probe.heldout_pruned,
            100.0 * saved
        );
        println!("wrote {}", c.path.display());
    }
    Ok(())
}
