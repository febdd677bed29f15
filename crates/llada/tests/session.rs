//! The session API on the reference fixtures: a prompt that extends the last one reuses the
//! KV cache and gives the tokens a fresh session gives; every mode runs through one call;
//! speculative decoding equals autoregressive decoding; bad requests are errors.

use llada::{
    Diffusion, Engine, GenerateOptions, Mode, Prompt, SamplingParams, Speculative, Stats, Strategy,
    StrategyOptions, TreeShape,
};
use llada_model::{LoadOptions, Model};
use std::path::PathBuf;

fn fixture(name: &str) -> Engine {
    let dir = std::env::var_os("LLADA_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"));
    let p = dir.join(name);
    let m = Model::load(&p, &LoadOptions::default()).unwrap();
    Engine::from_model(m, p, 1).unwrap()
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens: n,
        stop_at_eos: false,
        ..Default::default()
    }
}

/// Ids of a raw prompt, as the session encodes it.
fn ids(e: &Engine, text: &str) -> Vec<u32> {
    e.encode(&Prompt::Raw(text)).unwrap().0
}

#[test]
fn an_extended_prompt_reuses_the_cache_and_matches_a_fresh_session() {
    let e = fixture("hf-llama");
    let first = "abc def";
    let second = "abc def ghi jk";
    assert!(ids(&e, second).starts_with(&ids(&e, first)));
    let mut s = e.session();
    let a = s
        .generate(&Prompt::Raw(first), &Mode::Ar, &greedy(6))
        .unwrap();
    assert_eq!(a.cached_prompt_tokens, 0);
    assert!(s.cached_tokens() >= a.prompt_ids.len());
    let b = s
        .generate(&Prompt::Raw(second), &Mode::Ar, &greedy(6))
        .unwrap();
    assert_eq!(
        b.cached_prompt_tokens,
        ids(&e, first).len(),
        "the first prompt's rows reused"
    );
    let fresh = e
        .session()
        .generate(&Prompt::Raw(second), &Mode::Ar, &greedy(6))
        .unwrap();
    assert_eq!(b.tokens, fresh.tokens, "reuse changed the output");
    // Sampling with a penalty: the same seed gives the same tokens, reused or not.
    let sampled = GenerateOptions {
        sampling: SamplingParams {
            temperature: 0.9,
            top_k: 20,
            repeat_penalty: 1.3,
            repeat_last_n: 8,
            seed: 11,
            ..Default::default()
        },
        ..greedy(8)
    };
    let c = s
        .generate(&Prompt::Raw(second), &Mode::Ar, &sampled)
        .unwrap();
    assert!(c.cached_prompt_tokens > 0);
    let d = e
        .session()
        .generate(&Prompt::Raw(second), &Mode::Ar, &sampled)
        .unwrap();
    assert_eq!(c.tokens, d.tokens);
}

#[test]
fn speculative_mode_equals_ar_mode() {
    let e = fixture("hf-llama");
    let draft = e.load_draft("ngram", None).unwrap();
    let prompt = Prompt::Raw("ab ab ab ab");
    let ar = e
        .session()
        .generate(&prompt, &Mode::Ar, &greedy(12))
        .unwrap();
    for shape in [
        TreeShape::Chain { n: 4, p_min: 0.0 },
        TreeShape::TopK { widths: vec![2, 2] },
    ] {
        let mode = Mode::Speculative(Speculative {
            draft: &draft,
            shape,
            early_exit: None,
            ahasd: None,
        });
        let sp = e.session().generate(&prompt, &mode, &greedy(12)).unwrap();
        assert_eq!(sp.tokens, ar.tokens);
        assert_eq!(sp.text, ar.text);
        assert!(matches!(sp.stats, Stats::Speculative(_)));
    }
}

#[test]
fn modes_are_checked_against_the_model() {
    let ar_model = fixture("hf-llama");
    let dllm = fixture("hf-llada");
    let diffusion = Mode::Diffusion(Diffusion {
        options: StrategyOptions {
            strategy: Strategy::Dual,
            gen_length: 8,
            block_length: 8,
            ..Default::default()
        },
        sparse_pool: false,
    });
    let p = Prompt::Raw("ab");
    let out = dllm.session().generate(&p, &diffusion, &greedy(8)).unwrap();
    match out.stats {
        Stats::Diffusion(d) => assert_eq!(d.tokens.len(), 8),
        _ => panic!("not a diffusion run"),
    }
    let err = |r: llada::Result<llada::Generation>| r.expect_err("an error").to_string();
    assert!(err(dllm.session().generate(&p, &Mode::Ar, &greedy(4))).contains("diffusion model"));
    assert!(
        err(ar_model.session().generate(&p, &diffusion, &greedy(4))).contains("not a diffusion")
    );
    let bad = GenerateOptions {
        sampling: SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        ..greedy(4)
    };
    assert!(err(ar_model.session().generate(&p, &Mode::Ar, &bad)).contains("top-p"));
}
