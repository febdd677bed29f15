//! The diffusion decoder against the independent numpy reference of LLaDA's `generate` and
//! Dream's `diffusion_generate` (tests/reference/ref_diffusion.py), on the tiny fixture
//! checkpoints; and the cache strategies against the reference where they must agree.

use llada_decode::diffusion::{
    dream_transfer, generate, generate_with, CacheMode, Confidence, DiffusionConfig, MultiBlock,
    Revision, Schedule, StepView, TokenState,
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
    let mut cfg_cases = 0;
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
                cfg_scale: c["cfg_scale"].as_f64().unwrap_or(0.0) as f32,
                ..DiffusionConfig::one_per_step(gen, c["block_length"].as_u64().unwrap() as usize)
            }
        };
        let out = generate(&model, &lane, &prompt, &cfg).unwrap();
        assert_eq!(out.tokens, ids(&c["output"]), "case {c}");
        // Classifier-free guidance adds one unconditional pass per step.
        let per_step = if cfg.cfg_scale > 0.0 { 2 } else { 1 };
        assert_eq!(out.forward_passes, per_step * steps);
        cfg_cases += usize::from(cfg.cfg_scale > 0.0);
    }
    assert!(
        cfg_cases >= 2,
        "the reference has no classifier-free guidance case"
    );
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
fn refreshed_caches_match_vanilla_with_one_step_per_block() {
    // One step per block: every pass is a block start, where a refreshing cache recomputes the
    // whole prefix — exactly what vanilla recomputes — so the outputs coincide token for token.
    // Without the refresh the prompt's KV stays that of the first, all-masked pass.
    let lane = Lane::new("dense", 2).unwrap();
    let mut stale_differs = 0;
    for name in ["hf-llada", "hf-dream"] {
        let model = load(name);
        let prompt = [5u32, 17, 33, 8, 2, 61];
        let base = DiffusionConfig {
            steps: 4,
            ..DiffusionConfig::one_per_step(32, 8)
        };
        let reference = generate(&model, &lane, &prompt, &base).unwrap();
        for cache in [CacheMode::Prefix, CacheMode::Dual] {
            let run = |refresh_prefix| {
                let cfg = DiffusionConfig {
                    cache,
                    refresh_prefix,
                    ..base.clone()
                };
                generate(&model, &lane, &prompt, &cfg).unwrap()
            };
            let fresh = run(true);
            assert_eq!(fresh.tokens, reference.tokens, "{name} {cache:?}");
            assert_eq!(fresh.forward_passes, 4);
            let stale = run(false);
            assert!(
                stale.rows_computed < fresh.rows_computed,
                "{name} {cache:?}"
            );
            stale_differs += usize::from(stale.tokens != reference.tokens);
        }
    }
    // The fixtures are sensitive enough to show the stale prefix (else this test proves little).
    assert!(stale_differs > 0, "no fixture tells a stale prefix apart");
}

#[test]
fn dual_block_start_rewrites_the_finished_blocks_last_commits() {
    // One step per block: each block commits all its tokens in its only pass, computed while
    // they were masks. The next block start must rewrite those rows with the real tokens, as
    // the prefix cache does when it appends the finished block; the two caches then compute
    // the same rows against the same cached prompt, so they write the same tokens. Keeping the
    // masks' KV there made later blocks see the earlier answer as masked (the regression this
    // guards); several fixtures and lengths, so that a stale row would show.
    let lane = Lane::new("dense", 2).unwrap();
    for name in ["hf-llada", "hf-dream"] {
        let model = load(name);
        for (prompt, gen, block) in [
            (vec![5u32, 17, 33, 8, 2, 61], 32, 8),
            (vec![9u32, 4, 70, 21], 48, 8),
            (vec![3u32, 44, 12, 90, 7, 7, 30], 32, 4),
        ] {
            let cfg = |cache| DiffusionConfig {
                cache,
                steps: gen / block,
                ..DiffusionConfig::one_per_step(gen, block)
            };
            let pre = generate(&model, &lane, &prompt, &cfg(CacheMode::Prefix)).unwrap();
            let dual = generate(&model, &lane, &prompt, &cfg(CacheMode::Dual)).unwrap();
            assert_eq!(dual.tokens, pre.tokens, "{name} {prompt:?} {gen}/{block}");
        }
    }
}

#[test]
fn interval_refresh_every_step_is_vanilla() {
    // `refresh_every: 1` recomputes every row at every step, as vanilla does, so the cached
    // strategies must then produce vanilla's tokens with several steps per block; a longer
    // interval computes fewer rows than that and more than the block-start refresh alone.
    let lane = Lane::new("dense", 2).unwrap();
    for name in ["hf-llada", "hf-dream"] {
        let model = load(name);
        let prompt = [5u32, 17, 33, 8, 2, 61];
        let base = DiffusionConfig::one_per_step(32, 8);
        let reference = generate(&model, &lane, &prompt, &base).unwrap();
        for cache in [CacheMode::Prefix, CacheMode::Dual] {
            let run = |refresh_every| {
                let cfg = DiffusionConfig {
                    cache,
                    refresh_prefix: true,
                    refresh_every,
                    ..base.clone()
                };
                generate(&model, &lane, &prompt, &cfg).unwrap()
            };
            let every = run(1);
            assert_eq!(every.tokens, reference.tokens, "{name} {cache:?}");
            assert_eq!(every.forward_passes, 32);
            assert_eq!(
                every.rows_computed, reference.rows_computed,
                "{name} {cache:?}"
            );
            let (fourth, starts) = (run(4), run(0));
            assert!(
                starts.rows_computed < fourth.rows_computed
                    && fourth.rows_computed < every.rows_computed,
                "{name} {cache:?}: {} {} {}",
                starts.rows_computed,
                fourth.rows_computed,
                every.rows_computed
            );
        }
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

/// The full strategy's bookkeeping: legal state transitions only (Invisible → Visible →
/// Stable, never back), Stable tokens never change, a complete answer; the concurrent sparse
/// lane gives exactly the deterministic (sequential) schedule's tokens; the window planner's
/// padding is counted.
#[test]
fn multi_block_and_revision_invariants() {
    let dense = Lane::new("dense", 1).unwrap();
    let dense2 = Lane::new("dense", 2).unwrap();
    let sparse = Lane::new("sparse", 1).unwrap();
    for name in ["hf-llada", "hf-dream"] {
        let model = load(name);
        let mask = model.config.mask_id.unwrap();
        let prompt = [5u32, 17, 33, 8, 2, 61];
        let full = |concurrent: bool, revise: f32| DiffusionConfig {
            cache: CacheMode::Dual,
            // A low threshold so that steps commit several tokens and speculate ahead.
            threshold: Some(0.05),
            multi_block: Some(MultiBlock {
                window: 16,
                lookahead: 6,
            }),
            revision: Some(Revision {
                revise_threshold: revise,
                stable_threshold: 0.5,
                max_probes: 2,
                stable_on_commit: None,
                max_rows: 8,
                concurrent,
            }),
            ..DiffusionConfig::one_per_step(32, 8)
        };
        let two_lanes = |cfg: &DiffusionConfig| {
            generate_with(&model, &dense, Some(&sparse), &prompt, cfg, None).unwrap()
        };
        let mut seen: Vec<(Vec<u32>, Vec<TokenState>)> = vec![];
        let mut obs = |v: &StepView| seen.push((v.tokens.to_vec(), v.states.to_vec()));
        let conc = generate_with(
            &model,
            &dense,
            Some(&sparse),
            &prompt,
            &full(true, 0.05),
            Some(&mut obs),
        )
        .unwrap();
        let seq = two_lanes(&full(false, 0.05));
        assert_eq!(conc.tokens, seq.tokens, "{name}: schedules disagree");
        assert_eq!(conc.revised, seq.revised);
        // The sparse pass joined onto a two-thread dense lane (no pool of its own: the CLI's
        // default), which also keeps the sparse snapshot row by row across steps.
        let joined =
            generate_with(&model, &dense2, None, &prompt, &full(true, 0.05), None).unwrap();
        assert_eq!(joined.tokens, seq.tokens, "{name}: joined lanes disagree");
        assert_eq!(
            (joined.revised, joined.sparse_rows),
            (seq.revised, seq.sparse_rows)
        );
        assert!(!conc.tokens.contains(&mask), "{name}: answer left masked");
        assert!(
            conc.sparse_passes > 0 && conc.sparse_rows > 0,
            "{name}: no sparse work"
        );

        let rank = |s: TokenState| match s {
            TokenState::Invisible => 0,
            TokenState::Visible => 1,
            TokenState::Stable => 2,
        };
        for w in seen.windows(2) {
            let ((t0, s0), (t1, s1)) = (&w[0], &w[1]);
            for i in 0..t0.len() {
                assert!(rank(s1[i]) >= rank(s0[i]), "{name}: state went back at {i}");
                assert_eq!(s0[i] == TokenState::Invisible, t0[i] == mask);
                if s0[i] == TokenState::Stable {
                    assert_eq!(t0[i], t1[i], "{name}: a stable token changed at {i}");
                }
            }
        }
        // A revision threshold no probability reaches never changes a token.
        let none = two_lanes(&DiffusionConfig {
            revision: Some(Revision {
                revise_threshold: 1.0,
                stable_threshold: 1.0,
                ..Revision::default()
            }),
            ..full(true, 1.0)
        });
        assert_eq!(none.revised, 0);
        // Multi-block alone equals the same run with the revision lane idle: the revision
        // path does not disturb the dense lane's cache.
        let mb = generate(
            &model,
            &dense,
            &prompt,
            &DiffusionConfig {
                revision: None,
                ..full(true, 1.0)
            },
        )
        .unwrap();
        assert!(mb.forward_passes <= 32);
        assert_eq!(mb.sparse_passes, 0);
        // Every commit reaches a stable-on-commit confidence this low: no token is ever probed,
        // so the sparse lane stays idle and the answer is multi-block's.
        let sure = two_lanes(&DiffusionConfig {
            revision: Some(Revision {
                stable_on_commit: Some(f32::MIN_POSITIVE),
                ..Revision::default()
            }),
            ..full(true, 1.0)
        });
        assert_eq!((sure.sparse_passes, sure.sparse_rows), (0, 0), "{name}");
        assert_eq!(sure.tokens, mb.tokens, "{name}");
        // Just above the commit threshold (these random fixtures are rarely sure of anything),
        // the confident commits skip their probes: fewer sparse rows than probing every commit.
        let some = two_lanes(&DiffusionConfig {
            revision: Some(Revision {
                stable_on_commit: Some(0.055),
                ..full(false, 0.05).revision.unwrap()
            }),
            ..full(false, 0.05)
        });
        assert!(
            some.sparse_rows < seq.sparse_rows,
            "{name}: {} rows with stable-on-commit, {} without",
            some.sparse_rows,
            seq.sparse_rows
        );
        // One token per step: windows shorter than a shape are padded, and counted.
        let one = generate(
            &model,
            &dense,
            &prompt,
            &DiffusionConfig {
                revision: None,
                threshold: None,
                ..full(true, 1.0)
            },
        )
        .unwrap();
        assert_eq!(one.forward_passes, 32);
        assert!(one.padded_rows > 0, "{name}: window padding not counted");
        assert!(!one.tokens.contains(&mask));
    }
}

#[test]
fn new_options_are_validated() {
    let model = load("hf-llada");
    let lane = Lane::new("dense", 1).unwrap();
    let base = DiffusionConfig::one_per_step(16, 8);
    for bad in [
        // multi-block / revision need the dual cache
        DiffusionConfig {
            multi_block: Some(MultiBlock {
                window: 16,
                lookahead: 4,
            }),
            ..base.clone()
        },
        DiffusionConfig {
            revision: Some(Revision::default()),
            cache: CacheMode::Prefix,
            ..base.clone()
        },
        // windows are static shapes
        DiffusionConfig {
            cache: CacheMode::Dual,
            multi_block: Some(MultiBlock {
                window: 20,
                lookahead: 4,
            }),
            ..base.clone()
        },
        // CFG is vanilla-only; negative scales are refused
        DiffusionConfig {
            cache: CacheMode::Dual,
            cfg_scale: 1.0,
            ..base.clone()
        },
        DiffusionConfig {
            cfg_scale: -1.0,
            ..base.clone()
        },
        DiffusionConfig {
            refresh_every: 2,
            ..base.clone()
        },
    ] {
        assert!(generate(&model, &lane, &[5, 6], &bad).is_err());
    }
}

/// Dream's `alg_temp`: a near-zero temperature reproduces top-k selection, a real one is
/// seeded (same seed, same answer) and still fills every position; with a threshold it is
/// refused.
#[test]
fn alg_temp_samples_positions_reproducibly() {
    let lane = Lane::new("dense", 2).unwrap();
    let model = load("hf-dream");
    let prompt = [5u32, 17, 33, 8, 2, 61];
    let base = DiffusionConfig::dream(16, 8, Confidence::TopProb);
    let top = generate(&model, &lane, &prompt, &base).unwrap();
    let cold = DiffusionConfig {
        alg_temp: 1e-6,
        ..base.clone()
    };
    assert_eq!(
        generate(&model, &lane, &prompt, &cold).unwrap().tokens,
        top.tokens
    );
    let mut outs = vec![];
    for seed in [1u64, 1, 2, 3, 4, 5] {
        let cfg = DiffusionConfig {
            alg_temp: 5.0,
            seed,
            ..base.clone()
        };
        let out = generate(&model, &lane, &prompt, &cfg).unwrap();
        let mask = model.config.mask_id.unwrap();
        assert!(!out.tokens.contains(&mask), "a position left masked");
        assert_eq!(out.forward_passes, 8);
        outs.push(out.tokens);
    }
    assert_eq!(outs[0], outs[1], "same seed, different answer");
    assert!(
        outs[1..].iter().any(|o| *o != top.tokens),
        "a hot alg_temp never changed the commit order's result"
    );
    let bad = DiffusionConfig {
        alg_temp: 1.0,
        threshold: Some(0.9),
        ..base
    };
    assert!(generate(&model, &lane, &prompt, &bad).is_err());
}
