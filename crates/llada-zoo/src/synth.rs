//! Synthetic models: a GGUF with the exact shapes of a real model (LLaDA-8B, Dream-7B, a
//! LLaMA-3-8B-shaped autoregressive model) and random quantized weights — no download. Its
//! outputs are meaningless; its forward passes cost what the real model's cost and it streams
//! what the real model would stream under a memory budget, which is what the window sweep of
//! `llada bench diffusion` and the multi-GB memory-budget check need. The file embeds a
//! byte-level tokenizer (the 256 byte tokens, then placeholders up to the vocabulary size), so
//! `llada generate` runs it on any text.

use crate::error::{bail, Result};
use crate::progress::Progress;
use llada_formats::gguf::{GgufWriter, Value};
use llada_kernels::GgmlType;
use std::path::PathBuf;

/// What to write: the shape to copy (llada-8b, dream-7b, llama-8b), its first `layers` layers
/// (`None`: all), the matrices' type (q4_0, q4_1, q8_0), the output file and the weights' seed.
#[derive(Clone, Debug)]
pub struct SynthRequest {
    pub shape: String,
    pub layers: Option<usize>,
    pub quant: String,
    pub out: PathBuf,
    pub seed: u64,
}

struct Shape {
    arch: &'static str,
    d: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    ffn: usize,
    vocab: usize,
    theta: f32,
    eps: f32,
    bias: bool,
    mask: Option<u32>,
    bos: u32,
    eos: u32,
}

fn shape(name: &str) -> Result<Shape> {
    Ok(match name {
        "llada-8b" => Shape {
            arch: "llada",
            d: 4096,
            layers: 32,
            heads: 32,
            kv_heads: 32,
            ffn: 12288,
            vocab: 126464,
            theta: 500000.0,
            eps: 1e-5,
            bias: false,
            mask: Some(126336),
            bos: 126080,
            eos: 126081,
        },
        "dream-7b" => Shape {
            arch: "dream",
            d: 3584,
            layers: 28,
            heads: 28,
            kv_heads: 4,
            ffn: 18944,
            vocab: 152064,
            theta: 1e6,
            eps: 1e-6,
            bias: true,
            mask: Some(151666),
            bos: 151643,
            eos: 151643,
        },
        "llama-8b" => Shape {
            arch: "llama",
            d: 4096,
            layers: 32,
            heads: 32,
            kv_heads: 8,
            ffn: 14336,
            vocab: 128256,
            theta: 500000.0,
            eps: 1e-5,
            bias: false,
            mask: None,
            bos: 128000,
            eos: 128001,
        },
        other => bail!("unknown shape '{other}' (llada-8b, dream-7b, llama-8b)"),
    })
}

/// The synthetic tokenizer's vocabulary: ids 0..256 are GPT-2's byte-level characters (every
/// text encodes, one token per byte; there are no merges), the rest placeholders `<|synth_N|>`;
/// BOS, EOS and the mask token are control tokens (GGUF token type 3).
fn byte_vocab(s: &Shape) -> (Vec<Value>, Vec<Value>) {
    // GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the others to
    // U+0100 onwards, in byte order.
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut next = 256u32;
    let mut tokens: Vec<Value> = (0u32..256)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            Value::String(char::from_u32(c).unwrap_or('?').to_string())
        })
        .collect();
    tokens.extend((256..s.vocab).map(|i| Value::String(format!("<|synth_{i}|>"))));
    let special = |i: usize| {
        let i = i as u32;
        i == s.bos || i == s.eos || Some(i) == s.mask
    };
    let types = (0..s.vocab)
        .map(|i| Value::I32(if special(i) { 3 } else { 1 }))
        .collect();
    (tokens, types)
}

/// xorshift64*: fast, seeded, good enough for random weights.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Fill quant blocks whose dequantized weights have a standard deviation near 0.02.
fn fill_blocks(ty: GgmlType, rng: &mut Rng, buf: &mut [u8]) {
    let f16 = |x: f32| half::f16::from_f32(x).to_le_bytes();
    for b in buf.chunks_exact_mut(ty.block_bytes()) {
        let r = rng.next();
        let jitter = 1.0 + ((r & 0xff) as f32 / 255.0 - 0.5) * 0.2;
        let data_at = match ty {
            GgmlType::Q4_1 => {
                let d = 0.0043 * jitter;
                b[..2].copy_from_slice(&f16(d));
                b[2..4].copy_from_slice(&f16(-8.0 * d));
                4
            }
            GgmlType::Q8_0 => {
                b[..2].copy_from_slice(&f16(0.00027 * jitter));
                2
            }
            _ => {
                b[..2].copy_from_slice(&f16(0.0043 * jitter));
                2
            }
        };
        for c in b[data_at..].chunks_mut(8) {
            let v = rng.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// The `llada synth` GGUF of `shape` (all layers, q4_0, seed 0) in the cache
/// (`CACHE/synth/SHAPE-q4_0.gguf`), written on first use — what `llada bench diffusion`'s window
/// sweep runs for `synth:SHAPE`.
pub fn cached(shape_name: &str, progress: &dyn Progress) -> Result<PathBuf> {
    if shape(shape_name)?.mask.is_none() {
        bail!(
            "synth:{shape_name} is autoregressive: the diffusion sweep takes llada-8b or dream-7b"
        );
    }
    let dir = llada::models::cache_dir().join("synth");
    let path = dir.join(format!("{shape_name}-q4_0.gguf"));
    if !path.exists() {
        std::fs::create_dir_all(&dir)?;
        progress.note(&format!(
            "making {} once: random weights with {shape_name}'s shapes (no download)",
            path.display()
        ));
        // `write` writes atomically (`GgufWriter::write_streaming`): an interrupted first use
        // leaves no truncated file to be taken for the model next time.
        write(
            &SynthRequest {
                shape: shape_name.into(),
                layers: None,
                quant: "q4_0".into(),
                out: path.clone(),
                seed: 0,
            },
            progress,
        )?;
    }
    Ok(path)
}

/// Write the GGUF `a` asks for (atomically); `progress` counts its weight bytes.
pub fn write(a: &SynthRequest, progress: &dyn Progress) -> Result<()> {
    let mut s = shape(&a.shape)?;
    if let Some(l) = a.layers {
        if l == 0 || l > s.layers {
            bail!("--layers must be in 1..={}", s.layers);
        }
        s.layers = l;
    }
    let ty = match a.quant.as_str() {
        "q4_0" => GgmlType::Q4_0,
        "q4_1" => GgmlType::Q4_1,
        "q8_0" => GgmlType::Q8_0,
        other => bail!("unsupported --quant '{other}' (q4_0, q4_1, q8_0)"),
    };
    let hd = s.d / s.heads;
    let kvd = s.kv_heads * hd;
    let mut w = GgufWriter::new();
    let k = |x: &str| format!("{}.{x}", s.arch);
    w.kv("general.architecture", Value::String(s.arch.into()))
        .kv(
            "general.name",
            Value::String(format!("synthetic {} (random weights)", a.shape)),
        )
        .kv(&k("embedding_length"), Value::U32(s.d as u32))
        .kv(&k("block_count"), Value::U32(s.layers as u32))
        .kv(&k("attention.head_count"), Value::U32(s.heads as u32))
        .kv(&k("attention.head_count_kv"), Value::U32(s.kv_heads as u32))
        .kv(&k("feed_forward_length"), Value::U32(s.ffn as u32))
        .kv(&k("vocab_size"), Value::U32(s.vocab as u32))
        .kv(&k("context_length"), Value::U32(4096))
        .kv(&k("rope.freq_base"), Value::F32(s.theta))
        .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(s.eps))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(s.bos))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(s.eos));
    if let Some(m) = s.mask {
        w.kv("tokenizer.ggml.mask_token_id", Value::U32(m));
    }
    let (tokens, types) = byte_vocab(&s);
    w.kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String("default".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(tokens))
        .kv("tokenizer.ggml.token_type", Value::Array(types))
        .kv("tokenizer.ggml.merges", Value::Array(vec![]));
    let ones = |n: usize| -> Vec<u8> { (0..n).flat_map(|_| 1f32.to_le_bytes()).collect() };
    w.tensor_lazy("token_embd.weight", &[s.vocab, s.d], ty);
    for i in 0..s.layers {
        let p = format!("blk.{i}.");
        w.tensor(
            &format!("{p}attn_norm.weight"),
            &[s.d],
            GgmlType::F32,
            ones(s.d),
        );
        w.tensor_lazy(&format!("{p}attn_q.weight"), &[s.d, s.d], ty);
        w.tensor_lazy(&format!("{p}attn_k.weight"), &[kvd, s.d], ty);
        w.tensor_lazy(&format!("{p}attn_v.weight"), &[kvd, s.d], ty);
        if s.bias {
            for (n, len) in [("q", s.d), ("k", kvd), ("v", kvd)] {
                w.tensor(
                    &format!("{p}attn_{n}.bias"),
                    &[len],
                    GgmlType::F32,
                    vec![0u8; 4 * len],
                );
            }
        }
        w.tensor_lazy(&format!("{p}attn_output.weight"), &[s.d, s.d], ty);
        w.tensor(
            &format!("{p}ffn_norm.weight"),
            &[s.d],
            GgmlType::F32,
            ones(s.d),
        );
        w.tensor_lazy(&format!("{p}ffn_gate.weight"), &[s.ffn, s.d], ty);
        w.tensor_lazy(&format!("{p}ffn_up.weight"), &[s.ffn, s.d], ty);
        w.tensor_lazy(&format!("{p}ffn_down.weight"), &[s.d, s.ffn], ty);
    }
    w.tensor("output_norm.weight", &[s.d], GgmlType::F32, ones(s.d));
    w.tensor_lazy("output.weight", &[s.vocab, s.d], ty);
    let per_layer = 2 * s.d * s.d + 2 * kvd * s.d + 3 * s.ffn * s.d;
    let params = 2 * s.vocab * s.d + s.layers * per_layer;
    let bytes = ty.bytes_for(params as u64).unwrap_or(0);
    progress.set_len(bytes);
    progress.status(&a.out.display().to_string());
    let mut rng = Rng(a.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // Atomic: written to a temporary file next to OUT, renamed over OUT only once complete, so
    // an interrupted or failed run leaves an existing OUT as it was.
    w.write_streaming(&a.out, &mut |_, _, buf| {
        fill_blocks(ty, &mut rng, buf);
        progress.inc(buf.len() as u64);
    })?;
    progress.finish();
    progress.note(&format!(
        "wrote {} ({} layers, {:.2} B parameters, {:.2} GB of {} weights, random: outputs are meaningless)",
        a.out.display(),
        s.layers,
        params as f64 / 1e9,
        bytes as f64 / 1e9,
        ty.name()
    ));
    Ok(())
}
