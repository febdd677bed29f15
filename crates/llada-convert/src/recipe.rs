//! Output type recipes: which GGML type each tensor gets for a requested file type, following
//! llama.cpp's `llama-quantize` (`src/llama-quant.cpp`) so a file we write has the mix a
//! llama.cpp user expects.
//!
//! Rules, for a tensor that may be quantized (2-D, name ending in `weight`, not a norm):
//! * the base type of the file type (`Q4_K` for `q4_k_m`, `F16` for `f16`, …);
//! * quantized file types: `output.weight` (and `token_embd.weight` when the embeddings are
//!   tied) becomes `Q6_K` unless the base type is `Q8_0`, or `Q8_0` when its rows are not a
//!   multiple of the base type's block;
//! * `q4_k_m` / `q5_k_m`: `attn_v` and `ffn_down` of the layers `use_more_bits` picks (the first
//!   and last eighth, and every third between) become `Q6_K`;
//! * fallbacks for rows not a multiple of 256: `Q4_K`→`Q5_0`, `Q5_K`→`Q5_1`, `Q6_K`→`Q8_0`,
//!   `Q2_K`/`Q3_K`→`Q4_0`; then `F16` when the fallback's 32 does not divide the rows either.
//!
//! Every other tensor (norms, biases, 1-D) keeps the type it is given (`F32` from a conversion).
//! Invariant: the type returned always divides the tensor's row length into whole blocks.

use llada_kernels::GgmlType;
use std::fmt;

/// A requested file type (llama.cpp's `LLAMA_FTYPE_*` of the same name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4KM,
    Q5KM,
    Q6K,
}

impl Target {
    /// Every target, in the order `--help` lists them.
    pub const ALL: [Target; 11] = [
        Target::F32,
        Target::F16,
        Target::BF16,
        Target::Q8_0,
        Target::Q6K,
        Target::Q5KM,
        Target::Q4KM,
        Target::Q5_0,
        Target::Q5_1,
        Target::Q4_0,
        Target::Q4_1,
    ];

    /// The command-line name (`q4_k_m`, …).
    pub fn name(self) -> &'static str {
        match self {
            Target::F32 => "f32",
            Target::F16 => "f16",
            Target::BF16 => "bf16",
            Target::Q8_0 => "q8_0",
            Target::Q4_0 => "q4_0",
            Target::Q4_1 => "q4_1",
            Target::Q5_0 => "q5_0",
            Target::Q5_1 => "q5_1",
            Target::Q4KM => "q4_k_m",
            Target::Q5KM => "q5_k_m",
            Target::Q6K => "q6_k",
        }
    }

    /// Parse a command-line name (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }

    /// The type of the matrices the rules do not single out.
    pub fn base(self) -> GgmlType {
        match self {
            Target::F32 => GgmlType::F32,
            Target::F16 => GgmlType::F16,
            Target::BF16 => GgmlType::BF16,
            Target::Q8_0 => GgmlType::Q8_0,
            Target::Q4_0 => GgmlType::Q4_0,
            Target::Q4_1 => GgmlType::Q4_1,
            Target::Q5_0 => GgmlType::Q5_0,
            Target::Q5_1 => GgmlType::Q5_1,
            Target::Q4KM => GgmlType::Q4K,
            Target::Q5KM => GgmlType::Q5K,
            Target::Q6K => GgmlType::Q6K,
        }
    }

    /// `general.file_type` (gguf-py's `LlamaFileType`).
    pub fn file_type(self) -> u32 {
        match self {
            Target::F32 => 0,
            Target::F16 => 1,
            Target::Q4_0 => 2,
            Target::Q4_1 => 3,
            Target::Q8_0 => 7,
            Target::Q5_0 => 8,
            Target::Q5_1 => 9,
            Target::Q4KM => 15,
            Target::Q5KM => 17,
            Target::Q6K => 18,
            Target::BF16 => 32,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the rules need to know about the whole model.
#[derive(Debug, Clone, Copy)]
pub struct ModelFacts {
    /// Number of `attn_v` tensors (llama.cpp's `n_attention_wv`; the layer count).
    pub n_attn_v: usize,
    /// Number of `ffn_down` tensors (the layer count).
    pub n_ffn_down: usize,
    /// No `output.weight`: the token embedding is also the LM head.
    pub tied: bool,
}

/// The type chosen for one tensor, and why when a rule or a fallback changed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub ty: GgmlType,
    /// "rows of 96 not a multiple of 256: Q4_K falls back to Q5_0", …
    pub note: Option<String>,
}

/// llama.cpp's `tensor_allows_quantization` for the tensors of the four architectures.
pub fn may_quantize(name: &str, n_dims: usize) -> bool {
    n_dims >= 2 && name.ends_with("weight") && !name.contains("_norm.weight")
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third layer
/// in between.
pub fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The layer of `blk.N.…`.
fn layer(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// The type of tensor `name` (row length `cols`, `n_dims` dimensions) in a `target` file;
/// `keep` is its type when it may not be quantized.
pub fn choose(
    target: Target,
    name: &str,
    cols: usize,
    n_dims: usize,
    keep: GgmlType,
    facts: &ModelFacts,
) -> Choice {
    if !may_quantize(name, n_dims) {
        return Choice {
            ty: keep,
            note: None,
        };
    }
    let base = target.base();
    if !base.is_quantized() {
        return Choice {
            ty: base,
            note: None,
        };
    }
    let mixed = matches!(target, Target::Q4KM | Target::Q5KM);
    let is_output = name == "output.weight" || (facts.tied && name == "token_embd.weight");
    let (mut ty, mut note) = (base, None);
    if is_output {
        if !cols.is_multiple_of(base.block_elems()) {
            ty = GgmlType::Q8_0;
        } else if base != GgmlType::Q8_0 {
            ty = GgmlType::Q6K;
            note = Some("the LM head takes Q6_K".to_string());
        }
    } else if mixed && name.contains("attn_v.weight") {
        if let Some(i) = layer(name).filter(|&i| use_more_bits(i, facts.n_attn_v)) {
            ty = GgmlType::Q6K;
            note = Some(format!("attn_v of layer {i} takes Q6_K (use_more_bits)"));
        }
    } else if mixed && name.contains("ffn_down") {
        if let Some(i) = layer(name).filter(|&i| use_more_bits(i, facts.n_ffn_down)) {
            ty = GgmlType::Q6K;
            note = Some(format!("ffn_down of layer {i} takes Q6_K (use_more_bits)"));
        }
    }
    if cols.is_multiple_of(ty.block_elems()) {
        return Choice { ty, note };
    }
    let mut fallback = match ty {
        GgmlType::Q4K => GgmlType::Q5_0,
        GgmlType::Q5K => GgmlType::Q5_1,
        GgmlType::Q6K => GgmlType::Q8_0,
        GgmlType::Q2K | GgmlType::Q3K => GgmlType::Q4_0,
        _ => GgmlType::F16,
    };
    if !cols.is_multiple_of(fallback.block_elems()) {
        fallback = GgmlType::F16;
    }
    Choice {
        ty: fallback,
        note: Some(format!(
            "rows of {cols} are not a multiple of {}: {ty} falls back to {fallback}",
            ty.block_elems()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FACTS: ModelFacts = ModelFacts {
        n_attn_v: 32,
        n_ffn_down: 32,
        tied: false,
    };

    fn ty(t: Target, name: &str, cols: usize) -> GgmlType {
        choose(t, name, cols, 2, GgmlType::F32, &FACTS).ty
    }

    /// The Q6_K layers of a 32-layer Q4_K_M model, as llama.cpp picks them (its
    /// `use_more_bits` evaluated by hand: 0..4, 28..32 and 4 + 3k + 2).
    #[test]
    fn q4_k_m_mix_of_a_32_layer_model() {
        let more: Vec<usize> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
        assert_eq!(
            more,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
        for i in 0..32 {
            let want = if more.contains(&i) {
                GgmlType::Q6K
            } else {
                GgmlType::Q4K
            };
            assert_eq!(
                ty(Target::Q4KM, &format!("blk.{i}.attn_v.weight"), 4096),
                want
            );
            assert_eq!(
                ty(Target::Q4KM, &format!("blk.{i}.ffn_down.weight"), 14336),
                want
            );
            assert_eq!(
                ty(Target::Q4KM, &format!("blk.{i}.attn_q.weight"), 4096),
                GgmlType::Q4K
            );
        }
        assert_eq!(ty(Target::Q4KM, "output.weight", 4096), GgmlType::Q6K);
        assert_eq!(ty(Target::Q4KM, "token_embd.weight", 4096), GgmlType::Q4K);
        assert_eq!(ty(Target::Q5KM, "blk.5.attn_v.weight", 4096), GgmlType::Q5K);
        assert_eq!(ty(Target::Q4_0, "output.weight", 4096), GgmlType::Q6K);
        assert_eq!(ty(Target::Q8_0, "output.weight", 4096), GgmlType::Q8_0);
        assert_eq!(ty(Target::F16, "output.weight", 4096), GgmlType::F16);
        let tied = ModelFacts {
            tied: true,
            ..FACTS
        };
        let c = choose(
            Target::Q4KM,
            "token_embd.weight",
            4096,
            2,
            GgmlType::F32,
            &tied,
        );
        assert_eq!(c.ty, GgmlType::Q6K);
    }

    #[test]
    fn fallbacks_for_rows_not_a_multiple_of_256() {
        assert_eq!(ty(Target::Q4KM, "blk.10.attn_q.weight", 96), GgmlType::Q5_0);
        assert_eq!(ty(Target::Q5KM, "blk.10.attn_q.weight", 96), GgmlType::Q5_1);
        assert_eq!(ty(Target::Q6K, "blk.10.attn_q.weight", 96), GgmlType::Q8_0);
        assert_eq!(ty(Target::Q4KM, "blk.0.attn_v.weight", 96), GgmlType::Q8_0);
        assert_eq!(ty(Target::Q4KM, "output.weight", 96), GgmlType::Q8_0);
        assert_eq!(ty(Target::Q4KM, "blk.0.attn_q.weight", 40), GgmlType::F16);
        assert_eq!(ty(Target::Q4_0, "blk.0.attn_q.weight", 40), GgmlType::F16);
        // Norms and 1-D tensors keep their type.
        let c = choose(
            Target::Q4KM,
            "blk.0.attn_norm.weight",
            4096,
            1,
            GgmlType::F32,
            &FACTS,
        );
        assert_eq!(c.ty, GgmlType::F32);
        let c = choose(
            Target::Q4KM,
            "blk.0.attn_q.bias",
            4096,
            1,
            GgmlType::F16,
            &FACTS,
        );
        assert_eq!(c.ty, GgmlType::F16);
    }

    #[test]
    fn names_round_trip() {
        for t in Target::ALL {
            assert_eq!(Target::parse(t.name()), Some(t));
        }
        assert_eq!(Target::parse("Q4_K_M"), Some(Target::Q4KM));
        assert_eq!(Target::parse("q3_k"), None);
    }
}
