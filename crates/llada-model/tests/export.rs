//! `export_layers_f32`: a GGUF file's layers, un-permuted, equal the HF checkpoint holding the
//! same weights (the fixtures' `gguf-llama.gguf` and `hf-llama/` are written from one set of
//! values by `tests/reference/make_fixtures.py`).

use llada_model::load::export_layers_f32;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    std::env::var_os("LLADA_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"))
}

#[test]
fn gguf_layers_export_as_the_hf_tensors() {
    let dir = fixtures();
    let (cg, g) = export_layers_f32(&dir.join("gguf-llama.gguf"), &[1, 0]).unwrap();
    let (ch, h) = export_layers_f32(&dir.join("hf-llama"), &[1, 0]).unwrap();
    assert_eq!((cg.d_model, cg.n_heads), (ch.d_model, ch.n_heads));
    // Embedding, final norm, 9 tensors per layer.
    assert_eq!(g.len(), 2 + 2 * 9);
    assert_eq!(g.len(), h.len());
    for (a, b) in g.iter().zip(&h) {
        assert_eq!(a.name, b.name);
        assert_eq!(a.shape, b.shape, "{}", a.name);
        let err = a
            .data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(err == 0.0, "{}: max |Δ| {err}", a.name);
    }
    // Renumbered: exported layer 0 is the source's layer 1.
    let q0 = g
        .iter()
        .find(|t| t.name == "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    let (_, h1) = export_layers_f32(&dir.join("hf-llama"), &[1]).unwrap();
    let q1 = h1
        .iter()
        .find(|t| t.name == "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(q0.data, q1.data);
}

#[test]
fn export_refuses_missing_layers_and_other_architectures() {
    let dir = fixtures();
    let e = export_layers_f32(&dir.join("gguf-llama.gguf"), &[99])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("layer 99 does not exist"), "{e}");
    let e = export_layers_f32(&dir.join("gguf-dream.gguf"), &[0])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("LLaMA-architecture"), "{e}");
}
