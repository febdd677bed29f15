//! Loading a model from a GGUF file or an HF directory: read the config and the tokenizer,
//! check them against the weights, plan which weights stay resident under the memory budget
//! and build those (`layer_builder`); the rest is handed to the weight store.
//!
//! Invariants: every layer and the LM head are built once at load, resident or not, so a bad
//! tensor fails here naming its file and tensor rather than mid-generation; a tensor's file
//! pages are released once it is repacked; tensors of layers past the config's count and
//! tokenizer ids outside the vocabulary are errors.

use crate::config::{Arch, ModelConfig};
use crate::layer_builder::{vec1, Recipe};
use crate::store::{Budget, Plan, StagedSource, WeightStore};
use crate::tensor_names::{layer_of, Scheme};
use crate::weights::{Embedding, Layer, Linear, Weights};
use crate::ModelError;
use llada_formats::gguf::GgufFile;
use llada_formats::hf::HfDir;
use llada_formats::tokenizer::{ChatTemplate, Tokenizer};
use llada_formats::{FormatError, TensorSource};
use llada_kernels::GgmlType;
use std::path::Path;
use std::sync::Arc;

pub use crate::export::{export_layers_f32, ExportedTensor};
pub use crate::model::{Model, ModelFormat};

/// Options for [`Model::load`].
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Requantize every matrix to this type at load (e.g. Q8_0 for bf16 checkpoints).
    pub quantize: Option<GgmlType>,
    /// Apply [`Self::quantize`] only to a checkpoint of float matrices: a file whose matrices
    /// are already block-quantized (a Q4_K_M GGUF) keeps its own types (a draft model's
    /// default: requantizing would cost quality and, to Q8_0, bytes).
    pub quantize_floats_only: bool,
    /// Skip loading the tokenizer.
    pub no_tokenizer: bool,
    /// Dequantize every matrix to f32 at load: reference precision (no 8-bit activation
    /// quantization), at 4–8x the memory and lower speed.
    pub dequantize: bool,
    /// Memory budget for weights in bytes: what does not fit stays in the file and is streamed
    /// for every forward pass (see [`crate::store`]). `None`: everything resident.
    pub mem_budget: Option<Budget>,
    /// Emulated storage read bandwidth (bytes/s) for streamed weights (a phone's flash on a
    /// machine with a faster disk); labelled as emulation wherever it is reported.
    pub storage_bw: Option<f64>,
}

/// Whether any tensor of `src` is block-quantized (a quantized checkpoint).
fn holds_quantized(src: &dyn TensorSource) -> bool {
    src.names()
        .iter()
        .any(|n| src.get(n).is_some_and(|v| v.ty.is_quantized()))
}

/// Tensors of layers beyond the config's layer count mean the config and the weights disagree
/// (the extra layers would be silently ignored): an error naming the first such tensor and the
/// config key. `config` is the file that holds `key`.
fn check_no_extra_layers(
    src: &dyn TensorSource,
    scheme: Scheme,
    n_layers: usize,
    config: &Path,
    key: &str,
) -> Result<(), ModelError> {
    let extra = src
        .names()
        .into_iter()
        .filter_map(|n| layer_of(scheme, &n).map(|l| (l, n)))
        .filter(|&(l, _)| l >= n_layers as u64)
        .min();
    if let Some((layer, name)) = extra {
        let file = src
            .get(&name)
            .map_or_else(|| src.path().to_path_buf(), |v| v.file);
        return Err(FormatError::corrupt(
            &file,
            format!(
                "tensor '{name}' belongs to layer {layer}, but {} sets {key} = {n_layers} \
                 (layers 0..{n_layers}): the config and the weights disagree",
                config.display()
            ),
        )
        .into());
    }
    Ok(())
}

/// The tokenizer's base vocabulary and the ids generation relies on (BOS, the stop ids) must
/// index the model's vocabulary; checked at load, so a mismatched tokenizer fails here (naming
/// its file) rather than mid-generation. `what` says where the ids live in the tokenizer's
/// file. Added tokens past the vocabulary are allowed — Llama-2's HF checkpoints add `<pad>` at
/// 32 000 with `vocab_size` 32 000 — and a prompt that contains one is refused by the forward
/// pass ("token id … is outside the vocabulary").
fn check_tokenizer_ids(t: &Tokenizer, c: &ModelConfig, what: &str) -> Result<(), ModelError> {
    let outside = |id: u32, which: &str| -> ModelError {
        FormatError::Tokenizer {
            path: t.path.clone(),
            what: format!(
                "{which} {id} is outside the model's vocabulary ({} tokens)",
                c.vocab
            ),
        }
        .into()
    };
    match t.max_base_token_id() {
        Some(id) if (id as usize) >= c.vocab => {
            return Err(outside(id, &format!("{what} holds token id")))
        }
        Some(_) => {}
        None => {
            return Err(FormatError::Tokenizer {
                path: t.path.clone(),
                what: "the vocabulary is empty".into(),
            }
            .into())
        }
    }
    for &id in t.stop_ids.iter().chain(&t.bos_id) {
        if id as usize >= c.vocab {
            return Err(outside(
                id,
                "its special token (BOS or a stop token) has id",
            ));
        }
    }
    Ok(())
}

impl Model {
    /// Load a GGUF file or an HF directory.
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Self, ModelError> {
        if path.is_dir() {
            Self::load_hf(path, opts)
        } else {
            Self::load_gguf(path, opts)
        }
    }

    fn type_summary(src: &dyn TensorSource) -> Vec<(String, usize, u64)> {
        let mut m: std::collections::BTreeMap<String, (usize, u64)> = Default::default();
        for n in src.names() {
            if let Some(v) = src.get(&n) {
                let e = m.entry(v.ty.name().to_string()).or_default();
                e.0 += 1;
                e.1 += v.len as u64;
            }
        }
        m.into_iter().map(|(k, (c, b))| (k, c, b)).collect()
    }

    fn load_gguf(path: &Path, opts: &LoadOptions) -> Result<Self, ModelError> {
        let mut g = GgufFile::open(path)?;
        let config = ModelConfig::from_gguf(&g)?;
        let key = format!("{}.block_count", config.arch.name());
        check_no_extra_layers(&g, Scheme::Gguf, config.n_layers, path, &key)?;
        let permuted = matches!(config.arch, Arch::Llama | Arch::LLaDA);
        let tokenizer = if opts.no_tokenizer {
            None
        } else {
            let t = Tokenizer::from_gguf(&g)?;
            check_tokenizer_ids(&t, &config, "'tokenizer.ggml.tokens'")?;
            Some(t)
        };
        // The vocabulary's arrays (one `Value` per token and merge) are not read again once
        // the tokenizer and the config are built; the file stays open as the tensor source for
        // the model's life, so they would otherwise stay in memory with it.
        for k in [
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.merges",
            "tokenizer.ggml.token_type",
        ] {
            g.metadata.remove(k);
        }
        let g = Arc::new(g);
        let tensor_types = Self::type_summary(&*g);
        let (weights, store) = Self::load_weights(g, &config, opts, Scheme::Gguf, permuted)?;
        Ok(Self {
            tensor_types,
            config,
            weights,
            tokenizer,
            path: path.to_path_buf(),
            format: ModelFormat::Gguf,
            store,
        })
    }

    fn load_hf(dir: &Path, opts: &LoadOptions) -> Result<Self, ModelError> {
        let hf = Arc::new(HfDir::open(dir)?);
        let config = ModelConfig::from_hf(&hf.config, &hf.config_path())?;
        let arch = config.arch;
        let key = if arch == Arch::LLaDA {
            "n_layers"
        } else {
            "num_hidden_layers"
        };
        check_no_extra_layers(
            &*hf,
            Scheme::Hf(arch),
            config.n_layers,
            &hf.config_path(),
            key,
        )?;
        let tokenizer = if opts.no_tokenizer || !dir.join("tokenizer.json").exists() {
            None
        } else {
            let eos: Vec<u32> = config.eos_id.into_iter().collect();
            let default = match arch {
                Arch::LLaDA => ChatTemplate::Llama3 {
                    bos: "<|startoftext|>".into(),
                },
                Arch::Llama => ChatTemplate::Raw,
                _ => ChatTemplate::ChatMl {
                    default_system: None,
                },
            };
            let t = Tokenizer::from_hf_dir(dir, &eos, default)?;
            check_tokenizer_ids(&t, &config, "its vocabulary")?;
            Some(t)
        };
        let tensor_types = Self::type_summary(&*hf);
        let (weights, store) = Self::load_weights(hf, &config, opts, Scheme::Hf(arch), false)?;
        Ok(Self {
            tensor_types,
            config,
            weights,
            tokenizer,
            path: dir.to_path_buf(),
            format: ModelFormat::HfDir,
            store,
        })
    }

    fn load_weights(
        src: Arc<dyn TensorSource + Send + Sync>,
        c: &ModelConfig,
        opts: &LoadOptions,
        scheme: Scheme,
        permuted: bool,
    ) -> Result<(Weights, Option<WeightStore>), ModelError> {
        let d = c.d_model;
        let quant = if opts.dequantize {
            Some(GgmlType::F32)
        } else if opts.quantize_floats_only && holds_quantized(&*src) {
            None
        } else {
            opts.quantize
        };
        let (emb, norm, _) = scheme.globals();
        let embed_view = src.require(emb)?;
        embed_view.expect_shape(&[c.embedding_rows(), d])?;
        let recipe = Recipe {
            src: src.clone(),
            scheme,
            quant,
            permuted,
        };
        let mut plan = residency(&recipe, c, opts.mem_budget);
        let layers = load_layers(&recipe, c, &mut plan)?;
        let lm_head = load_head(&recipe, c, &mut plan)?;
        let weights = Weights {
            embed: Embedding::new(embed_view),
            vocab_map: c
                .vocab_ids
                .clone()
                .map(|ids| crate::weights::VocabMap::new(ids, c.vocab)),
            layers,
            final_norm: vec1(&*src, norm, d)?,
            lm_head,
        };
        // Streamed units are read into staging buffers with one pread per layer (or tensor).
        let staged_src = Arc::new(StagedSource::new(src.clone()));
        let staged = Recipe {
            src: staged_src.clone(),
            ..recipe
        };
        let store = (!plan.streams_nothing())
            .then(|| WeightStore::new(staged, Some(staged_src), plan, opts.storage_bw));
        Ok((weights, store))
    }
}

/// Which layers / head stay resident under the budget (all of them without one).
fn residency(recipe: &Recipe, c: &ModelConfig, budget: Option<Budget>) -> Plan {
    let layer_bytes: Vec<u64> = (0..c.n_layers)
        .map(|i| recipe.layer_file_bytes(c, i))
        .collect();
    let (_, head_bytes) = recipe.head(c);
    let total = layer_bytes.iter().sum::<u64>() + head_bytes;
    match budget {
        Some(b) => crate::store::plan(&layer_bytes, head_bytes, b.bytes(total)),
        None => Plan::all_resident(&layer_bytes, head_bytes),
    }
}

/// Build every layer: the resident ones are kept; the streamed ones are validated (a bad
/// tensor must fail at load, not mid-generation) and dropped, their in-memory and arena sizes
/// recorded in `plan` (they size the staging buffers).
fn load_layers(
    recipe: &Recipe,
    c: &ModelConfig,
    plan: &mut Plan,
) -> Result<Vec<Option<Layer>>, ModelError> {
    let src = &recipe.src;
    let mut layers = Vec::with_capacity(c.n_layers);
    for i in 0..c.n_layers {
        layers.push(if plan.resident_layers[i] {
            let l = recipe.build_layer(c, i)?;
            // Repacked into our own buffers: the file's pages are no longer needed.
            for t in recipe.layer_tensors(c, i) {
                src.release(&t);
            }
            Some(l)
        } else {
            let (l, arena) = llada_kernels::recycle::measure(|| recipe.build_layer(c, i));
            let l = l?;
            plan.unit_mem_bytes = plan.unit_mem_bytes.max(l.weight_bytes() as u64);
            plan.unit_arena_bytes = plan.unit_arena_bytes.max(arena as u64);
            for t in recipe.layer_tensors(c, i) {
                src.release(&t);
            }
            None
        });
    }
    Ok(layers)
}

/// Build the LM head when it is resident; else validate its shape, then its bytes chunk by
/// chunk as they will be streamed (never the whole head at once), recording the chunks' sizes
/// in `plan`.
fn load_head(
    recipe: &Recipe,
    c: &ModelConfig,
    plan: &mut Plan,
) -> Result<Option<Linear>, ModelError> {
    let src = &recipe.src;
    if plan.resident_head {
        let h = recipe.build_head(c)?;
        if !c.tied_embeddings {
            src.release(recipe.head_name(c));
        }
        return Ok(Some(h));
    }
    src.require(recipe.head_name(c))?
        .expect_shape(&[c.embedding_rows(), c.d_model])?;
    for part in crate::store::head_chunks(c.embedding_rows(), plan.head_chunks) {
        if let crate::store::Part::HeadRows(r0, r1) = part {
            let (h, arena) = llada_kernels::recycle::measure(|| recipe.build_head_rows(c, r0, r1));
            let h = h?;
            plan.unit_mem_bytes = plan.unit_mem_bytes.max(h.weight_bytes() as u64);
            plan.unit_arena_bytes = plan.unit_arena_bytes.max(arena as u64);
            src.release(recipe.head_name(c));
        }
    }
    Ok(None)
}
