//! Model shapes and re-costing a trace's schedule at another model size.
//!
//! A trace records, per forward pass, how many rows each layer computed and how many keys its
//! attention read: token counts that do not depend on the model's size. [`recost`] keeps those
//! counts and rewrites every operator's shape, FLOPs and bytes with another model's dimensions
//! (LLaDA-8B, Dream-7B, Llama-3-8B, …), so the tiny models' real decode schedules project to
//! real sizes. Invariants: rows, keys, lanes, passes and the order of operators are the trace's;
//! layer `j` of the target takes the rows of source layer `j · L_src / L_dst`; a weight matrix
//! costs `bits_per_weight` of the trace's own matrices unless told otherwise.

use crate::error::{Result, SimError};
use crate::trace::{Op, OpExt, Trace};
use serde::Serialize;

/// The dimensions that set an operator's cost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ModelShape {
    pub name: &'static str,
    pub layers: u64,
    pub d_model: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub ffn: u64,
    pub vocab: u64,
}

/// Known shapes, from each model's published `config.json` (Hugging Face repository named).
pub const SHAPES: &[(&str, ModelShape)] = &[
    // GSAI-ML/LLaDA-8B-Instruct config.json
    (
        "llada-8b",
        ModelShape {
            name: "llada-8b",
            layers: 32,
            d_model: 4096,
            heads: 32,
            kv_heads: 32,
            head_dim: 128,
            ffn: 12288,
            vocab: 126464,
        },
    ),
    // Dream-org/Dream-v0-Instruct-7B config.json
    (
        "dream-7b",
        ModelShape {
            name: "dream-7b",
            layers: 28,
            d_model: 3584,
            heads: 28,
            kv_heads: 4,
            head_dim: 128,
            ffn: 18944,
            vocab: 152064,
        },
    ),
    // meta-llama/Meta-Llama-3-8B config.json
    (
        "llama-3-8b",
        ModelShape {
            name: "llama-3-8b",
            layers: 32,
            d_model: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            ffn: 14336,
            vocab: 128256,
        },
    ),
    // meta-llama/Llama-3.2-1B config.json (a draft for Llama-3-8B)
    (
        "llama-3.2-1b",
        ModelShape {
            name: "llama-3.2-1b",
            layers: 16,
            d_model: 2048,
            heads: 32,
            kv_heads: 8,
            head_dim: 64,
            ffn: 8192,
            vocab: 128256,
        },
    ),
    // Qwen/Qwen2.5-Coder-1.5B-Instruct config.json
    (
        "qwen2.5-1.5b",
        ModelShape {
            name: "qwen2.5-1.5b",
            layers: 28,
            d_model: 1536,
            heads: 12,
            kv_heads: 2,
            head_dim: 128,
            ffn: 8960,
            vocab: 151936,
        },
    ),
    // Qwen/Qwen2.5-Coder-0.5B-Instruct config.json
    (
        "qwen2.5-0.5b",
        ModelShape {
            name: "qwen2.5-0.5b",
            layers: 24,
            d_model: 896,
            heads: 14,
            kv_heads: 2,
            head_dim: 64,
            ffn: 4864,
            vocab: 151936,
        },
    ),
];

/// Look a shape up by name; `NAME@L` keeps its first `L` layers (as `llada synth --layers`).
pub fn shape(name: &str) -> Result<ModelShape> {
    let unknown = || {
        let known: Vec<&str> = SHAPES.iter().map(|(n, _)| *n).collect();
        SimError::UnknownShape(
            name.into(),
            known.join(", ") + " (NAME@LAYERS keeps that many)",
        )
    };
    let (base, layers) = match name.split_once('@') {
        Some((b, l)) => (
            b,
            Some(
                l.parse::<u64>()
                    .ok()
                    .filter(|l| *l >= 1)
                    .ok_or_else(unknown)?,
            ),
        ),
        None => (name, None),
    };
    let mut s = SHAPES
        .iter()
        .find(|(n, _)| *n == base)
        .map(|(_, s)| *s)
        .ok_or_else(unknown)?;
    if let Some(l) = layers {
        s.layers = l;
    }
    Ok(s)
}

impl ModelShape {
    /// Weight elements of one layer (q, k, v, o and the three MLP matrices).
    pub fn layer_weights(&self) -> u64 {
        let q = self.heads * self.head_dim;
        let kv = self.kv_heads * self.head_dim;
        self.d_model * (q + 2 * kv) + q * self.d_model + 3 * self.d_model * self.ffn
    }
    /// Weight elements of the whole model (layers, embedding and an untied head).
    pub fn weights(&self) -> u64 {
        self.layers * self.layer_weights() + 2 * self.vocab * self.d_model
    }
}

const MATMULS: &[&str] = &[
    "attn_qkv",
    "attn_output",
    "ffn_gate_up",
    "ffn_down",
    "lm_head",
];

/// Is this op a weight matrix product?
pub fn is_matmul(op: &str) -> bool {
    MATMULS.contains(&op)
}

/// Which operators a re-costing applies to.
pub type Select<'a> = &'a dyn Fn(&Op) -> bool;

/// Bits per weight of the selected matrices (the median over matmul records; 4.5 when there
/// are none).
pub fn bits_per_weight(ops: &[Op], sel: Select) -> f64 {
    let mut v: Vec<f64> = ops
        .iter()
        .filter(|o| is_matmul(&o.op) && sel(o) && o.shape.len() == 3)
        .filter_map(|o| {
            let (m, n, k) = (o.shape[0], o.shape[1], o.shape[2]);
            let w = o.bytes_read.checked_sub(m * k * 4)?;
            (n * k > 0).then(|| 8.0 * w as f64 / (n * k) as f64)
        })
        .collect();
    if v.is_empty() {
        return 4.5;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Layers of the selected model (highest layer index + 1).
fn source_layers(ops: &[Op], sel: Select) -> u64 {
    ops.iter()
        .filter(|o| sel(o) && o.op == "attention")
        .map(|o| o.layer.max(0) as u64 + 1)
        .max()
        .unwrap_or(1)
}

/// Rewrite the selected operators with `to`'s dimensions (others unchanged); returns the new
/// operator list (same order; a layer operator appears once per target layer mapped to it)
/// and the names of operators kept at their traced cost.
pub fn recost(
    trace: &Trace,
    sel: Select,
    to: &ModelShape,
    bits: Option<f64>,
) -> (Vec<Op>, Vec<String>) {
    let bits = bits.unwrap_or_else(|| bits_per_weight(&trace.ops, sel));
    let ls = source_layers(&trace.ops, sel);
    // Source head elements (for a streamed head's chunks): the head products of one pass
    // summed (a streamed head is multiplied chunk by chunk).
    let mut head_by_pass: std::collections::HashMap<(u64, &str), u64> = Default::default();
    for o in &trace.ops {
        if o.op == "lm_head" && sel(o) && o.shape.len() == 3 {
            *head_by_pass.entry((o.pass, o.lane.as_str())).or_default() += o.shape[1] * o.shape[2];
        }
    }
    let src_head = head_by_pass.values().copied().max().unwrap_or(1).max(1);
    let mut out = Vec::with_capacity(trace.ops.len());
    let mut kept = Vec::new();
    // A run of one layer's operators on one lane is replayed once per target layer mapped to
    // it, layer after layer (the per-operator host work repeats with the layers).
    let mut run: Vec<&Op> = Vec::new();
    let flush = |run: &mut Vec<&Op>, out: &mut Vec<Op>, kept: &mut Vec<String>| {
        let Some(first) = run.first() else { return };
        let targets: Vec<i32> = (0..to.layers)
            .filter(|j| j * ls / to.layers == first.layer as u64)
            .map(|j| j as i32)
            .collect();
        for j in targets {
            for o in run.iter() {
                let mut n = (*o).clone();
                n.layer = j;
                if !rewrite(&mut n, to, bits, src_head) && !kept.contains(&o.op) {
                    kept.push(o.op.clone());
                }
                out.push(n);
            }
        }
        run.clear();
    };
    for o in &trace.ops {
        let layer_op = sel(o) && !o.is_span() && o.layer >= 0;
        let same_run = run
            .first()
            .is_some_and(|f| f.lane == o.lane && f.pass == o.pass && f.layer == o.layer);
        if layer_op && same_run {
            run.push(o);
            continue;
        }
        // Another lane's operator inside a run (overlapping lanes) does not end it.
        if !layer_op && run.first().is_some_and(|f| f.lane != o.lane) {
            out.push(o.clone());
            continue;
        }
        flush(&mut run, &mut out, &mut kept);
        if layer_op {
            run.push(o);
            continue;
        }
        if !sel(o) || o.is_span() {
            out.push(o.clone());
            continue;
        }
        let mut n = o.clone();
        if !rewrite(&mut n, to, bits, src_head) && !kept.contains(&o.op) {
            kept.push(o.op.clone());
        }
        out.push(n);
    }
    flush(&mut run, &mut out, &mut kept);
    (out, kept)
}

/// Rewrite one operator's shape and cost in place; false when the op is unknown (kept as is).
fn rewrite(o: &mut Op, s: &ModelShape, bits: f64, src_head: u64) -> bool {
    let m = o.rows();
    let (d, q, kv) = (s.d_model, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let wbytes = |n: u64, k: u64| ((n * k) as f64 * bits / 8.0) as u64;
    let mm = |o: &mut Op, n: u64, k: u64| {
        o.shape = vec![m, n, k];
        o.bytes_read = wbytes(n, k) + m * k * 4;
        o.bytes_written = m * n * 4;
        o.flops = 2 * m * n * k;
    };
    match o.op.as_str() {
        "attn_qkv" => mm(o, q + 2 * kv, d),
        "attn_output" => mm(o, d, q),
        "ffn_gate_up" => mm(o, 2 * s.ffn, d),
        "ffn_down" => mm(o, d, s.ffn),
        "lm_head" => mm(o, s.vocab, d),
        "attention" => {
            let keys = o.shape.get(1).copied().unwrap_or(1);
            o.shape = vec![m, keys, s.heads, s.head_dim];
            o.bytes_read = 2 * keys * kv * 4 + m * q * 4;
            o.bytes_written = m * q * 4;
            o.flops = 4 * m * keys * q;
        }
        "rmsnorm" => {
            o.shape = vec![m, d];
            o.bytes_read = m * d * 4 + d * 4;
            o.bytes_written = m * d * 4;
            o.flops = 3 * m * d;
        }
        "rope" => {
            o.shape = vec![m, s.heads + s.kv_heads, s.head_dim];
            o.bytes_read = (q + kv) * m * 4;
            o.bytes_written = o.bytes_read;
            o.flops = 3 * (q + kv) * m;
        }
        "silu_mul" => {
            o.shape = vec![m, s.ffn];
            o.bytes_read = 2 * m * s.ffn * 4;
            o.bytes_written = m * s.ffn * 4;
            o.flops = 5 * m * s.ffn;
        }
        "embed" => {
            o.shape = vec![m, d];
            o.bytes_read = wbytes(m, d);
            o.bytes_written = m * d * 4;
        }
        "early_exit" => {}
        "storage_read" | "weight_build" => {
            let b = if o.layer >= 0 {
                wbytes(s.layer_weights(), 1)
            } else {
                // A chunk of the head: the same share of the target's head.
                let share = o.shape.first().copied().unwrap_or(0) as f64
                    / (src_head as f64 * bits / 8.0).max(1.0);
                (share * wbytes(s.vocab, d) as f64) as u64
            };
            o.shape = vec![b];
            o.bytes_read = b;
            o.bytes_written = b;
        }
        _ => return false,
    }
    true
}
