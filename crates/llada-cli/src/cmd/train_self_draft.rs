//! `llada train-self-draft`: fit the head of the early-exit self-drafter
//! ([`llada_zoo::selfdraft::fit`]), write it and report its held-out agreement.

use crate::progress::Bar;
use crate::LoadContext;
use anyhow::{bail, Result};
use clap::Args;
use llada::draft::SELF_HEAD;
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use llada_zoo::selfdraft::SelfDraftRequest;
use std::path::PathBuf;

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

pub fn run(a: TrainSelfDraftArgs) -> Result<()> {
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
    llada_zoo::bench::spec::left_to_right(&target, &path)?;
    if a.layers == 0 || a.layers >= target.config.n_layers {
        bail!(
            "--layers must be between 1 and {}",
            target.config.n_layers - 1
        );
    }
    let lane = Lane::new("dense", threads)?;
    let req = SelfDraftRequest {
        layers: a.layers,
        vocab: a.vocab,
        windows: a.windows,
        lambda: a.lambda,
    };
    let pb = Bar::styled(
        0,
        "{bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] fitting the self-draft head",
    );
    let save = |head: &llada_decode::speculative::selfdraft::SelfHead| {
        if let Some(dir) = a.out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        head.save(&a.out)
            .map_err(|e| llada_zoo::Error::Invalid(e.to_string()))
    };
    let r = llada_zoo::selfdraft::fit(&target, &lane, &req, save, &pb)?;
    println!(
        "self-draft head: {} of {} layers, {} ids; top-1 agreement with the full target on held-out prose: {:.1}% ({} positions); wrote {}",
        a.layers,
        target.config.n_layers,
        // `fit_head` keeps at most the target's ids.
        a.vocab.min(target.config.vocab),
        100.0 * r.agree as f64 / r.total.max(1) as f64,
        r.total,
        a.out.display()
    );
    Ok(())
}
