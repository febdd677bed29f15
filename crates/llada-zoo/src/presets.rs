//! The zoo's presets: what `llada train --preset NAME` builds — each tiny model's shape and
//! default step count, with the measurements that chose them (docs/training.md).

use crate::error::{bail, Result};
use llada_train::model::{Format, ModelSpec};
use llada_train::vocab::{CharVocab, BOS, EOS, MASK};

/// Every preset, as `--preset` names them.
pub const PRESETS: [&str; 5] = [
    "tiny-llada-tasks",
    "tiny-dream-tasks",
    "tiny-ar-tasks",
    "tiny-llada-prose",
    "smollm2-draft",
];

/// Task-model presets (char vocabulary): (spec, default steps).
pub fn task_preset(name: &str) -> Result<(ModelSpec, usize)> {
    let base = |format, kv| ModelSpec {
        format,
        vocab: CharVocab::size(),
        d_model: 128,
        n_layers: 4,
        n_heads: 4,
        n_kv_heads: kv,
        ffn: 384,
        // RoPE base 10⁴ rather than LLaDA-8B's 5·10⁵ / Dream's 10⁶: the tasks need sharp
        // relative positions over a few hundred tokens, not long-context extrapolation.
        rope_theta: 1e4,
        rms_eps: if format == Format::Dream { 1e-6 } else { 1e-5 },
        max_len: 512,
        mask_id: MASK,
        eos_id: EOS,
        bos_id: BOS,
        tied: false,
        store_f16: false,
        // ≈ 1/√d_model. The 0.02 of large models is far too small at d = 128: attention logits
        // start near zero and the model sat on a plateau (copying a letter two positions back
        // stayed at ln 26 for 300 steps; with 0.08 a short-word reversal reached 30–45 % exact
        // match in 2.5 minutes where 0.02 reached 0 %).
        init_std: 0.08,
    };
    Ok(match name {
        // The cards' step count (on 2 cores: ≈ 42 minutes with two shards; one thread beside
        // another run stops at the 55-minute budget first).
        "tiny-llada-tasks" => (base(Format::LLaDA, 4), 16000),
        "tiny-dream-tasks" => (base(Format::Dream, 2), 16000),
        // Autoregressive control on the same tasks (checks the trainer independently of diffusion).
        "tiny-ar-tasks" => (base(Format::Llama, 4), 3000),
        other => bail!("unknown preset '{other}' (tiny-llada-tasks, tiny-dream-tasks, tiny-ar-tasks, tiny-llada-prose, smollm2-draft)"),
    })
}

/// Prose presets: (spec, default steps); `vocab` 0 means "filled in from the tokenizer".
pub fn prose_preset(name: &str, vocab: usize) -> Option<(ModelSpec, usize)> {
    let spec = |format, d, layers, heads, kv, ffn, tied, f16| ModelSpec {
        format,
        vocab,
        d_model: d,
        n_layers: layers,
        n_heads: heads,
        n_kv_heads: kv,
        ffn,
        rope_theta: 1e4,
        rms_eps: 1e-5,
        max_len: 1024,
        mask_id: 2,
        eos_id: 0,
        bos_id: 1,
        tied,
        store_f16: f16,
        // 1/√d_model (0.072 at d = 192); 0.02 kept the prose model at the unigram level
        // (held-out 6.40 nats/token vs the unigram entropy's 6.36) — see the task presets.
        init_std: 1.0 / (d as f64).sqrt(),
    };
    match name {
        // LLaDA format, BPE 4096 trained on Austen + KJV.
        // (d 192, 4 layers: ≈ 2 s/step on one core, so the card's 40-minute budget sees about
        // one epoch; RoPE θ 10⁴ — LLaDA-8B's 5·10⁵ separates nearby positions poorly at this
        // head size, see docs/training.md.)
        "tiny-llada-prose" => Some((
            ModelSpec {
                rope_theta: 1e4,
                ..spec(Format::LLaDA, 192, 4, 6, 6, 512, false, true)
            },
            3000,
        )),
        // Llama format over SmolLM2's own token ids, tied head over 8 192 ids: ≈ 3.1 M MACs/token vs ≈ 134 M.
        "smollm2-draft" => Some((spec(Format::Llama, 192, 4, 6, 2, 512, true, true), 900)),
        _ => None,
    }
}

/// Rows of `smollm2-draft`'s reduced vocabulary.
pub const DRAFT_VOCAB: usize = 8192;
