//! Calibrating a draft's early-exit verification probe: speculative generations over training
//! prompts log the target's middle-layer state of every drafted node and whether it was
//! accepted; a threshold fitted on three quarters keeps the asked recall, the last quarter
//! measures it (`llada train-probe`).

use crate::corpora::prose_files;
use crate::error::{bail, Context, Error, Result};
use crate::progress::Progress;
use llada::draft::{draft_quant, feature_head_path, DraftSource, DRAFT_QUANT};
use llada_decode::speculative::drafter::TreeShape;
use llada_decode::speculative::prune::{self, ExitProbe, ProbeData};
use llada_decode::speculative::{generate as spec_generate, SpecConfig};
use llada_decode::SamplingParams;
use llada_model::Model;
use llada_runtime::Lane;
use std::path::PathBuf;

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
        draft_s: 0.0,
    };

/// What to calibrate: the probe of `draft` (a draft model or a feature head) at the target's
/// layer `layer` (`None`: the middle), on `prompts` training windows of 32 tokens with `tokens`
/// generated each, keeping `recall` of the accepted nodes.
#[derive(Clone, Debug)]
pub struct ProbeRequest {
    pub draft: String,
    pub layer: Option<usize>,
    pub prompts: usize,
    pub tokens: usize,
    pub recall: f64,
}

impl ProbeRequest {
    /// The options no calibration can use, refused before any work.
    pub fn check(&self) -> Result<()> {
        if !(0.5..=1.0).contains(&self.recall) {
            bail!("--recall must be in [0.5, 1]");
        }
        if self.prompts < 4 {
            bail!("--prompts must be at least 4 (a quarter is held out to measure recall)");
        }
        Ok(())
    }
}

/// A calibrated probe, where it was written, and the nodes it was fitted and checked on.
#[derive(Debug)]
pub struct Calibration {
    pub probe: ExitProbe,
    pub path: PathBuf,
    pub layer: usize,
    pub layers: usize,
    /// Fitting and held-out nodes, and how many of each were accepted.
    pub fit_nodes: usize,
    pub fit_accepted: usize,
    pub held_nodes: usize,
    pub held_accepted: usize,
}

/// Calibrate the probe of `a.draft` against `target` and write it (`probe.json` in the draft
/// model's directory, or beside the feature head), the target's dense lane on `threads`.
pub fn calibrate(
    target: &Model,
    a: &ProbeRequest,
    threads: usize,
    progress: &dyn Progress,
) -> Result<Calibration> {
    a.check()?;
    let layers = target.config.n_layers;
    let layer = a.layer.unwrap_or(layers / 2);
    if layer + 1 >= layers {
        bail!("--layer must be below the last layer ({})", layers - 1);
    }
    let tok = target
        .tokenizer
        .as_ref()
        .context("the target has no tokenizer")?;
    let files = prose_files()?;
    let corpus =
        llada_train::prose::Corpus::load(&files, &tok.inner, target.config.eos_id.unwrap_or(0))?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    let prompts = corpus.windows(false, a.prompts, 32, &mut rng);
    // Calibrated on the draft as `generate` and `bench spec` run it by default.
    let src = DraftSource::load(&a.draft, target, draft_quant(DRAFT_QUANT)?)?;
    let draft_dir = match &src {
        DraftSource::Ngram | DraftSource::SelfDraft(_) | DraftSource::Hybrid(_) => {
            bail!(
                "the probe ships with a draft model directory or a feature head, not `{}`",
                a.draft
            )
        }
        DraftSource::Model(_) => llada::models::resolve(&a.draft, true)?,
        // Beside the head file.
        DraftSource::Feature(..) => feature_head_path(&a.draft)
            .and_then(|p| p.parent().map(|d| d.to_path_buf()))
            .context("a feature head's directory")?,
    };
    let lane = Lane::new("dense", threads)?;
    let dlane = Lane::new("draft", 1)?;
    progress.set_len(prompts.len() as u64);
    let split = prompts.len() * 3 / 4;
    let (mut fit_data, mut held) = (ProbeData::default(), ProbeData::default());
    for (i, p) in prompts.iter().enumerate() {
        let log = std::sync::Arc::new(std::sync::Mutex::new(ProbeData::default()));
        let mut d = src.drafter(target, &dlane, 0.0)?;
        spec_generate(
            target,
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
        let got = std::mem::take(&mut *log.lock().map_err(|_| Error::Invalid("poisoned".into()))?);
        let dst = if i < split { &mut fit_data } else { &mut held };
        dst.x.extend(got.x);
        dst.y.extend(got.y);
        progress.inc(1);
    }
    progress.finish();
    if !fit_data.y.iter().any(|y| *y) {
        bail!("no drafted node was accepted during calibration: nothing to fit");
    }
    let probe = prune::fit(layer, &fit_data, &held, a.recall);
    let path = draft_dir.join("probe.json");
    probe.save(&path)?;
    let accepted = |d: &ProbeData| d.y.iter().filter(|y| **y).count();
    Ok(Calibration {
        layer,
        layers,
        fit_nodes: fit_data.y.len(),
        fit_accepted: accepted(&fit_data),
        held_nodes: held.y.len(),
        held_accepted: accepted(&held),
        probe,
        path,
    })
}
