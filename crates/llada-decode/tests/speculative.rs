//! Speculative decoding is lossless: greedy output equals target-only greedy for every drafter
//! and tree shape (fixture models), and sampled output follows the target's distribution
//! (chi-square over many seeds, both sampling rules).

use llada_decode::sampling::{softmax, Sampler};
use llada_decode::speculative::drafter::{Drafter, ModelDrafter, NgramDrafter, TreeShape};
use llada_decode::speculative::{generate as spec_generate, SpecConfig};
use llada_decode::{generate, GenerateConfig, SamplingParams};
use llada_model::{AttnMask, ForwardRequest, KvWrite, LoadOptions, LogitRows, Model};
use llada_runtime::Lane;
use std::path::PathBuf;

fn load(name: &str) -> Model {
    let p = std::env::var_os("LLADA_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"));
    Model::load(&p.join(name), &LoadOptions::default()).unwrap()
}

fn shapes() -> Vec<TreeShape> {
    vec![
        TreeShape::Chain { n: 6, p_min: 0.0 },
        TreeShape::TopK {
            widths: vec![3, 2, 1],
        },
        TreeShape::CostAware {
            max_nodes: 12,
            max_depth: 5,
            top_k: 3,
        },
    ]
}

#[test]
fn greedy_is_identical_to_target_alone() {
    let target = load("hf-llama");
    let other = load("hf-qwen2"); // a different model over the same 97 ids: a poor draft
    let lane = Lane::new("dense", 1).unwrap();
    let sparse = Lane::new("sparse", 1).unwrap();
    let mut checked = 0;
    for seed in 0..6u32 {
        let prompt: Vec<u32> = (0..5 + seed)
            .map(|i| 3 + (i * 7 + seed * 13) % 90)
            .collect();
        let reference = generate(
            &target,
            &lane,
            &prompt,
            &GenerateConfig {
                max_tokens: 20,
                stop_at_eos: false,
                ..Default::default()
            },
            |_| true,
        )
        .unwrap();
        for shape in shapes() {
            let drafters: Vec<Box<dyn Drafter + '_>> = vec![
                Box::new(NgramDrafter),
                Box::new(ModelDrafter::new(&target, &lane, 0.0)),
                Box::new(ModelDrafter::new(&other, &lane, 0.0)),
            ];
            for mut d in drafters {
                let out = spec_generate(
                    &target,
                    &lane,
                    Some(&sparse),
                    d.as_mut(),
                    &prompt,
                    &SpecConfig {
                        max_tokens: 20,
                        sampling: SamplingParams::default(),
                        shape: shape.clone(),
                        stop_ids: vec![],
                    },
                )
                .unwrap();
                assert_eq!(
                    out.tokens,
                    reference.tokens,
                    "{} {shape:?} prompt {prompt:?}",
                    d.name()
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 54);
    // The target drafting for itself is accepted throughout.
    let mut me = ModelDrafter::new(&target, &lane, 0.0);
    let out = spec_generate(
        &target,
        &lane,
        None,
        &mut me,
        &[5, 9, 14],
        &SpecConfig {
            max_tokens: 21,
            sampling: SamplingParams::default(),
            shape: TreeShape::Chain { n: 6, p_min: 0.0 },
            stop_ids: vec![],
        },
    )
    .unwrap();
    assert_eq!(out.verify_passes, 3, "{out:?}");
    assert_eq!(out.accepted, 18);
}

#[test]
fn sampling_follows_the_target_distribution() {
    let target = load("hf-llama");
    let lane = Lane::new("dense", 1).unwrap();
    let prompt = [7u32, 21, 40, 3];
    // The target's own first-token distribution at temperature 1.
    let mut cache = target.new_cache();
    let pos: Vec<u32> = (0..prompt.len() as u32).collect();
    let out = target
        .forward(
            &ForwardRequest {
                tokens: &prompt,
                positions: &pos,
                mask: AttnMask::Causal,
                kv_write: KvWrite::None,
                logits: LogitRows::Last,
            },
            &mut cache,
        )
        .unwrap();
    let mut p = out.row(0).to_vec();
    softmax(&mut p);
    let params = |seed| SamplingParams {
        temperature: 1.0,
        seed,
        ..Default::default()
    };
    assert_eq!(
        Sampler::new(params(0)).distribution(out.row(0)).len(),
        p.len()
    );
    let n = 1500;
    for shape in [
        // Chain: rejection sampling against a hotter draft (q ≠ p).
        TreeShape::Chain { n: 3, p_min: 0.0 },
        // Tree: the deterministic-shape rule.
        TreeShape::TopK { widths: vec![4, 2] },
    ] {
        let mut counts = vec![0usize; p.len()];
        for seed in 0..n {
            let mut d = ModelDrafter::new(&target, &lane, 2.0);
            let o = spec_generate(
                &target,
                &lane,
                None,
                &mut d,
                &prompt,
                &SpecConfig {
                    max_tokens: 1,
                    sampling: params(seed),
                    shape: shape.clone(),
                    stop_ids: vec![],
                },
            )
            .unwrap();
            counts[o.tokens[0] as usize] += 1;
        }
        // Chi-square over tokens with expected count ≥ 5, the rest pooled.
        let (mut chi, mut df, mut rest_c, mut rest_e) = (0.0, 0usize, 0.0, 0.0);
        for (c, pi) in counts.iter().zip(&p) {
            let e = n as f64 * *pi as f64;
            if e >= 5.0 {
                chi += (*c as f64 - e).powi(2) / e;
                df += 1;
            } else {
                rest_c += *c as f64;
                rest_e += e;
            }
        }
        if rest_e > 0.0 {
            chi += (rest_c - rest_e).powi(2) / rest_e.max(1e-9);
            df += 1;
        }
        let df = df.saturating_sub(1).max(1) as f64;
        // 99.9% quantile of chi-square ≈ df + 3.09·sqrt(2·df) + 3 (Wilson–Hilferty, generous).
        let limit = df + 3.09 * (2.0 * df).sqrt() + 3.0;
        assert!(
            chi < limit,
            "{shape:?}: chi2 {chi:.1} with {df} dof (limit {limit:.1})"
        );
    }
}

/// The asynchronous pipeline (with and without EDC / TVC, and its synchronous twin) gives the
/// target's greedy output.
#[test]
fn async_pipeline_is_lossless() {
    use llada_decode::speculative::ahasd::{generate as ahasd_generate, AsyncConfig};
    let target = load("hf-llama");
    let other = load("hf-qwen2");
    let verify = Lane::new("verify", 1).unwrap();
    let draft = Lane::new("draft", 1).unwrap();
    for seed in 0..4u32 {
        let prompt: Vec<u32> = (0..4 + seed)
            .map(|i| 3 + (i * 11 + seed * 5) % 90)
            .collect();
        let reference = generate(
            &target,
            &verify,
            &prompt,
            &GenerateConfig {
                max_tokens: 24,
                stop_at_eos: false,
                ..Default::default()
            },
            |_| true,
        )
        .unwrap();
        for (edc, tvc, synchronous) in [
            (false, false, false),
            (true, false, false),
            (true, true, false),
            (true, true, true),
        ] {
            for m in [&target, &other] {
                let mut d = ModelDrafter::new(m, &draft, 0.0);
                let out = ahasd_generate(
                    &target,
                    &verify,
                    &draft,
                    &mut d,
                    &prompt,
                    &AsyncConfig {
                        max_tokens: 24,
                        batch: 3,
                        max_verify: 8,
                        edc,
                        tvc,
                        synchronous,
                        stop_ids: vec![],
                    },
                )
                .unwrap();
                assert_eq!(
                    out.tokens, reference.tokens,
                    "edc {edc} tvc {tvc} sync {synchronous}"
                );
            }
        }
    }
}
