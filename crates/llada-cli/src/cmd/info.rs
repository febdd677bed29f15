//! `llada info`: what a model file holds (architecture, parameters, tensor types, bytes).

use crate::util::LoadContext;
use anyhow::Result;
use llada_model::{LoadOptions, Model};

pub fn run(model: &str, json: bool) -> Result<()> {
    let path = llada::models::resolve(model, json)?;
    // The tokenizer is not reported: models without one (e.g. GGUFs written by other tools
    // without tokenizer metadata) load too.
    let m = Model::load(
        &path,
        &LoadOptions {
            no_tokenizer: true,
            ..Default::default()
        },
    )
    .load_context(&path)?;
    let c = &m.config;
    let total: u64 = m.tensor_types.iter().map(|t| t.2).sum();
    if json {
        let types: serde_json::Map<String, serde_json::Value> = m
            .tensor_types
            .iter()
            .map(|(t, n, b)| (t.clone(), serde_json::json!({"tensors": n, "bytes": b})))
            .collect();
        let j = serde_json::json!({
            "path": path.display().to_string(),
            "format": format!("{:?}", m.format),
            "architecture": c.arch.name(),
            "parameters": c.param_count(),
            "layers": c.n_layers, "d_model": c.d_model, "heads": c.n_heads, "kv_heads": c.n_kv_heads,
            "head_dim": c.head_dim, "ffn": c.ffn, "vocab": c.vocab, "context": c.max_ctx,
            "rope_theta": c.rope_theta, "rms_eps": c.rms_eps, "tied_embeddings": c.tied_embeddings,
            "shift_logits": c.shift_logits, "mask_id": c.mask_id,
            "tensor_types": types, "bytes": total, "bytes_per_token": m.bytes_per_token(),
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(());
    }
    println!("{}", path.display());
    println!("  format        {:?}", m.format);
    println!(
        "  architecture  {}{}",
        c.arch.name(),
        if c.arch.is_diffusion() {
            " (diffusion LM)"
        } else {
            ""
        }
    );
    println!("  parameters    {:.1} M", c.param_count() as f64 / 1e6);
    println!(
        "  layers        {}  d_model {}  ffn {}",
        c.n_layers, c.d_model, c.ffn
    );
    println!(
        "  heads         {} ({} KV, head dim {})",
        c.n_heads, c.n_kv_heads, c.head_dim
    );
    println!("  vocab         {}  context {}", c.vocab, c.max_ctx);
    println!("  rope theta    {}  rms eps {:e}", c.rope_theta, c.rms_eps);
    println!(
        "  tied head     {}  shifted logits {}  mask id {:?}",
        c.tied_embeddings, c.shift_logits, c.mask_id
    );
    println!("  tensors:");
    for (t, n, b) in &m.tensor_types {
        println!(
            "    {t:<6} {n:>5} tensors {:>10.2} MiB",
            *b as f64 / (1 << 20) as f64
        );
    }
    println!(
        "  total         {:.2} MiB; read per decoded token {:.2} MiB",
        total as f64 / (1 << 20) as f64,
        m.bytes_per_token() as f64 / (1 << 20) as f64
    );
    Ok(())
}
