//! Drafters for speculative decoding, by name: `ngram` (prompt lookup), a draft model (path,
//! shipped name or alias) sharing the target's token ids, `self` / `self:HEAD` (the target's
//! first layers plus a trained head), `feature` / `feature:HEAD` (a head drafting from the
//! target's final features), and `ngram+SOURCE` (prompt lookup merged into SOURCE's trees);
//! and the early-exit probe that ships with a draft (`probe.json` beside it).

use crate::error::{invalid, Error, Result};
use crate::models;
use llada_decode::speculative::drafter::{Drafter, HybridDrafter, ModelDrafter, NgramDrafter};
use llada_decode::speculative::featdraft::{FeatureDrafter, FeatureHead, FeatureModel};
use llada_decode::speculative::prune::ExitProbe;
use llada_decode::speculative::selfdraft::{SelfDrafter, SelfHead};
use llada_kernels::{GgmlType, QMatrix};
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use std::path::{Path, PathBuf};

/// A loaded drafter: the n-gram drafter, a draft model, the target's own first layers with a
/// trained head, a head drafting from the target's features, or any of those with prompt
/// lookup merged in.
pub enum DraftSource {
    Ngram,
    Model(Box<Model>),
    SelfDraft(SelfHead),
    /// A feature head, its matrices built (and counted as the drafter's weights) at load.
    Feature(Box<FeatureModel>),
    Hybrid(Box<DraftSource>),
}

/// What `--draft-quantize` does by default: a draft's proposals cost its weight reads (one
/// forward per expanded node, one row or a few), and f16 checkpoints are computed in f32, so
/// Q8_0 reads a quarter of the bytes. Measured (`smollm2-draft`, chain, 64 tokens,
/// alternated twice): drafting 6.1–6.2 → 3.4 ms per verify pass, the same tokens accepted.
pub const DRAFT_QUANT: &str = "q8_0";

/// Where `--draft self` finds its head (a shipped file, [`models::locate`]).
pub const SELF_HEAD: &str = "models/smollm2-selfdraft.safetensors";

/// Where `--draft feature` finds its head.
pub const FEATURE_HEAD: &str = "models/smollm2-featdraft/head.safetensors";

/// A requantization type by name (any block-quantized GGML type: `q8_0`, `q4_k`, `q6_k`, …);
/// `flag` names the option in the error.
pub fn parse_quant(flag: &str, s: Option<&str>) -> Result<Option<GgmlType>> {
    match s {
        None => Ok(None),
        Some(s) => match GgmlType::from_name(s).filter(|t| QMatrix::supports(*t)) {
            Some(t) => Ok(Some(t)),
            None => invalid!(
                "{flag} {s}: choose one of {}",
                GgmlType::all()
                    .iter()
                    .filter(|t| t.is_quantized())
                    .map(|t| t.name().to_ascii_lowercase())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    }
}

/// `--draft-quantize`: a matrix type, or `none` to compute the checkpoint as stored.
pub fn draft_quant(s: &str) -> Result<Option<GgmlType>> {
    parse_quant("--draft-quantize", Some(s).filter(|s| *s != "none"))
}

/// The head file a `feature` / `feature:PATH` drafter name points at (`None`: another kind).
pub fn feature_head_path(name: &str) -> Option<PathBuf> {
    match name {
        "feature" => Some(models::locate(Path::new(FEATURE_HEAD))),
        _ => name
            .strip_prefix("feature:")
            .map(|p| models::locate(Path::new(p))),
    }
}

/// A draft model's token ids mean the same as the target's only with one tokenizer: the
/// vocabularies must match.
pub fn same_token_ids(draft_path: &Path, draft: &Model, target: &Model) -> Result<()> {
    if draft.config.vocab != target.config.vocab {
        invalid!(
            "draft {} has {} token ids, the target {}: a draft must share the target's tokenizer",
            draft_path.display(),
            draft.config.vocab,
            target.config.vocab
        );
    }
    Ok(())
}

impl DraftSource {
    /// Load drafter `name` for `target`; `quant`: requantize a float draft checkpoint's
    /// matrices at load ([`draft_quant`]; an already quantized draft file keeps its types).
    pub fn load(name: &str, target: &Model, quant: Option<GgmlType>) -> Result<Self> {
        if name == "ngram" {
            return Ok(Self::Ngram);
        }
        if let Some(inner) = name.strip_prefix("ngram+") {
            return Ok(Self::Hybrid(Box::new(Self::load(inner, target, quant)?)));
        }
        if name == "self" || name.starts_with("self:") {
            let p = models::locate(Path::new(name.strip_prefix("self:").unwrap_or(SELF_HEAD)));
            let head = SelfHead::load(&p, target).map_err(|e| {
                Error::Invalid(format!("{e} (train one with `llada train-self-draft`)"))
            })?;
            if let Some(i) = target.weights.layers[..head.layers]
                .iter()
                .position(|l| l.is_none())
            {
                invalid!(
                    "self-drafting runs the target's first {} layers, but layer {i} is streamed under this memory budget",
                    head.layers
                );
            }
            return Ok(Self::SelfDraft(head));
        }
        if let Some(p) = feature_head_path(name) {
            let head = FeatureHead::load(&p, target).map_err(|e| {
                Error::Invalid(format!("{e} (train one with `llada train-feature-draft`)"))
            })?;
            return Ok(Self::Feature(Box::new(FeatureModel::new(
                target, head, quant,
            )?)));
        }
        let path = models::resolve(name, true)?;
        let opts = LoadOptions {
            no_tokenizer: true,
            quantize: quant,
            quantize_floats_only: true,
            ..Default::default()
        };
        let m = crate::load::load_model(&path, &opts).map_err(|e| match e {
            Error::Model(m) => Error::Invalid(format!("loading draft {}: {m}", path.display())),
            e => e,
        })?;
        same_token_ids(&path, &m, target)?;
        Ok(Self::Model(Box::new(m)))
    }

    /// Whether the drafter drafts from the target's features (not on AHASD's draft lane).
    pub fn reads_features(&self) -> bool {
        match self {
            Self::Feature(..) => true,
            Self::Hybrid(inner) => inner.reads_features(),
            _ => false,
        }
    }

    /// Drafters no probe is trained for (prompt lookup, the self-drafter), `ngram+` stripped.
    pub fn probe_less(name: &str) -> bool {
        let base = name.strip_prefix("ngram+").unwrap_or(name);
        base == "ngram" || base == "self" || base.starts_with("self:")
    }

    /// The early-exit probe shipped with draft `name` (`probe.json` in its directory, or
    /// beside a feature head's file); `None` when it has none.
    pub fn probe(name: &str) -> Result<Option<ExitProbe>> {
        if let Some(inner) = name.strip_prefix("ngram+") {
            return Self::probe(inner);
        }
        if Self::probe_less(name) {
            return Ok(None);
        }
        let p = if let Some(head) = feature_head_path(name) {
            head.with_file_name("probe.json")
        } else {
            let path = models::resolve(name, true)?;
            if path.is_dir() {
                path.join("probe.json")
            } else {
                path.with_file_name("probe.json")
            }
        };
        if !p.exists() {
            return Ok(None);
        }
        Ok(Some(ExitProbe::load(&p)?))
    }

    /// The drafter proposing for `target`, running on `lane` (drafts sampled at `temperature`
    /// where the drafter samples).
    pub fn drafter<'a>(
        &'a self,
        target: &'a Model,
        lane: &'a Lane,
        temperature: f32,
    ) -> Result<Box<dyn Drafter + 'a>> {
        Ok(match self {
            Self::Ngram => Box::new(NgramDrafter),
            Self::Model(m) => Box::new(ModelDrafter::new(m, lane, temperature)),
            Self::SelfDraft(h) => Box::new(SelfDrafter::new(target, lane, h.clone(), temperature)?),
            Self::Feature(m) => Box::new(FeatureDrafter::new(target, m, temperature)),
            Self::Hybrid(inner) => Box::new(HybridDrafter {
                inner: inner.drafter(target, lane, temperature)?,
            }),
        })
    }
}

/// [`DRAFT_QUANT`] as a type.
pub const DRAFT_QUANT_TYPE: GgmlType = GgmlType::Q8_0;
