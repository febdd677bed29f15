//! Loading a model from a GGUF file or an HF directory.

use crate::config::{Arch, ModelConfig};
use crate::weights::{Embedding, Layer, Linear, Projection, Weights};
use crate::ModelError;
use llada_formats::gguf::GgufFile;
use llada_formats::hf::HfDir;
use llada_formats::tokenizer::{ChatTemplate, Tokenizer};
use llada_formats::{FormatError, TensorSource, TensorView};
use llada_kernels::GgmlType;
use llada_kernels::QMatrix;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Options for [`Model::load`].
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Requantize every matrix to this type at load (e.g. Q8_0 for bf16 checkpoints).
    pub quantize: Option<GgmlType>,
    /// Skip loading the tokenizer.
    pub no_tokenizer: bool,
    /// Dequantize every matrix to f32 at load: reference precision (no 8-bit activation
    /// quantization), at 4–8x the memory and lower speed.
    pub dequantize: bool,
    /// Memory budget for weights in bytes: what does not fit stays in the file and is streamed
    /// for every forward pass (see [`crate::store`]). `None`: everything resident.
    pub mem_budget: Option<crate::store::Budget>,
    /// Emulated storage read bandwidth (bytes/s) for streamed weights (a phone's flash on a
    /// machine with a faster disk); labelled as emulation wherever it is reported.
    pub storage_bw: Option<f64>,
}

/// Where the model came from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelFormat {
    Gguf,
    HfDir,
}

/// A loaded model: config, weights and (usually) its tokenizer.
pub struct Model {
    pub config: ModelConfig,
    pub weights: Weights,
    pub tokenizer: Option<Tokenizer>,
    pub path: PathBuf,
    pub format: ModelFormat,
    /// (type name, tensor count, bytes) over all stored tensors.
    pub tensor_types: Vec<(String, usize, u64)>,
    /// Streaming state when a memory budget keeps some weights in the file.
    pub store: Option<crate::store::WeightStore>,
}

/// Tensor names of one layer in a given naming scheme.
struct Names {
    attn_norm: String,
    q: String,
    k: String,
    v: String,
    o: String,
    ffn_norm: String,
    gate: String,
    up: String,
    down: String,
    bias: [String; 3],
}

/// The tensor naming scheme of a source (for rebuilding streamed layers).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scheme {
    Gguf,
    Hf(Arch),
}

impl Scheme {
    /// What every tensor name of layer `N` starts with, before `N.`.
    fn layer_prefix(self) -> &'static str {
        match self {
            Scheme::Gguf => "blk.",
            Scheme::Hf(Arch::LLaDA) => "model.transformer.blocks.",
            Scheme::Hf(_) => "model.layers.",
        }
    }
    fn names(self, i: usize) -> Names {
        match self {
            Scheme::Gguf => gguf_names(i),
            Scheme::Hf(a) => hf_names(a, i),
        }
    }
    fn globals(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Scheme::Gguf => ("token_embd.weight", "output_norm.weight", "output.weight"),
            Scheme::Hf(Arch::LLaDA) => (
                "model.transformer.wte.weight",
                "model.transformer.ln_f.weight",
                "model.transformer.ff_out.weight",
            ),
            Scheme::Hf(_) => (
                "model.embed_tokens.weight",
                "model.norm.weight",
                "lm_head.weight",
            ),
        }
    }
}

/// Everything needed to (re)build a layer from its source: used at load for resident layers
/// and on the prefetch thread for streamed ones.
pub(crate) struct Recipe {
    pub src: Arc<dyn TensorSource + Send + Sync>,
    pub scheme: Scheme,
    pub quant: Option<GgmlType>,
    pub permuted: bool,
}

impl Recipe {
    /// Tensor names of layer `i`.
    pub fn layer_tensors(&self, c: &ModelConfig, i: usize) -> Vec<String> {
        let n = self.scheme.names(i);
        let mut v = vec![
            n.attn_norm,
            n.q,
            n.k,
            n.v,
            n.o,
            n.ffn_norm,
            n.gate,
            n.up,
            n.down,
        ];
        if c.qkv_bias {
            v.extend(n.bias);
        }
        v
    }
    /// Bytes layer `i` occupies in the file.
    pub fn layer_file_bytes(&self, c: &ModelConfig, i: usize) -> u64 {
        self.layer_tensors(c, i)
            .iter()
            .filter_map(|t| self.src.get(t))
            .map(|v| v.len as u64)
            .sum()
    }
    /// The LM head's tensor name (the embedding when tied).
    pub fn head_name(&self, c: &ModelConfig) -> &'static str {
        let (emb, _, head) = self.scheme.globals();
        if c.tied_embeddings {
            emb
        } else {
            head
        }
    }
    /// The LM head's name and file bytes. (`get` of a staged source reads the tensor: call
    /// this on the file's own source, or use [`Self::head_name`].)
    pub fn head(&self, c: &ModelConfig) -> (&'static str, u64) {
        let name = self.head_name(c);
        (name, self.src.get(name).map_or(0, |v| v.len as u64))
    }
    pub fn build_head(&self, c: &ModelConfig) -> Result<Linear, ModelError> {
        let (name, _) = self.head(c);
        let v = self.src.require(name)?;
        v.expect_shape(&[c.embedding_rows(), c.d_model])?;
        Linear::from_view(&v, self.quant)
    }
    /// Build rows `[r0, r1)` of the LM head (a streamed head is read in such chunks).
    pub fn build_head_rows(
        &self,
        c: &ModelConfig,
        r0: usize,
        r1: usize,
    ) -> Result<Linear, ModelError> {
        self.build_head_view(c, &self.head_rows(c, r0, r1)?, r1 - r0)
    }
    /// The bytes of rows `[r0, r1)` of the LM head. Only the rows are read (a staged source
    /// would read the whole tensor for `get`); the full shape is checked at load.
    pub fn head_rows(
        &self,
        c: &ModelConfig,
        r0: usize,
        r1: usize,
    ) -> Result<TensorView, ModelError> {
        let name = self.head_name(c);
        self.src.get_rows(name, r0, r1).ok_or_else(|| {
            ModelError::Other(format!(
                "{}: rows {r0}..{r1} of tensor '{name}' cannot be read",
                self.src.path().display()
            ))
        })
    }
    /// Build `rows` rows of the LM head from their bytes `v`.
    pub fn build_head_view(
        &self,
        c: &ModelConfig,
        v: &TensorView,
        rows: usize,
    ) -> Result<Linear, ModelError> {
        v.expect_shape(&[rows, c.d_model])?;
        Linear::from_view(v, self.quant)
    }
    /// Build layer `i` (reads and repacks its tensors).
    pub fn build_layer(&self, c: &ModelConfig, i: usize) -> Result<Layer, ModelError> {
        self.build_layer_from(&*self.src, c, i)
    }
    /// Build layer `i` from `src` (the recipe's source, or its layer staged in one read).
    pub fn build_layer_from(
        &self,
        src: &dyn TensorSource,
        c: &ModelConfig,
        i: usize,
    ) -> Result<Layer, ModelError> {
        let d = c.d_model;
        let q = self.quant;
        let n = self.scheme.names(i);
        let perm_q = self.permuted.then_some(c.n_heads);
        let perm_k = self.permuted.then_some(c.n_kv_heads);
        let bias = |name: &str,
                    len: usize,
                    heads: Option<usize>|
         -> Result<Option<Vec<f32>>, ModelError> {
            if !c.qkv_bias {
                return Ok(None);
            }
            let mut v = src.require(name)?;
            v.expect_shape(&[len])?;
            if let Some(h) = heads {
                // Treat the bias as a [len × 1] matrix for the row permutation.
                v.shape = vec![len, 1];
                v = unpermute_rows(&v, h)?;
                v.shape = vec![len];
            }
            Ok(Some(v.to_f32()))
        };
        Ok(Layer {
            attn_norm: vec1(src, &n.attn_norm, d)?,
            qkv: projection(
                src,
                &[
                    (&n.q, c.q_dim(), perm_q),
                    (&n.k, c.kv_dim(), perm_k),
                    (&n.v, c.kv_dim(), None),
                ],
                d,
                q,
            )?,
            bq: bias(&n.bias[0], c.q_dim(), perm_q)?,
            bk: bias(&n.bias[1], c.kv_dim(), perm_k)?,
            bv: bias(&n.bias[2], c.kv_dim(), None)?,
            wo: matrix(src, &n.o, d, c.q_dim(), q, None)?,
            ffn_norm: vec1(src, &n.ffn_norm, d)?,
            gate_up: projection(src, &[(&n.gate, c.ffn, None), (&n.up, c.ffn, None)], d, q)?,
            w_down: matrix(src, &n.down, d, c.ffn, q, None)?,
        })
    }
}

fn gguf_names(i: usize) -> Names {
    let p = format!("{}{i}.", Scheme::Gguf.layer_prefix());
    Names {
        attn_norm: format!("{p}attn_norm.weight"),
        q: format!("{p}attn_q.weight"),
        k: format!("{p}attn_k.weight"),
        v: format!("{p}attn_v.weight"),
        o: format!("{p}attn_output.weight"),
        ffn_norm: format!("{p}ffn_norm.weight"),
        gate: format!("{p}ffn_gate.weight"),
        up: format!("{p}ffn_up.weight"),
        down: format!("{p}ffn_down.weight"),
        bias: [
            format!("{p}attn_q.bias"),
            format!("{p}attn_k.bias"),
            format!("{p}attn_v.bias"),
        ],
    }
}

fn hf_names(arch: Arch, i: usize) -> Names {
    if arch == Arch::LLaDA {
        let p = format!("{}{i}.", Scheme::Hf(arch).layer_prefix());
        Names {
            attn_norm: format!("{p}attn_norm.weight"),
            q: format!("{p}q_proj.weight"),
            k: format!("{p}k_proj.weight"),
            v: format!("{p}v_proj.weight"),
            o: format!("{p}attn_out.weight"),
            ffn_norm: format!("{p}ff_norm.weight"),
            gate: format!("{p}ff_proj.weight"),
            up: format!("{p}up_proj.weight"),
            down: format!("{p}ff_out.weight"),
            bias: [
                format!("{p}q_proj.bias"),
                format!("{p}k_proj.bias"),
                format!("{p}v_proj.bias"),
            ],
        }
    } else {
        let p = format!("{}{i}.", Scheme::Hf(arch).layer_prefix());
        Names {
            attn_norm: format!("{p}input_layernorm.weight"),
            q: format!("{p}self_attn.q_proj.weight"),
            k: format!("{p}self_attn.k_proj.weight"),
            v: format!("{p}self_attn.v_proj.weight"),
            o: format!("{p}self_attn.o_proj.weight"),
            ffn_norm: format!("{p}post_attention_layernorm.weight"),
            gate: format!("{p}mlp.gate_proj.weight"),
            up: format!("{p}mlp.up_proj.weight"),
            down: format!("{p}mlp.down_proj.weight"),
            bias: [
                format!("{p}self_attn.q_proj.bias"),
                format!("{p}self_attn.k_proj.bias"),
                format!("{p}self_attn.v_proj.bias"),
            ],
        }
    }
}

/// Undo llama.cpp's q/k row permutation (`convert_hf_to_gguf.py`'s `LlamaModel.permute`, applied
/// to llama and llada): stored row `h·D + 2j + i` is HF row `h·D + i·D/2 + j`. Works on whole
/// rows, so on any (quantized) type; biases are 1-row-per-element and handled the same way.
fn unpermute_rows(v: &TensorView, n_head: usize) -> Result<TensorView, ModelError> {
    let rows = v.shape[0];
    if n_head == 0 || !rows.is_multiple_of(n_head) || !(rows / n_head).is_multiple_of(2) {
        return Err(FormatError::corrupt(
            &v.file,
            format!(
                "tensor '{}': {rows} rows do not split into {n_head} heads",
                v.name
            ),
        )
        .into());
    }
    let hd = rows / n_head;
    let rb = v.len / rows;
    let src = v.bytes();
    let mut out = vec![0u8; v.len];
    for h in 0..n_head {
        for i in 0..2 {
            for j in 0..hd / 2 {
                let hf = h * hd + i * hd / 2 + j;
                let st = h * hd + 2 * j + i;
                out[hf * rb..(hf + 1) * rb].copy_from_slice(&src[st * rb..(st + 1) * rb]);
            }
        }
    }
    let mut nv = v.clone();
    nv.len = out.len();
    nv.owner = Arc::new(out);
    nv.offset = 0;
    Ok(nv)
}

fn vec1(src: &dyn TensorSource, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    let v = src.require(name)?;
    v.expect_shape(&[n])?;
    Ok(v.to_f32())
}

/// Projections reading the same input (`(name, rows, unpermute heads)` each, `cols` wide),
/// fused into one matrix: repacked straight into one buffer when they share a kernel type (no
/// per-part copies: a streamed layer is rebuilt every pass), else built part by part and fused
/// by [`Projection::new`].
fn projection(
    src: &dyn TensorSource,
    parts: &[(&str, usize, Option<usize>)],
    cols: usize,
    requant: Option<GgmlType>,
) -> Result<Projection, ModelError> {
    let views = parts
        .iter()
        .map(|&(name, rows, heads)| matrix_view(src, name, rows, cols, heads))
        .collect::<Result<Vec<_>, _>>()?;
    let ty = views.first().map(|v| v.ty);
    if let Some(ty) = ty.filter(|&t| {
        QMatrix::supports(t) && requant.is_none_or(|r| r == t) && views.iter().all(|v| v.ty == t)
    }) {
        let stacked: Vec<_> = views
            .iter()
            .map(|v| (v.shape[0], v.owner.clone(), v.offset))
            .collect();
        let w = QMatrix::new_stacked(ty, cols, &stacked).map_err(|e| {
            let names: Vec<&str> = views.iter().map(|v| v.name.as_str()).collect();
            ModelError::Other(format!(
                "{}: tensors {}: {e}",
                src.path().display(),
                names.join(", ")
            ))
        })?;
        return Ok(Projection::Fused {
            w: Linear::Quant(w),
            splits: parts.iter().map(|p| p.1).collect(),
        });
    }
    Projection::new(
        views
            .iter()
            .map(|v| Linear::from_view(v, requant))
            .collect::<Result<Vec<_>, _>>()?,
    )
}

/// A `[rows × cols]` matrix's bytes, checked, with the rows of a GGUF Q/K projection put back
/// in head order.
fn matrix_view(
    src: &dyn TensorSource,
    name: &str,
    rows: usize,
    cols: usize,
    unpermute_heads: Option<usize>,
) -> Result<TensorView, ModelError> {
    let v = src.require(name)?;
    v.expect_shape(&[rows, cols])?;
    match unpermute_heads {
        Some(h) => unpermute_rows(&v, h),
        None => Ok(v),
    }
}

fn matrix(
    src: &dyn TensorSource,
    name: &str,
    rows: usize,
    cols: usize,
    requant: Option<GgmlType>,
    unpermute_heads: Option<usize>,
) -> Result<Linear, ModelError> {
    Linear::from_view(
        &matrix_view(src, name, rows, cols, unpermute_heads)?,
        requant,
    )
}

/// The layer a tensor belongs to under `scheme` (`blk.N.*`, `model.layers.N.*`,
/// `model.transformer.blocks.N.*`), if it is a layer tensor.
fn layer_of(scheme: Scheme, name: &str) -> Option<u64> {
    let rest = name.strip_prefix(scheme.layer_prefix())?;
    let (n, _) = rest.split_once('.')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Absurdly long digit strings saturate (still beyond any layer count).
    Some(n.parse().unwrap_or(u64::MAX))
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
    ) -> Result<(Weights, Option<crate::store::WeightStore>), ModelError> {
        let d = c.d_model;
        let quant = if opts.dequantize {
            Some(GgmlType::F32)
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
        // Which layers / head stay resident under the budget.
        let layer_bytes: Vec<u64> = (0..c.n_layers)
            .map(|i| recipe.layer_file_bytes(c, i))
            .collect();
        let (_, head_bytes) = recipe.head(c);
        let total = layer_bytes.iter().sum::<u64>() + head_bytes;
        let mut plan = match opts.mem_budget {
            Some(b) => crate::store::plan(&layer_bytes, head_bytes, b.bytes(total)),
            None => crate::store::Plan::all_resident(&layer_bytes, head_bytes),
        };
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
                // Validate now (a bad tensor must fail at load, not mid-generation), then drop;
                // its in-memory size sizes the staging buffers.
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
        let lm_head = if plan.resident_head {
            let h = recipe.build_head(c)?;
            if !c.tied_embeddings {
                src.release(recipe.head_name(c));
            }
            Some(h)
        } else {
            // Validate the shape, then the bytes chunk by chunk as they will be streamed (never
            // the whole head at once).
            src.require(recipe.head_name(c))?
                .expect_shape(&[c.embedding_rows(), d])?;
            for part in crate::store::head_chunks(c.embedding_rows(), plan.head_chunks) {
                if let crate::store::Part::HeadRows(r0, r1) = part {
                    let (h, arena) =
                        llada_kernels::recycle::measure(|| recipe.build_head_rows(c, r0, r1));
                    let h = h?;
                    plan.unit_mem_bytes = plan.unit_mem_bytes.max(h.weight_bytes() as u64);
                    plan.unit_arena_bytes = plan.unit_arena_bytes.max(arena as u64);
                    src.release(recipe.head_name(c));
                }
            }
            None
        };
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
        let staged_src = Arc::new(crate::store::StagedSource::new(src.clone()));
        let staged = Recipe {
            src: staged_src.clone(),
            ..recipe
        };
        let store = (!plan.streams_nothing()).then(|| {
            crate::store::WeightStore::new(staged, Some(staged_src), plan, opts.storage_bw)
        });
        Ok((weights, store))
    }

    /// Bytes of weights one decoding step reads (all layers + LM head), resident or streamed.
    pub fn bytes_per_token(&self) -> u64 {
        match &self.store {
            Some(st) => st.plan.total_bytes() + (self.weights.final_norm.len() * 4) as u64,
            None => {
                self.weights
                    .layers
                    .iter()
                    .flatten()
                    .map(|l| l.weight_bytes() as u64)
                    .sum::<u64>()
                    + self
                        .weights
                        .lm_head
                        .as_ref()
                        .map_or(0, |h| h.weight_bytes() as u64)
                    + (self.weights.final_norm.len() * 4) as u64
            }
        }
    }
}

/// One tensor of [`export_layers_f32`]: its HF (LLaMA-scheme) name, shape and f32 values.
pub struct ExportedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// A model's embedding, final norm and the chosen `layers` as f32 tensors under HF LLaMA names,
/// renumbered `0..layers.len()` (for a draft initialised from a subset of its target's layers).
/// GGUF q/k rows are un-permuted, so the tensors are in the layout the HF checkpoints (and the
/// trainer) use; quantized tensors are dequantized.
pub fn export_layers_f32(
    path: &Path,
    layers: &[usize],
) -> Result<(ModelConfig, Vec<ExportedTensor>), ModelError> {
    let (src, config, scheme, permuted): (Arc<dyn TensorSource + Send + Sync>, _, _, _) =
        if path.is_dir() {
            let hf = Arc::new(HfDir::open(path)?);
            let c = ModelConfig::from_hf(&hf.config, &hf.config_path())?;
            let arch = c.arch;
            (hf, c, Scheme::Hf(arch), false)
        } else {
            let g = Arc::new(GgufFile::open(path)?);
            let c = ModelConfig::from_gguf(&g)?;
            let permuted = matches!(c.arch, Arch::Llama | Arch::LLaDA);
            (g, c, Scheme::Gguf, permuted)
        };
    let bad = |msg: String| ModelError::from(FormatError::corrupt(path, msg));
    if config.arch != Arch::Llama || config.qkv_bias {
        return Err(bad(format!(
            "exporting layers needs a LLaMA-architecture model without q/k/v biases, found {:?}",
            config.arch
        )));
    }
    if let Some(&l) = layers.iter().find(|&&l| l >= config.n_layers) {
        return Err(bad(format!(
            "layer {l} does not exist (the model has {} layers)",
            config.n_layers
        )));
    }
    let mut out = Vec::new();
    let mut push = |name: String, v: TensorView| {
        out.push(ExportedTensor {
            name,
            shape: v.shape.clone(),
            data: v.to_f32(),
        })
    };
    let (emb, norm, _) = scheme.globals();
    let (hf_emb, hf_norm, _) = Scheme::Hf(Arch::Llama).globals();
    push(hf_emb.into(), src.require(emb)?);
    push(hf_norm.into(), src.require(norm)?);
    for (j, &i) in layers.iter().enumerate() {
        let from = scheme.names(i);
        let to = hf_names(Arch::Llama, j);
        let pairs = [
            (&from.attn_norm, &to.attn_norm, None),
            (&from.q, &to.q, Some(config.n_heads)),
            (&from.k, &to.k, Some(config.n_kv_heads)),
            (&from.v, &to.v, None),
            (&from.o, &to.o, None),
            (&from.ffn_norm, &to.ffn_norm, None),
            (&from.gate, &to.gate, None),
            (&from.up, &to.up, None),
            (&from.down, &to.down, None),
        ];
        for (f, t, heads) in pairs {
            let mut v = src.require(f)?;
            if let (true, Some(h)) = (permuted, heads) {
                v = unpermute_rows(&v, h)?;
            }
            push(t.clone(), v);
        }
    }
    Ok((config, out))
}
