//! `llada convert` on the tiny HF fixtures of every architecture and on the shipped zoo models:
//! (a) llama.cpp's own reader (gguf-py) reads every key and tensor with llama.cpp's names and
//! shapes, and (b) the numpy reference gives the same logits from the file as from the HF
//! directory, within the type's error — both by `tests/reference/check_convert.py`; (c) our
//! engine generates the same greedy tokens from both; and bad input is refused by a typed error.

use llada_convert::{plan_convert, plan_quantize, ConvertError, Target};
use llada_decode::diffusion::{generate_vanilla, Confidence, DiffusionConfig};
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> PathBuf {
    let p = root().join("tests/fixtures");
    assert!(
        p.join("expected.json").exists(),
        "fixtures missing at {}: run `python3 tests/reference/make_fixtures.py tests/fixtures`",
        p.display()
    );
    p
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llada-convert-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Whether gguf-py is importable; when it is not, the Python checks are skipped with the reason
/// printed, except under `LLADA_REQUIRE_REAL_MODELS` (scripts/test.sh installs it).
fn have_gguf_py() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("LLADA_REQUIRE_REAL_MODELS").is_none(),
            "the gguf package is missing (pip install gguf)"
        );
        eprintln!(
            "skipping the gguf-py checks: `python3 -c 'import gguf'` fails (pip install gguf)"
        );
    }
    ok
}

fn convert(dir: &Path, out: &Path, t: Target) {
    plan_convert(dir, t).unwrap().write(out, &|_| {}).unwrap();
}

fn check_with_gguf_py(dir: &Path, out: &Path) {
    let o = Command::new("python3")
        .arg(root().join("tests/reference/check_convert.py"))
        .args([dir, out])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{} {}: {}{}",
        dir.display(),
        out.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn load(p: &Path, tokenizer: bool) -> Model {
    let opts = LoadOptions {
        no_tokenizer: !tokenizer,
        ..Default::default()
    };
    Model::load(p, &opts).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Greedy tokens: vanilla diffusion (one token per step) for LLaDA/Dream, greedy decoding for
/// LLaMA/Qwen2.
fn greedy(m: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let lane = Lane::new("dense", 2).unwrap();
    if m.config.arch.is_diffusion() {
        let cfg = if m.config.shift_logits {
            DiffusionConfig::dream(n, n, Confidence::TopProb)
        } else {
            DiffusionConfig::one_per_step(n, n)
        };
        return generate_vanilla(m, &lane, prompt, &cfg).unwrap().tokens;
    }
    let cfg = llada_decode::ar::GenerateConfig {
        max_tokens: n,
        stop_at_eos: false,
        ..Default::default()
    };
    llada_decode::ar::generate(m, &lane, prompt, &cfg, |_| true)
        .unwrap()
        .tokens
}

#[test]
fn fixtures_of_every_architecture_convert_to_every_type() {
    let py = have_gguf_py();
    let d = tmp("fixtures");
    let types = [
        Target::F16,
        Target::BF16,
        Target::F32,
        Target::Q8_0,
        Target::Q6K,
        Target::Q5KM,
        Target::Q4KM,
        Target::Q4_0,
    ];
    for arch in ["llada", "dream", "llama", "qwen2"] {
        let hf = fixtures().join(format!("hf-{arch}"));
        let reference = greedy(&load(&hf, false), &[5, 17, 42, 3], 8);
        for t in types {
            let out = d.join(format!("{arch}-{t}.gguf"));
            convert(&hf, &out, t);
            if py {
                check_with_gguf_py(&hf, &out);
            }
            // The fixtures' weights are exact in f16 and bf16: same tokens.
            if matches!(t, Target::F16 | Target::BF16 | Target::F32) {
                let got = greedy(&load(&out, false), &[5, 17, 42, 3], 8);
                assert_eq!(got, reference, "{arch} {t}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// The shipped zoo models, converted to f16 (their weights are f16: lossless), tokenize the same
/// text to the same ids and give token-identical vanilla diffusion output.
#[test]
fn zoo_models_give_identical_diffusion_output() {
    let py = have_gguf_py();
    let d = tmp("zoo");
    for (name, text) in [
        ("tiny-llada-tasks", "add 12+7="),
        ("tiny-dream-tasks", "add 12+7="),
        ("tiny-llada-prose", "Once upon a time, there was a"),
    ] {
        let hf = root().join("models").join(name);
        let out = d.join(format!("{name}.gguf"));
        convert(&hf, &out, Target::F16);
        if py {
            check_with_gguf_py(&hf, &out);
        }
        let (a, b) = (load(&hf, true), load(&out, true));
        let enc = |m: &Model| m.tokenizer.as_ref().unwrap().encode(text).unwrap();
        let prompt = enc(&a);
        assert_eq!(enc(&b), prompt, "{name}: tokenization");
        assert_eq!(a.config.bos_id, b.config.bos_id, "{name}");
        let mut p = prompt.clone();
        if let Some(bos) = a.config.bos_id {
            p.insert(0, bos);
        }
        let (ga, gb) = (greedy(&a, &p, 16), greedy(&b, &p, 16));
        assert_eq!(ga, gb, "{name}");
        let dec = |m: &Model, t: &[u32]| m.tokenizer.as_ref().unwrap().decode(t);
        assert_eq!(dec(&a, &ga), dec(&b, &gb), "{name}: text");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// `quantize` from a converted f16 file gives the file `convert` gives directly (same types,
/// same bytes: both quantize the same f32 values).
#[test]
fn quantize_equals_direct_conversion() {
    let d = tmp("requant");
    let hf = root().join("models/tiny-llada-prose");
    let f16 = d.join("f16.gguf");
    convert(&hf, &f16, Target::F16);
    for t in [Target::Q4KM, Target::Q8_0, Target::BF16] {
        let direct = d.join("direct.gguf");
        convert(&hf, &direct, t);
        let re = d.join("re.gguf");
        plan_quantize(&f16, t).unwrap().write(&re, &|_| {}).unwrap();
        let (a, b) = (
            llada_formats::gguf::GgufFile::open(&direct).unwrap(),
            llada_formats::gguf::GgufFile::open(&re).unwrap(),
        );
        assert_eq!(a.order, b.order);
        for n in &a.order {
            let (x, y) = (&a.tensors[n], &b.tensors[n]);
            assert_eq!((x.ty, &x.ne), (y.ty, &y.ne), "{t} {n}");
            let (vx, vy) = (
                llada_formats::TensorSource::get(&a, n).unwrap(),
                llada_formats::TensorSource::get(&b, n).unwrap(),
            );
            assert_eq!(vx.bytes(), vy.bytes(), "{t} {n}");
        }
        assert_eq!(a.get("general.file_type"), b.get("general.file_type"));
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Bad input: a typed error naming the file, and nothing written.
#[test]
fn bad_input_is_refused() {
    let d = tmp("bad");
    let copy = |name: &str| {
        let dst = d.join(name);
        std::fs::create_dir_all(&dst).unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            std::fs::copy(fixtures().join("hf-llama").join(f), dst.join(f)).unwrap();
        }
        dst
    };
    let out = d.join("out.gguf");
    // Unknown architecture.
    let dir = copy("gpt2");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let cfg = cfg
        .replace("LlamaForCausalLM", "GPT2LMHeadModel")
        .replace("\"llama\"", "\"gpt2\"");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let e = plan_convert(&dir, Target::F16).err().unwrap();
    assert!(e.to_string().contains("unsupported architecture"), "{e}");
    // A tensor llama.cpp has no name for.
    let dir = copy("extra");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        cfg.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1"),
    )
    .unwrap();
    let e = plan_convert(&dir, Target::F16).err().unwrap();
    assert!(matches!(e, ConvertError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("model.layers.1."), "{e}");
    // A missing tensor (a config asking for a third layer).
    let dir = copy("missing");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        cfg.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3"),
    )
    .unwrap();
    let e = plan_convert(&dir, Target::F16).err().unwrap();
    assert!(e.to_string().contains("missing tensor"), "{e}");
    // Not an HF directory; an input that is not GGUF.
    assert!(plan_convert(&d.join("nothing"), Target::F16).is_err());
    let e = plan_quantize(&dir.join("config.json"), Target::Q8_0)
        .err()
        .unwrap();
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
    // An output path that is a directory, or in a missing directory: an error, no file.
    let plan = plan_convert(&fixtures().join("hf-llama"), Target::F16).unwrap();
    assert!(plan.write(&d, &|_| {}).is_err());
    assert!(plan.write(&d.join("no/such/dir.gguf"), &|_| {}).is_err());
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&d);
}
