//! `llada train-feature-draft`: train the feature drafter's head on the target's features
//! ([`llada_zoo::featdraft::train`]), write it and report its held-out agreement.

use crate::progress::Bar;
use crate::LoadContext;
use anyhow::Result;
use clap::Args;
use llada::draft::{DraftSource, FEATURE_HEAD};
use llada_kernels::GgmlType;
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use llada_zoo::featdraft::FeatureDraftRequest;
use std::path::PathBuf;

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

pub fn run(a: TrainFeatureDraftArgs) -> Result<()> {
    let t0 = std::time::Instant::now();
    let path = crate::models::resolve(&a.target, false)?;
    let target = Model::load(&path, &LoadOptions::default()).load_context(&path)?;
    llada_zoo::bench::spec::left_to_right(&target, &path)?;
    let req = FeatureDraftRequest {
        target: a.target.clone(),
        windows: a.windows,
        source: a.source.clone(),
        held_out: a.held_out,
        vocab: a.vocab,
        hidden: a.hidden,
        epochs: a.epochs,
        batch: a.batch,
        lr: a.lr,
        feature_weight: a.feature_weight,
        unroll: a.unroll,
        seed: a.seed,
    };
    req.check()?;
    crate::check_output_file(&a.out, "--out")?;
    let threads = crate::threads(a.threads)?;
    // The comparison draft loads before the training, so a wrong name costs nothing.
    let other = match &a.compare {
        Some(name) => Some(DraftSource::load(name, &target, Some(GgmlType::Q8_0))?),
        None => None,
    };
    let lane = Lane::new("dense", threads)?;
    let pb = Bar::styled(
        1,
        "{bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] {msg}",
    );
    let mut train_s = 0.0;
    let save = |head: &llada_decode::speculative::featdraft::FeatureHead| {
        if let Some(dir) = a.out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        head.save(&a.out)
            .map_err(|e| llada_zoo::Error::Invalid(e.to_string()))?;
        train_s = t0.elapsed().as_secs_f64();
        Ok(())
    };
    let r = llada_zoo::featdraft::train(&target, &lane, &req, other.as_ref(), save, &pb)?;
    let (total, examples, held_ce) = (r.total, r.examples, r.held_ce);
    let pct = |n: usize| 100.0 * n as f64 / total.max(1) as f64;
    println!(
        "feature head: hidden {}, {} ids, {examples} positions, {:.1} min; held-out cross-entropy {held_ce:.3}; top-1 agreement with the target on held-out prose: {:.1}% ({total} positions){}; wrote {}",
        a.hidden,
        a.vocab.min(target.config.vocab),
        train_s / 60.0,
        pct(r.agree),
        a.compare
            .as_ref()
            .map(|n| format!(", {n}: {:.1}%", pct(r.agree_other)))
            .unwrap_or_default(),
        a.out.display()
    );
    Ok(())
}
