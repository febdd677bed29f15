//! The diffusion decoder against the independent numpy reference of LLaDA's `generate` and
//! Dream's `diffusion_generate` (tests/reference/ref_diffusion.py), on the tiny fixture
//! checkpoints; and the cache strategies against the reference where they must agree.

use llada_decode::diffusion::{
    dream_transfer, generate, CacheMode, Confidence, DiffusionConfig, Schedule,
};
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use serde_json::Value;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    let p = std::env::var_os("LLADA_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"));
    assert!(
        p.join("expected.json").exists(),
        "fixtures missing at {}: run `python3 tests/reference/make_fixtures.py tests/fixtures`",
        p.display()
    );
    p
}

fn load(name: &str) -> Model {
    Model::load(
        &fixtures().join(name),
        &LoadOptions {
            no_tokenizer: true,
            ..Default::default()
        },
    )
    .unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn vanilla_matches_numpy_reference() {
    let p = fixtures().join("diffusion_expected.json");
    let exp: Value = serde_json::from_str(
        &std::fs::read_to_string(&p).unwrap_or_else(|_| panic!("{} missing", p.display())),
    )
    .unwrap();
    let lane = Lane::new("dense", 2).unwrap();
    let cases = exp["cases"].as_array().unwrap();
    assert!(cases.len() >= 4);
    for c in cases {
        let model = load(c["model"].as_str().unwrap());
        let prompt = ids(&c["prompt"]);
        let gen = c["gen_length"].as_u64().unwrap() as usize;
        let steps = c["steps"].as_u64().unwrap() as usize;
        let cfg = if c["algorithm"] == "dream" {
            let conf = match c["alg"].as_str().unwrap() {
                "topk_margin" => Confidence::Margin,
                "entropy" => Confidence::NegEntropy,
                _ => Confidence::TopProb,
            };
            DiffusionConfig::dream(gen, steps, conf)
        } else {
            DiffusionConfig {
                steps,
                ..DiffusionConfig::one_per_step(gen, c["block_length"].as_u64().unwrap() as usize)
            }
        };
        let out = generate(&model, &lane, &prompt, &cfg).unwrap();
        assert_eq!(out.tokens, ids(&c["output"]), "case {c}");
        assert_eq!(out.forward_passes, steps);
    }
}

#[test]
fn strategies_agree_where_they_must() {
    // One block, one step: every strategy's only pass is a full pass, so outputs coincide.
    let lane = Lane::new("dense", 2).unwrap();
    for name in ["hf-llada", "hf-dream"] {
        let model = load(name);
        let prompt = [5u32, 17, 33, 8, 2, 61];
        let base = DiffusionConfig {
            steps: 1,
            ..DiffusionConfig::one_per_step(8, 8)
        };
        let reference = generate(&model, &lane, &prompt, &base).unwrap();
        for cache in [CacheMode::Prefix, CacheMode::Dual] {
            let out = generate(
                &model,
                &lane,
                &prompt,
                &DiffusionConfig {
                    cache,
                    ..base.clone()
                },
            )
            .unwrap();
            assert_eq!(out.tokens, reference.tokens, "{name} {cache:?}");
        }
        // Threshold 1e-9 commits everything in the first step: same as one step.
        let out = generate(
            &model,
            &lane,
            &prompt,
            &DiffusionConfig {
                threshold: Some(1e-9),
                steps: 8,
                ..base.clone()
            },
        )
        .unwrap();
        assert_eq!(out.tokens, reference.tokens);
        assert_eq!(out.forward_passes, 1);
        // Caches cut the rows computed per step.
        let cfg = DiffusionConfig::one_per_step(32, 8);
        let v = generate(&model, &lane, &prompt, &cfg).unwrap();
        let pre = generate(
            &model,
            &lane,
            &prompt,
            &DiffusionConfig {
                cache: CacheMode::Prefix,
                ..cfg.clone()
            },
        )
        .unwrap();
        let dual = generate(
            &model,
            &lane,
            &prompt,
            &DiffusionConfig {
                cache: CacheMode::Dual,
                ..cfg.clone()
            },
        )
        .unwrap();
        assert_eq!(v.forward_passes, 32);
        assert_eq!(pre.forward_passes, 32);
        assert!(
            pre.rows_computed < v.rows_computed && dual.rows_computed < pre.rows_computed,
            "{} {} {}",
            v.rows_computed,
            pre.rows_computed,
            dual.rows_computed
        );
        assert!(
            !v.tokens.contains(&96) && !dual.tokens.contains(&96),
            "no mask left"
        );
    }
}

#[test]
fn dream_schedule_commits_everything() {
    for steps in [1, 3, 8, 16, 64] {
        let mut masked = 16usize;
        for s in 0..steps {
            let k = dream_transfer(masked, s, steps, 1e-3);
            assert!(k <= masked);
            masked -= k;
        }
        assert_eq!(masked, 0, "steps {steps}");
    }
    assert_eq!(Schedule::Uniform, Schedule::Uniform);
}

#[test]
fn bad_options_are_refused() {
    let lane = Lane::new("dense", 1).unwrap();
    let model = load("hf-llada");
    for cfg in [
        DiffusionConfig::one_per_step(30, 8),
        DiffusionConfig {
            steps: 3,
            ..DiffusionConfig::one_per_step(16, 8)
        },
        DiffusionConfig {
            threshold: Some(1.5),
            ..DiffusionConfig::one_per_step(16, 8)
        },
    ] {
        assert!(generate(&model, &lane, &[1, 2], &cfg).is_err());
    }
    // The causal LLaMA fixture has no mask token.
    assert!(generate(
        &load("hf-llama"),
        &lane,
        &[1, 2],
        &DiffusionConfig::one_per_step(8, 8)
    )
    .is_err());
}
