//! Hostile model files and requests: a checkpoint with a missing tensor, shapes that disagree
//! with the config, absurd hyper-parameters, an unknown architecture, and forward requests past
//! the context or the vocabulary must give a clear [`ModelError`] naming the file and the tensor
//! or key — never a panic.
//!
//! Works on copies of the fixtures in `tests/fixtures` (regenerate with
//! `python3 tests/reference/make_fixtures.py tests/fixtures`; `LLADA_FIXTURES` overrides the
//! location).

use llada_formats::gguf::{GgufFile, GgufWriter, Value};
use llada_formats::{FormatError, TensorSource};
use llada_model::{AttnMask, ForwardRequest, KvWrite, LoadOptions, LogitRows, Model, ModelError};
use serde_json::{json, Value as J};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    let p = std::env::var_os("LLADA_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"));
    assert!(
        p.join("hf-llama/config.json").exists() && p.join("gguf-llama.gguf").exists(),
        "fixtures missing at {}: run `python3 tests/reference/make_fixtures.py tests/fixtures`",
        p.display()
    );
    p
}

/// A scratch directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let p =
            std::env::temp_dir().join(format!("llada-hostile-model-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn opts() -> LoadOptions {
    LoadOptions {
        no_tokenizer: true,
        ..Default::default()
    }
}

fn load_err(path: &Path) -> ModelError {
    match Model::load(path, &opts()) {
        Ok(m) => panic!(
            "hostile model at {} loaded fine: {:?}",
            path.display(),
            m.config
        ),
        Err(e) => e,
    }
}

/// The error loading `path`, as a format error whose message names `path`.
fn format_err(path: &Path) -> FormatError {
    format_err_naming(path, path)
}

/// The error loading `path`, as a format error whose message names `named`.
fn format_err_naming(path: &Path, named: &Path) -> FormatError {
    match load_err(path) {
        ModelError::Format(e) => {
            assert!(
                e.to_string().contains(&named.display().to_string()),
                "error does not name {}: {e}",
                named.display()
            );
            e
        }
        e => panic!("expected a format error, got {e:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// HF directories
// ---------------------------------------------------------------------------------------------

/// (name, dtype, shape, bytes) in file order.
type StTensor = (String, String, Vec<usize>, Vec<u8>);

fn read_st(path: &Path) -> Vec<StTensor> {
    let b = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, J> = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let data = &b[8 + n..];
    let mut out: Vec<(usize, StTensor)> = header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let off: Vec<usize> = v["data_offsets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            let shape = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            (
                off[0],
                (
                    k,
                    v["dtype"].as_str().unwrap().to_string(),
                    shape,
                    data[off[0]..off[1]].to_vec(),
                ),
            )
        })
        .collect();
    out.sort_by_key(|(o, _)| *o);
    out.into_iter().map(|(_, t)| t).collect()
}

fn write_st(path: &Path, tensors: &[StTensor]) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        header.insert(name.clone(), json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]}));
        data.extend_from_slice(bytes);
    }
    let h = J::Object(header).to_string();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h.as_bytes());
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

/// A copy of `tests/fixtures/hf-llama` (config + weights; no tokenizer).
fn hf_copy(tag: &str) -> Scratch {
    let s = Scratch::new(tag);
    let src = fixtures().join("hf-llama");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), s.path(f)).unwrap();
    }
    s
}

fn edit_config(dir: &Scratch, f: impl FnOnce(&mut serde_json::Map<String, J>)) {
    let p = dir.path("config.json");
    let mut c: J = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(c.as_object_mut().unwrap());
    std::fs::write(p, c.to_string()).unwrap();
}

fn edit_weights(dir: &Scratch, f: impl FnOnce(&mut Vec<StTensor>)) {
    let p = dir.path("model.safetensors");
    let mut t = read_st(&p);
    f(&mut t);
    write_st(&p, &t);
}

#[test]
fn hf_copy_loads() {
    // The unmodified copy (rewritten through read_st/write_st) loads: every failure below is
    // caused by its modification, not by the copying.
    let s = hf_copy("hf-ok");
    edit_weights(&s, |_| {});
    let m = Model::load(&s.0, &opts()).unwrap();
    assert_eq!(
        (
            m.config.n_layers,
            m.config.d_model,
            m.config.vocab,
            m.config.ffn
        ),
        (2, 64, 97, 96)
    );
}

#[test]
fn hf_missing_tensor() {
    let s = hf_copy("hf-missing");
    let orig = read_st(&s.path("model.safetensors"));
    for name in [
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.1.self_attn.k_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight",
    ] {
        let kept: Vec<StTensor> = orig.iter().filter(|t| t.0 != name).cloned().collect();
        assert_eq!(kept.len() + 1, orig.len(), "{name} is not in the fixture");
        write_st(&s.path("model.safetensors"), &kept);
        match format_err(&s.0) {
            FormatError::MissingTensor { path, tensor } => {
                assert_eq!(tensor, name);
                assert_eq!(path, s.0);
            }
            e => panic!("without {name}: expected MissingTensor, got {e}"),
        }
    }
}

#[test]
fn hf_config_disagrees_with_shapes() {
    let st = fixtures().join("hf-llama/model.safetensors");
    // (key, value, tensor whose shape check fails first, its stored shape, the shape expected).
    // (config key, new value, tensor, shape got, shape expected)
    type Case<'a> = (&'a str, J, &'a str, Vec<usize>, Vec<usize>);
    let cases: [Case; 5] = [
        (
            "hidden_size",
            json!(128),
            "model.embed_tokens.weight",
            vec![97, 64],
            vec![97, 128],
        ),
        (
            "vocab_size",
            json!(100),
            "model.embed_tokens.weight",
            vec![97, 64],
            vec![100, 64],
        ),
        (
            "intermediate_size",
            json!(128),
            "model.layers.0.mlp.gate_proj.weight",
            vec![96, 64],
            vec![128, 64],
        ),
        (
            "num_key_value_heads",
            json!(4),
            "model.layers.0.self_attn.k_proj.weight",
            vec![32, 64],
            vec![64, 64],
        ),
        (
            "num_attention_heads",
            json!(2),
            "model.layers.0.self_attn.q_proj.weight",
            vec![64, 64],
            vec![32, 64],
        ),
    ];
    for (key, val, tensor_name, got_shape, expected_shape) in cases {
        let s = hf_copy("hf-shape");
        edit_config(&s, |c| {
            c.insert(key.into(), val.clone());
        });
        match format_err(&s.0) {
            FormatError::ShapeMismatch {
                path,
                tensor,
                got,
                expected,
            } => {
                assert_eq!(tensor, tensor_name, "{key}={val}");
                assert_eq!((got, expected), (got_shape, expected_shape), "{key}={val}");
                assert_eq!(path.file_name(), st.file_name());
            }
            e => panic!("{key}={val}: expected ShapeMismatch, got {e}"),
        }
    }
    // More layers than stored; untied head without lm_head.weight.
    for (key, val, missing) in [
        (
            "num_hidden_layers",
            json!(3),
            "model.layers.2.input_layernorm.weight",
        ),
        ("tie_word_embeddings", json!(false), "lm_head.weight"),
    ] {
        let s = hf_copy("hf-shape");
        edit_config(&s, |c| {
            c.insert(key.into(), val.clone());
        });
        match format_err(&s.0) {
            FormatError::MissingTensor { tensor, .. } => assert_eq!(tensor, missing, "{key}={val}"),
            e => panic!("{key}={val}: expected MissingTensor, got {e}"),
        }
    }
}

#[test]
fn hf_stored_shape_or_type_wrong() {
    let s = hf_copy("hf-stored");
    let orig = read_st(&s.path("model.safetensors"));
    // (tensor, new shape with the same element count).
    for (name, shape) in [
        ("model.layers.1.self_attn.q_proj.weight", vec![32, 128]),
        ("model.layers.0.self_attn.k_proj.weight", vec![64, 32]),
        ("model.embed_tokens.weight", vec![97 * 64]),
        ("model.norm.weight", vec![1, 64]),
        ("model.layers.0.mlp.down_proj.weight", vec![64, 96, 1]),
    ] {
        let mut t = orig.clone();
        t.iter_mut().find(|x| x.0 == name).unwrap().2 = shape.clone();
        write_st(&s.path("model.safetensors"), &t);
        match format_err(&s.0) {
            FormatError::ShapeMismatch { tensor, got, .. } => {
                assert_eq!(tensor, name);
                assert_eq!(got, shape);
            }
            e => panic!("{name} as {shape:?}: expected ShapeMismatch, got {e}"),
        }
    }
    // An integer tensor where a float one belongs (same byte size).
    let mut t = orig.clone();
    t.iter_mut().find(|x| x.0 == "model.norm.weight").unwrap().1 = "I16".into();
    write_st(&s.path("model.safetensors"), &t);
    match format_err(&s.0) {
        FormatError::UnsupportedType { tensor, ty, .. } => {
            assert_eq!((tensor.as_str(), ty.as_str()), ("model.norm.weight", "I16"))
        }
        e => panic!("expected UnsupportedType, got {e}"),
    }
}

#[test]
fn hf_absurd_config_values() {
    // (key, value, text expected in the error): validation rejects these before any tensor is
    // looked at, so no allocation is sized from them.
    let cases: Vec<(&str, J, &str)> = vec![
        ("num_attention_heads", json!(0), "head counts"),
        ("num_key_value_heads", json!(0), "head counts"),
        ("num_key_value_heads", json!(3), "head counts"),
        ("hidden_size", json!(1_000_000_000u64), "absurd widths"),
        ("hidden_size", json!(0), "absurd widths"),
        ("hidden_size", json!(u64::MAX), "absurd widths"),
        ("intermediate_size", json!(1u64 << 40), "absurd widths"),
        ("num_hidden_layers", json!(0), "absurd layer count"),
        ("num_hidden_layers", json!(1_000_000), "absurd layer count"),
        ("head_dim", json!(15), "head dimension"),
        ("head_dim", json!(0), "head dimension"),
        ("head_dim", json!(1 << 20), "head dimension"),
        ("vocab_size", json!(0), "absurd vocabulary"),
        ("vocab_size", json!(1u64 << 40), "absurd vocabulary"),
        ("max_position_embeddings", json!(0), "context length is 0"),
        ("rms_norm_eps", json!(0.0), "invalid eps"),
        ("rms_norm_eps", json!(-1e-5), "invalid eps"),
        ("rms_norm_eps", json!(2.0), "invalid eps"),
        ("rope_theta", json!(0.0), "rope theta"),
        ("rope_theta", json!(-10000.0), "rope theta"),
    ];
    for (key, val, want) in cases {
        let s = hf_copy("hf-absurd");
        edit_config(&s, |c| {
            c.insert(key.into(), val.clone());
        });
        match format_err_naming(&s.0, &s.path("config.json")) {
            FormatError::Corrupt { what, .. } => {
                assert!(what.contains(want), "{key}={val}: {what}")
            }
            e => panic!("{key}={val}: expected Corrupt, got {e}"),
        }
    }
    // Required integers that are missing, negative, fractional, strings or out of range.
    for (key, val) in [
        ("hidden_size", Some(json!(-64))),
        ("hidden_size", Some(json!(64.5))),
        ("hidden_size", Some(json!("64"))),
        ("hidden_size", Some(J::Null)),
        ("hidden_size", None),
        ("num_attention_heads", Some(json!(1e30))),
        ("num_hidden_layers", None),
        ("intermediate_size", Some(json!([96]))),
        ("vocab_size", None),
    ] {
        let s = hf_copy("hf-absurd");
        edit_config(&s, |c| match &val {
            Some(v) => {
                c.insert(key.into(), v.clone());
            }
            None => {
                c.remove(key);
            }
        });
        match format_err_naming(&s.0, &s.path("config.json")) {
            FormatError::Metadata { key: k, .. } => assert_eq!(k, key, "{key}={val:?}"),
            e => panic!("{key}={val:?}: expected Metadata, got {e}"),
        }
    }
    // Head counts so large that n_heads · head_dim overflows: an error, never a huge allocation.
    // (Known gap: `ModelConfig::validate` has no upper bound on head counts, so `q_dim()` /
    // `kv_dim()` overflow; release builds wrap and report "the config implies [0, 64]", builds
    // with overflow checks would panic there.)
    for (nh, nkv) in [(1u64 << 40, 1u64 << 40), (1 << 62, 1 << 62), (1 << 62, 2)] {
        let s = hf_copy("hf-absurd");
        edit_config(&s, |c| {
            c.insert("num_attention_heads".into(), json!(nh));
            c.insert("num_key_value_heads".into(), json!(nkv));
        });
        let e = format_err(&s.0);
        assert!(
            matches!(
                e,
                FormatError::Corrupt { .. } | FormatError::ShapeMismatch { .. }
            ),
            "{nh}/{nkv}: {e}"
        );
    }
    // config.json that is not an object at all.
    let s = hf_copy("hf-absurd");
    std::fs::write(s.path("config.json"), "[1, 2, 3]").unwrap();
    assert!(matches!(
        format_err_naming(&s.0, &s.path("config.json")),
        FormatError::UnsupportedArch { .. }
    ));
}

#[test]
fn hf_unknown_architecture() {
    for (archs, model_type, want) in [
        (
            Some(json!(["GPT2LMHeadModel"])),
            Some("gpt2"),
            "GPT2LMHeadModel",
        ),
        (None, Some("mamba"), "mamba"),
        (Some(json!([])), None, ""),
        (Some(json!("LlamaForCausalLM")), Some("llama2"), "llama2"), // not a list
    ] {
        let s = hf_copy("hf-arch");
        edit_config(&s, |c| {
            c.remove("architectures");
            c.remove("model_type");
            if let Some(a) = &archs {
                c.insert("architectures".into(), a.clone());
            }
            if let Some(m) = model_type {
                c.insert("model_type".into(), json!(m));
            }
        });
        match format_err_naming(&s.0, &s.path("config.json")) {
            FormatError::UnsupportedArch { arch, path, .. } => {
                assert_eq!(arch, want);
                assert_eq!(path, s.path("config.json"));
            }
            e => panic!("{archs:?}/{model_type:?}: expected UnsupportedArch, got {e}"),
        }
    }
}

#[test]
fn nonexistent_paths() {
    let s = Scratch::new("nonexistent");
    let p = s.path("model.gguf");
    assert!(
        matches!(format_err(&p), FormatError::Io { err: source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    );
    // An empty directory: no config.json.
    let e = format_err(&s.0);
    assert!(
        matches!(&e, FormatError::Io { path, .. } if path == &s.path("config.json")),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// GGUF
// ---------------------------------------------------------------------------------------------

/// Rewrite `src` through GgufWriter: metadata edited by `kv`, tensors filtered/reshaped by `t`.
fn rewrite_gguf(
    src: &Path,
    dst: &Path,
    kv: impl FnOnce(&mut Vec<(String, Value)>),
    t: impl Fn(&str, &mut Vec<usize>) -> bool,
) {
    let g = GgufFile::open(src).unwrap();
    // GgufWriter always aligns to 32.
    let mut kvs: Vec<(String, Value)> = g
        .metadata
        .iter()
        .filter(|(k, _)| k.as_str() != "general.alignment")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    kv(&mut kvs);
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w.kv(&k, v);
    }
    for name in &g.order {
        let v = g.require(name).unwrap();
        let mut shape = v.shape.clone();
        if t(name, &mut shape) {
            w.tensor(name, &shape, v.ty, v.bytes().to_vec());
        }
    }
    w.write(dst).unwrap();
}

fn set_kv(kvs: &mut Vec<(String, Value)>, key: &str, v: Option<Value>) {
    kvs.retain(|(k, _)| k != key);
    if let Some(v) = v {
        kvs.push((key.into(), v));
    }
}

fn one_pass(m: &Model, tokens: &[u32]) -> Vec<f32> {
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let mut cache = m.new_cache();
    let req = ForwardRequest {
        tokens,
        positions: &positions,
        mask: AttnMask::Causal,
        kv_write: KvWrite::None,
        logits: LogitRows::All,
    };
    m.forward(&req, &mut cache).unwrap().logits
}

#[test]
fn gguf_faithful_rewrite_loads() {
    let s = Scratch::new("gguf-ok");
    for f in ["gguf-llama.gguf", "gguf-llama-q8.gguf"] {
        let src = fixtures().join(f);
        let dst = s.path(f);
        rewrite_gguf(&src, &dst, |_| {}, |_, _| true);
        let a = Model::load(&src, &opts()).unwrap();
        let b = Model::load(&dst, &opts()).unwrap();
        assert_eq!(a.config, b.config);
        let toks = [94, 3, 17, 42, 96];
        assert_eq!(
            one_pass(&a, &toks),
            one_pass(&b, &toks),
            "{f}: rewritten copy computes different logits"
        );
    }
}

#[test]
fn gguf_missing_tensor() {
    let s = Scratch::new("gguf-missing");
    for (f, name) in [
        ("gguf-llama.gguf", "blk.1.ffn_down.weight"),
        ("gguf-llama.gguf", "token_embd.weight"),
        ("gguf-llama.gguf", "output_norm.weight"),
        ("gguf-llama.gguf", "blk.0.attn_k.weight"),
        ("gguf-llama-q4_1.gguf", "blk.1.attn_q.weight"),
    ] {
        let dst = s.path("m.gguf");
        let src = fixtures().join(f);
        assert!(
            GgufFile::open(&src).unwrap().tensors.contains_key(name),
            "{name} not in {f}"
        );
        rewrite_gguf(&src, &dst, |_| {}, |n, _| n != name);
        match format_err(&dst) {
            FormatError::MissingTensor { path, tensor } => {
                assert_eq!(tensor, name);
                assert_eq!(path, dst);
            }
            e => panic!("{f} without {name}: expected MissingTensor, got {e}"),
        }
    }
}

#[test]
fn gguf_bad_architecture() {
    let s = Scratch::new("gguf-arch");
    let src = fixtures().join("gguf-llama.gguf");
    let dst = s.path("m.gguf");
    for arch in ["gpt2", "", "LLAMA", "llama "] {
        rewrite_gguf(
            &src,
            &dst,
            |kv| set_kv(kv, "general.architecture", Some(Value::String(arch.into()))),
            |_, _| true,
        );
        match format_err(&dst) {
            FormatError::UnsupportedArch { arch: a, path, .. } => {
                assert_eq!(a, arch);
                assert_eq!(path, dst);
            }
            e => panic!("arch {arch:?}: expected UnsupportedArch, got {e}"),
        }
    }
    for v in [
        None,
        Some(Value::U32(1)),
        Some(Value::Array(vec![Value::String("llama".into())])),
    ] {
        rewrite_gguf(
            &src,
            &dst,
            |kv| set_kv(kv, "general.architecture", v.clone()),
            |_, _| true,
        );
        match format_err(&dst) {
            FormatError::Metadata { key, .. } => assert_eq!(key, "general.architecture"),
            e => panic!("general.architecture = {v:?}: expected Metadata, got {e}"),
        }
    }
    // A supported architecture whose keys are all under another prefix.
    rewrite_gguf(
        &src,
        &dst,
        |kv| {
            set_kv(
                kv,
                "general.architecture",
                Some(Value::String("qwen2".into())),
            )
        },
        |_, _| true,
    );
    match format_err(&dst) {
        FormatError::Metadata { key, .. } => assert!(key.starts_with("qwen2."), "{key}"),
        e => panic!("expected Metadata on a qwen2.* key, got {e}"),
    }
}

#[test]
fn gguf_bad_hyperparameters() {
    let s = Scratch::new("gguf-hparams");
    let src = fixtures().join("gguf-llama.gguf");
    let dst = s.path("m.gguf");
    // Missing or mistyped required keys.
    for key in [
        "llama.embedding_length",
        "llama.block_count",
        "llama.feed_forward_length",
        "llama.context_length",
        "llama.attention.head_count",
        "llama.attention.layer_norm_rms_epsilon",
    ] {
        for v in [None, Some(Value::String("64".into())), Some(Value::I32(-1))] {
            rewrite_gguf(&src, &dst, |kv| set_kv(kv, key, v.clone()), |_, _| true);
            match format_err(&dst) {
                FormatError::Metadata { key: k, .. } => assert_eq!(k, key, "{v:?}"),
                e => panic!("{key} = {v:?}: expected Metadata, got {e}"),
            }
        }
    }
    // Absurd values.
    for (key, v, want) in [
        ("llama.block_count", Value::U32(0), "absurd layer count"),
        (
            "llama.block_count",
            Value::U64(u64::MAX),
            "absurd layer count",
        ),
        (
            "llama.embedding_length",
            Value::U64(1 << 40),
            "absurd widths",
        ),
        ("llama.attention.head_count", Value::U32(0), "head counts"),
        (
            "llama.attention.head_count_kv",
            Value::U32(3),
            "head counts",
        ),
        ("llama.context_length", Value::U32(0), "context length is 0"),
        ("llama.vocab_size", Value::U64(1 << 40), "absurd vocabulary"),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(f32::NAN),
            "invalid eps",
        ),
        ("llama.rope.freq_base", Value::F32(0.0), "rope theta"),
    ] {
        rewrite_gguf(
            &src,
            &dst,
            |kv| set_kv(kv, key, Some(v.clone())),
            |_, _| true,
        );
        match format_err(&dst) {
            FormatError::Corrupt { what, .. } => {
                assert!(what.contains(want), "{key}={v:?}: {what}")
            }
            e => panic!("{key}={v:?}: expected Corrupt, got {e}"),
        }
    }
    // Values that disagree with the stored shapes.
    for (key, v, tensor_name) in [
        (
            "llama.feed_forward_length",
            Value::U32(128),
            "blk.0.ffn_gate.weight",
        ),
        (
            "llama.embedding_length",
            Value::U32(128),
            "token_embd.weight",
        ),
        ("llama.vocab_size", Value::U32(98), "token_embd.weight"),
        (
            "llama.attention.head_count_kv",
            Value::U32(4),
            "blk.0.attn_k.weight",
        ),
    ] {
        rewrite_gguf(
            &src,
            &dst,
            |kv| set_kv(kv, key, Some(v.clone())),
            |_, _| true,
        );
        match format_err(&dst) {
            FormatError::ShapeMismatch { tensor, path, .. } => {
                assert_eq!(tensor, tensor_name, "{key}={v:?}");
                assert_eq!(path, dst);
            }
            e => panic!("{key}={v:?}: expected ShapeMismatch, got {e}"),
        }
    }
    // More layers than stored.
    rewrite_gguf(
        &src,
        &dst,
        |kv| set_kv(kv, "llama.block_count", Some(Value::U32(3))),
        |_, _| true,
    );
    match format_err(&dst) {
        FormatError::MissingTensor { tensor, .. } => assert_eq!(tensor, "blk.2.attn_norm.weight"),
        e => panic!("expected MissingTensor, got {e}"),
    }
    // A stored tensor transposed.
    rewrite_gguf(
        &src,
        &dst,
        |_| {},
        |n, s| {
            if n == "blk.1.attn_k.weight" {
                s.reverse();
            }
            true
        },
    );
    match format_err(&dst) {
        FormatError::ShapeMismatch {
            tensor,
            got,
            expected,
            ..
        } => {
            assert_eq!(tensor, "blk.1.attn_k.weight");
            assert_eq!((got, expected), (vec![64, 32], vec![32, 64]));
        }
        e => panic!("expected ShapeMismatch, got {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Forward requests
// ---------------------------------------------------------------------------------------------

fn req<'a>(tokens: &'a [u32], positions: &'a [u32], kv_write: KvWrite<'a>) -> ForwardRequest<'a> {
    ForwardRequest {
        tokens,
        positions,
        mask: AttnMask::Causal,
        kv_write,
        logits: LogitRows::Last,
    }
}

fn check_context_and_vocab(m: &Model, what: &str) {
    let (ctx, vocab) = (m.config.max_ctx, m.config.vocab);
    let last = ctx as u32 - 1;
    let mut cache = m.new_cache();

    // The last position in the context and the last token in the vocabulary are fine.
    let out = m
        .forward(
            &req(&[vocab as u32 - 1], &[last], KvWrite::None),
            &mut cache,
        )
        .unwrap();
    assert_eq!(out.logits.len(), vocab, "{what}");

    for positions in [
        vec![0, ctx as u32],
        vec![ctx as u32 + 5],
        vec![u32::MAX],
        vec![0, 1, u32::MAX - 1],
    ] {
        let tokens = vec![1u32; positions.len()];
        for kv in [KvWrite::None, KvWrite::Append] {
            match m.forward(&req(&tokens, &positions, kv), &mut cache) {
                Err(ModelError::ContextOverflow { pos, ctx: c }) => {
                    assert_eq!(
                        pos,
                        *positions.iter().find(|&&p| p as usize >= ctx).unwrap(),
                        "{what}"
                    );
                    assert_eq!(c, ctx, "{what}");
                }
                Err(e) => {
                    panic!("{what} positions {positions:?}: expected ContextOverflow, got {e}")
                }
                Ok(_) => {
                    panic!("{what} positions {positions:?}: forward past the context succeeded")
                }
            }
            assert_eq!(
                cache.len(),
                0,
                "{what}: a rejected request changed the KV cache"
            );
        }
    }
    for tokens in [
        vec![1, vocab as u32],
        vec![vocab as u32 + 1000],
        vec![u32::MAX, 1],
    ] {
        let positions: Vec<u32> = (0..tokens.len() as u32).collect();
        match m.forward(&req(&tokens, &positions, KvWrite::None), &mut cache) {
            Err(ModelError::BadToken { id, vocab: v }) => {
                assert_eq!(
                    id,
                    *tokens.iter().find(|&&t| t as usize >= vocab).unwrap(),
                    "{what}"
                );
                assert_eq!(v, vocab, "{what}");
            }
            Err(e) => panic!("{what} tokens {tokens:?}: expected BadToken, got {e}"),
            Ok(_) => panic!("{what} tokens {tokens:?}: out-of-vocabulary token accepted"),
        }
    }
    // Malformed requests.
    let bad: [(&str, ForwardRequest); 5] = [
        ("no tokens", req(&[], &[], KvWrite::None)),
        ("positions length", req(&[1, 2], &[0], KvWrite::None)),
        (
            "explicit mask size",
            ForwardRequest {
                mask: AttnMask::Explicit(&[true; 3]),
                ..req(&[1, 2], &[0, 1], KvWrite::None)
            },
        ),
        (
            "block 0",
            ForwardRequest {
                mask: AttnMask::Blockwise { block: 0 },
                ..req(&[1, 2], &[0, 1], KvWrite::None)
            },
        ),
        (
            "kv slots length",
            req(&[1, 2], &[0, 1], KvWrite::Slots(&[Some(0)])),
        ),
    ];
    for (name, r) in bad {
        match m.forward(&r, &mut cache) {
            Err(ModelError::BadRequest(_)) => {}
            Err(e) => panic!("{what} {name}: expected BadRequest, got {e}"),
            Ok(_) => panic!("{what} {name}: malformed request accepted"),
        }
        assert_eq!(
            cache.len(),
            0,
            "{what} {name}: a rejected request changed the KV cache"
        );
    }
    // A KV write that leaves a hole, and a cache of the wrong shape.
    match m.forward(&req(&[1], &[0], KvWrite::Slots(&[Some(3)])), &mut cache) {
        Err(ModelError::Kv(llada_runtime::KvError::Hole { slot: 3, len: 0 })) => {}
        r => panic!(
            "{what}: expected a KV hole error, got {:?}",
            r.map(|o| o.rows)
        ),
    }
    let mut wrong = llada_runtime::KvCache::new(m.config.n_layers + 1, m.config.kv_dim(), 8);
    assert!(
        matches!(
            m.forward(&req(&[1], &[0], KvWrite::Append), &mut wrong),
            Err(ModelError::BadRequest(_))
        ),
        "{what}"
    );
}

#[test]
fn forward_past_context_or_vocab() {
    let f = fixtures();
    for p in [
        f.join("hf-llama"),
        f.join("gguf-llama.gguf"),
        f.join("gguf-llama-q4_1.gguf"),
    ] {
        let m = Model::load(&p, &opts()).unwrap();
        check_context_and_vocab(&m, &p.display().to_string());
    }
    // A context so small a short prompt overflows it.
    let s = hf_copy("ctx-small");
    edit_config(&s, |c| {
        c.insert("max_position_embeddings".into(), json!(4));
    });
    let m = Model::load(&s.0, &opts()).unwrap();
    assert_eq!(m.config.max_ctx, 4);
    check_context_and_vocab(&m, "ctx 4");
    let mut cache = m.new_cache();
    m.forward(
        &ForwardRequest::causal_append(&[1, 2, 3, 4], &[0, 1, 2, 3]),
        &mut cache,
    )
    .unwrap();
    assert_eq!(cache.len(), 4);
    assert!(matches!(
        m.forward(&ForwardRequest::causal_append(&[5], &[4]), &mut cache),
        Err(ModelError::ContextOverflow { pos: 4, ctx: 4 })
    ));
    assert_eq!(cache.len(), 4);
}

/// A request rejected for a bad token or a bad logit row must leave the KV cache as it was.
/// Currently fails: `Model::forward` grows the cache (`cache.grow_to`) before it looks up the
/// tokens and checks `LogitRows::Rows`, so a rejected request leaves zero-filled slots behind.
#[test]
fn rejected_request_leaves_cache_untouched() {
    let m = Model::load(&fixtures().join("hf-llama"), &opts()).unwrap();
    let vocab = m.config.vocab as u32;
    let mut cache = m.new_cache();
    m.forward(&ForwardRequest::causal_append(&[1, 2], &[0, 1]), &mut cache)
        .unwrap();
    assert_eq!(cache.len(), 2);
    let r = m.forward(
        &ForwardRequest::causal_append(&[3, vocab], &[2, 3]),
        &mut cache,
    );
    assert!(matches!(r, Err(ModelError::BadToken { .. })));
    assert_eq!(
        cache.len(),
        2,
        "BadToken left {} slots in the cache",
        cache.len()
    );
    let r = m.forward(
        &ForwardRequest {
            logits: LogitRows::Rows(&[5]),
            ..ForwardRequest::causal_append(&[3], &[2])
        },
        &mut cache,
    );
    assert!(matches!(r, Err(ModelError::BadRequest(_))));
    assert_eq!(
        cache.len(),
        2,
        "a bad logit row left {} slots in the cache",
        cache.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Special token ids, mistyped optional values, extra layers, tokenizers, I/O messages
// ---------------------------------------------------------------------------------------------

/// A copy of the fixture directory `name` (config, weights, and the tokenizer when `tokenizer`).
fn hf_copy_of(name: &str, tag: &str, tokenizer: bool) -> Scratch {
    let s = Scratch::new(tag);
    let src = fixtures().join(name);
    let files: &[&str] = if tokenizer {
        &["config.json", "model.safetensors", "tokenizer.json"]
    } else {
        &["config.json", "model.safetensors"]
    };
    for f in files {
        std::fs::copy(src.join(f), s.path(f)).unwrap();
    }
    s
}

fn assert_names_file(e: &FormatError, p: &Path) {
    assert!(e.to_string().contains(&p.display().to_string()), "{e}");
}

/// Loading `dir` fails with a Metadata error on `key`, naming config.json.
fn expect_config_key(dir: &Scratch, key: &str, what: &str) -> String {
    match format_err_naming(&dir.0, &dir.path("config.json")) {
        e @ FormatError::Metadata { .. } => {
            let FormatError::Metadata { key: k, .. } = &e else {
                unreachable!()
            };
            assert_eq!(k, key, "{what}: {e}");
            e.to_string()
        }
        e => panic!("{what}: expected Metadata on '{key}', got {e}"),
    }
}

#[test]
fn hf_special_token_ids_must_be_in_the_vocabulary() {
    // hf-llama: vocabulary of 97 tokens.
    for (key, val) in [
        ("mask_token_id", json!(1u64 << 40)), // once truncated to 0 by `as u32`
        ("mask_token_id", json!(1u64 << 32)),
        ("mask_token_id", json!(1000)),
        ("mask_token_id", json!(97)),
        ("eos_token_id", json!(97)),
        ("eos_token_id", json!(u64::MAX)),
        ("bos_token_id", json!(100_000)),
        ("bos_token_id", json!(-1)),
        ("bos_token_id", json!("94")),
        ("eos_token_id", json!(95.5)),
        ("eos_token_id", json!([95, 97])),
        ("eos_token_id", json!([95, "96"])),
    ] {
        let s = hf_copy("hf-ids");
        edit_config(&s, |c| {
            c.insert(key.into(), val.clone());
        });
        let msg = expect_config_key(&s, key, &format!("{key}={val}"));
        if val.as_u64().is_some_and(|v| v < 1 << 32) {
            assert!(msg.contains("outside the vocabulary (97 tokens)"), "{msg}");
        }
    }
    // In range, `null`, or a list of ids (LLaMA-3.1 style): fine.
    for (key, val, want) in [
        ("mask_token_id", json!(96), Some(96)),
        ("eos_token_id", json!([95, 96]), Some(95)),
        ("eos_token_id", J::Null, None),
        ("bos_token_id", J::Null, None),
    ] {
        let s = hf_copy("hf-ids-ok");
        edit_config(&s, |c| {
            c.insert(key.into(), val.clone());
        });
        let m = Model::load(&s.0, &opts()).unwrap();
        let got = match key {
            "mask_token_id" => m.config.mask_id,
            "eos_token_id" => m.config.eos_id,
            _ => m.config.bos_id,
        };
        assert_eq!(got, want, "{key}={val}");
    }
    // LLaDA without mask_token_id: the default mask id (126336) is outside a 97-token vocabulary.
    let s = hf_copy_of("hf-llada", "hf-llada-mask", false);
    edit_config(&s, |c| {
        c.remove("mask_token_id");
    });
    match format_err_naming(&s.0, &s.path("config.json")) {
        FormatError::Metadata { key, detail, .. } => {
            assert!(key.starts_with("mask_token_id"), "{key}");
            assert!(
                key.contains("126336") || detail.contains("126336"),
                "{key}{detail}"
            );
        }
        e => panic!("expected Metadata on mask_token_id, got {e}"),
    }
}

#[test]
fn hf_mistyped_optional_values_are_errors() {
    for (key, val) in [
        ("rms_norm_eps", json!("x")),
        ("rope_theta", json!("10000")),
        ("rope_theta", json!([10000])),
        ("num_key_value_heads", json!("2")),
        ("num_key_value_heads", json!(2.5)),
        ("head_dim", json!(-32)),
        ("max_position_embeddings", json!("4096")),
        ("tie_word_embeddings", json!("true")),
        ("tie_word_embeddings", json!(1)),
    ] {
        let s = hf_copy("hf-types");
        edit_config(&s, |c| {
            c.insert(key.into(), val.clone());
        });
        expect_config_key(&s, key, &format!("{key}={val}"));
    }
    // LLaDA's own field names.
    for (key, val) in [
        ("rms_norm_eps", json!({"eps": 1e-5})),
        ("n_kv_heads", json!("4")),
        ("weight_tying", json!("no")),
        ("include_bias", json!(0)),
        ("embedding_size", json!("97")),
        ("max_sequence_length", json!(1.5)),
    ] {
        let s = hf_copy_of("hf-llada", "hf-llada-types", false);
        edit_config(&s, |c| {
            c.insert(key.into(), val.clone());
        });
        expect_config_key(&s, key, &format!("{key}={val}"));
    }
    // `null` means "absent": the default.
    let s = hf_copy("hf-types-null");
    edit_config(&s, |c| {
        c.insert("rope_theta".into(), J::Null);
        c.insert("head_dim".into(), J::Null);
    });
    let m = Model::load(&s.0, &opts()).unwrap();
    assert_eq!(m.config.rope_theta, 10000.0);
    // Out-of-range values name their key.
    for (key, val) in [("rope_theta", json!(0.5)), ("rms_norm_eps", json!(-1.0))] {
        let s = hf_copy("hf-types-range");
        edit_config(&s, |c| {
            c.insert(key.into(), val.clone());
        });
        let e = format_err_naming(&s.0, &s.path("config.json"));
        assert!(e.to_string().contains(&format!("'{key}'")), "{e}");
    }
}

#[test]
fn gguf_special_ids_and_mistyped_values() {
    let s = Scratch::new("gguf-ids");
    let src = fixtures().join("gguf-llama.gguf");
    let dst = s.path("m.gguf");
    // (key, value) that must fail with a Metadata error on the key (vocabulary: 97 tokens).
    for (key, v) in [
        ("tokenizer.ggml.eos_token_id", Value::U32(97)),
        ("tokenizer.ggml.eos_token_id", Value::String("95".into())),
        ("tokenizer.ggml.bos_token_id", Value::U64(1 << 40)),
        ("tokenizer.ggml.bos_token_id", Value::I32(-1)),
        ("tokenizer.ggml.mask_token_id", Value::U32(1000)),
        ("tokenizer.ggml.mask_token_id", Value::F32(3.0)),
        ("llama.rope.freq_base", Value::String("10000".into())),
        ("llama.attention.head_count_kv", Value::String("2".into())),
        ("llama.attention.key_length", Value::F32(32.0)),
        ("llama.vocab_size", Value::String("97".into())),
        ("diffusion.shift_logits", Value::String("yes".into())),
    ] {
        rewrite_gguf(
            &src,
            &dst,
            |kv| set_kv(kv, key, Some(v.clone())),
            |_, _| true,
        );
        assert_names_file(&format_err(&dst), &dst);
        // With and without the tokenizer (which reads the token ids too).
        for o in [opts(), LoadOptions::default()] {
            match Model::load(&dst, &o) {
                Err(ModelError::Format(FormatError::Metadata { key: k, .. })) => {
                    assert_eq!(k, key, "{v:?}")
                }
                Err(e) => panic!("{key}={v:?}: expected Metadata, got {e}"),
                Ok(_) => panic!("{key}={v:?} loaded"),
            }
        }
    }
    // Non-finite rope theta: an error naming the key.
    for v in [
        Value::F32(f32::INFINITY),
        Value::F64(f64::INFINITY),
        Value::F64(f64::NAN),
    ] {
        rewrite_gguf(
            &src,
            &dst,
            |kv| set_kv(kv, "llama.rope.freq_base", Some(v.clone())),
            |_, _| true,
        );
        match format_err(&dst) {
            FormatError::Corrupt { what, .. } => {
                assert!(
                    what.contains("rope theta") && what.contains("llama.rope.freq_base"),
                    "{what}"
                )
            }
            e => panic!("freq_base={v:?}: expected Corrupt, got {e}"),
        }
    }
    // In range: loads.
    rewrite_gguf(
        &src,
        &dst,
        |kv| set_kv(kv, "tokenizer.ggml.eos_token_id", Some(Value::U32(96))),
        |_, _| true,
    );
    let m = Model::load(&dst, &LoadOptions::default()).unwrap();
    assert_eq!(m.config.eos_id, Some(96));
    assert!(m.tokenizer.unwrap().stop_ids.contains(&96));
}

#[test]
fn layers_beyond_the_config_are_refused() {
    // HF LLaMA: num_hidden_layers 1 with two layers stored.
    let s = hf_copy("hf-extra-layers");
    edit_config(&s, |c| {
        c.insert("num_hidden_layers".into(), json!(1));
    });
    let st = s.path("model.safetensors");
    match format_err_naming(&s.0, &st) {
        FormatError::Corrupt { what, path } => {
            assert_eq!(path, st);
            assert!(
                what.contains("'model.layers.1.input_layernorm.weight'")
                    && what.contains("num_hidden_layers = 1")
                    && what.contains("config.json"),
                "{what}"
            );
        }
        e => panic!("expected Corrupt, got {e}"),
    }
    // HF LLaDA: n_layers.
    let s = hf_copy_of("hf-llada", "hf-llada-extra", false);
    edit_config(&s, |c| {
        c.insert("n_layers".into(), json!(1));
    });
    let e = format_err_naming(&s.0, &s.path("model.safetensors"));
    assert!(
        e.to_string()
            .contains("'model.transformer.blocks.1.attn_norm.weight'")
            && e.to_string().contains("n_layers = 1"),
        "{e}"
    );
    // GGUF: block_count.
    let g = Scratch::new("gguf-extra-layers");
    let dst = g.path("m.gguf");
    rewrite_gguf(
        &fixtures().join("gguf-llama.gguf"),
        &dst,
        |kv| set_kv(kv, "llama.block_count", Some(Value::U32(1))),
        |_, _| true,
    );
    let e = format_err(&dst);
    assert!(
        e.to_string().contains("'blk.1.attn_k.weight'")
            && e.to_string().contains("llama.block_count = 1"),
        "{e}"
    );
    // A layer far beyond, stored alone: still found.
    let s = hf_copy("hf-extra-far");
    edit_weights(&s, |t| {
        let mut x = t
            .iter()
            .find(|x| x.0 == "model.layers.0.input_layernorm.weight")
            .unwrap()
            .clone();
        x.0 = "model.layers.17.input_layernorm.weight".into();
        t.push(x);
    });
    let e = format_err_naming(&s.0, &s.path("model.safetensors"));
    assert!(
        e.to_string()
            .contains("'model.layers.17.input_layernorm.weight'"),
        "{e}"
    );
    // Extra buffers inside the configured layers (older LLaMA checkpoints store
    // `rotary_emb.inv_freq`) are not layers beyond the config: still fine.
    let s = hf_copy("hf-inv-freq");
    edit_weights(&s, |t| {
        for l in 0..2 {
            t.push((
                format!("model.layers.{l}.self_attn.rotary_emb.inv_freq"),
                "F32".into(),
                vec![16],
                vec![0u8; 64],
            ));
        }
    });
    Model::load(&s.0, &opts()).unwrap();
}

#[test]
fn tokenizer_ids_beyond_the_model_vocabulary() {
    // HF: tokenizer.json with an id the 97-row model does not have.
    let s = hf_copy_of("hf-llama", "hf-tok-ids", true);
    let p = s.path("tokenizer.json");
    let mut t: J = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    t["model"]["vocab"]
        .as_object_mut()
        .unwrap()
        .insert("zzz".into(), json!(100_000));
    std::fs::write(&p, t.to_string()).unwrap();
    let full = LoadOptions::default();
    match Model::load(&s.0, &full) {
        Err(ModelError::Format(e @ FormatError::Tokenizer { .. })) => {
            let msg = e.to_string();
            assert!(msg.contains(&p.display().to_string()), "{msg}");
            assert!(msg.contains("100000") && msg.contains("97 tokens"), "{msg}");
        }
        Err(e) => panic!("expected a tokenizer error, got {e}"),
        Ok(_) => panic!("a tokenizer with id 100000 loaded for a 97-token model"),
    }
    // An added token just past the vocabulary loads (Llama-2's HF checkpoints add `<pad>` at
    // id 32 000 with vocab_size 32 000); a prompt containing it is refused at the forward pass.
    t["model"]["vocab"].as_object_mut().unwrap().remove("zzz");
    let mut added = t["added_tokens"].as_array().cloned().unwrap_or_default();
    added.push(
        json!({"id": 97, "content": "<pad>", "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": true}),
    );
    t["added_tokens"] = json!(added);
    std::fs::write(&p, t.to_string()).unwrap();
    if let Err(e) = Model::load(&s.0, &full) {
        panic!("an added token past the vocabulary was refused: {e}");
    }
    // An empty vocabulary.
    t["model"]["vocab"] = json!({});
    t["added_tokens"] = json!([]);
    std::fs::write(&p, t.to_string()).unwrap();
    match Model::load(&s.0, &full) {
        Err(ModelError::Format(e)) => {
            assert!(e.to_string().contains(&p.display().to_string()), "{e}");
            assert!(e.to_string().contains("empty"), "{e}");
        }
        Err(e) => panic!("expected a format error, got {e}"),
        Ok(_) => panic!("an empty tokenizer loaded"),
    }
    // GGUF: one token more than llama.vocab_size (97).
    let g = Scratch::new("gguf-tok-ids");
    let dst = g.path("m.gguf");
    rewrite_gguf(
        &fixtures().join("gguf-llama.gguf"),
        &dst,
        |kv| {
            for (k, v) in kv.iter_mut() {
                if let Value::Array(a) = v {
                    match k.as_str() {
                        "tokenizer.ggml.tokens" => a.push(Value::String("zzz-extra".into())),
                        "tokenizer.ggml.token_type" => a.push(a[0].clone()),
                        _ => {}
                    }
                }
            }
        },
        |_, _| true,
    );
    match Model::load(&dst, &full) {
        Err(ModelError::Format(e @ FormatError::Tokenizer { .. })) => {
            let msg = e.to_string();
            assert!(msg.contains(&dst.display().to_string()), "{msg}");
            assert!(
                msg.contains("tokenizer.ggml.tokens") && msg.contains("97"),
                "{msg}"
            );
        }
        Err(e) => panic!("expected a tokenizer error, got {e}"),
        Ok(_) => panic!("98 tokens loaded for a 97-token model"),
    }
}

/// Every checkpoint the project ships or tests with still loads, tokenizer included.
#[test]
fn shipped_models_and_fixtures_load_with_their_tokenizers() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root.join("models"))
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.join("config.json").exists())
                .collect()
        })
        .unwrap_or_default();
    for f in [
        "hf-llama",
        "hf-qwen2",
        "hf-llada",
        "hf-dream",
        "gguf-llama.gguf",
        "gguf-llama-q8.gguf",
        "gguf-llama-q4_1.gguf",
        "gguf-qwen2.gguf",
        "gguf-llada.gguf",
        "gguf-dream.gguf",
    ] {
        paths.push(fixtures().join(f));
    }
    // The fetched default model, where `llada fetch` keeps it (its cache-directory rule).
    let cache = std::env::var_os("LLADA_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|p| PathBuf::from(p).join("llada")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/llada")));
    if let Some(c) = cache {
        let smol = c.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
        if smol.exists() {
            paths.push(smol);
        }
    }
    for p in paths {
        let m = Model::load(&p, &LoadOptions::default())
            .unwrap_or_else(|e| panic!("{} no longer loads: {e}", p.display()));
        if let Some(t) = &m.tokenizer {
            assert!(
                (t.max_token_id().unwrap() as usize) < m.config.vocab,
                "{}",
                p.display()
            );
        }
    }
}

/// An I/O error's message is printed once by `{:#}` (anyhow's chain), as the CLI prints it.
#[test]
fn io_errors_print_their_message_once() {
    let s = Scratch::new("io-once");
    for (p, want) in [
        (s.0.clone(), "No such file or directory"), // no config.json
        (s.path("model.gguf"), "No such file or directory"), // missing file
        (PathBuf::from("/dev/null"), "is not a regular file"), // a device
    ] {
        if !p.exists() && want != "No such file or directory" {
            continue;
        }
        let e = match Model::load(&p, &opts()) {
            Err(e) => anyhow::Error::from(e),
            Ok(_) => panic!("{} loaded", p.display()),
        };
        let text = format!("{e:#}");
        assert_eq!(text.matches(want).count(), 1, "{text}");
        assert!(!text.contains("os error 19"), "{text}");
    }
    // A model.safetensors that is a directory.
    let d = hf_copy("io-dir");
    std::fs::remove_file(d.path("model.safetensors")).unwrap();
    std::fs::create_dir(d.path("model.safetensors")).unwrap();
    let text = format!("{:#}", anyhow::Error::from(load_err(&d.0)));
    assert!(text.contains("model.safetensors: is a directory"), "{text}");
}
