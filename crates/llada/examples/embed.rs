//! Embedding llada in a program: one engine per model, sessions that generate in every mode.
//!
//! `cargo run --release -p llada --example embed` (fetches SmolLM2-135M-Instruct on first use;
//! the diffusion model ships with the repository).

use llada::{
    Diffusion, Engine, EngineOptions, Event, GenerateOptions, Mode, Prompt, Speculative, Strategy,
    StrategyOptions, TreeShape,
};
use std::io::Write;

fn main() -> llada::Result<()> {
    // Autoregressive, streamed piece by piece.
    let engine = Engine::load("smollm2", &EngineOptions::default())?;
    let mut session = engine.session();
    let opts = GenerateOptions {
        max_tokens: 24,
        ..Default::default() // greedy
    };
    print!("ar:          ");
    let ar = session.generate_streaming(
        &Prompt::Raw("The capital of France is"),
        &Mode::Ar,
        &opts,
        |e| {
            if let Event::Text(t) = e {
                print!("{t}");
                let _ = std::io::stdout().flush();
            }
            true
        },
    )?;
    println!();

    // Speculative: prompt lookup merged into the shipped draft's token trees; greedy, so the
    // tokens equal the autoregressive run's.
    let draft = engine.load_draft("ngram+smollm2-draft", Some(llada::draft::DRAFT_QUANT_TYPE))?;
    let spec = session.generate(
        &Prompt::Raw("The capital of France is"),
        &Mode::Speculative(Speculative {
            draft: &draft,
            shape: TreeShape::default(), // Lever's cost-aware tree
            early_exit: None,
            ahasd: None,
        }),
        &opts,
    )?;
    println!("speculative: {}", spec.text);
    assert_eq!(spec.tokens, ar.tokens, "speculative decoding is lossless");

    // A conversation: the second turn prefills only its new tokens.
    let chat_opts = GenerateOptions {
        max_tokens: 16,
        ..Default::default()
    };
    session.chat("Name a sea.", &Mode::Ar, &chat_opts, |_| true)?;
    let second = session.chat("And another one?", &Mode::Ar, &chat_opts, |_| true)?;
    println!(
        "chat:        {} ({} of {} prompt tokens reused from the first turn)",
        second.text.trim(),
        second.cached_prompt_tokens,
        second.prompt_ids.len()
    );

    // Diffusion: a shipped task model, the full strategy (multi-block windows + revision).
    let dllm = Engine::load("tiny-dream-tasks", &EngineOptions::default())?;
    let out = dllm.session().generate(
        &Prompt::Raw("sort:3 1 4 1 5 9 2 6="),
        &Mode::Diffusion(Diffusion {
            options: StrategyOptions {
                strategy: Strategy::Full,
                gen_length: 32,
                ..Default::default()
            },
            sparse_pool: false,
        }),
        &GenerateOptions::default(),
    )?;
    println!("diffusion:   {}", out.text);
    Ok(())
}
