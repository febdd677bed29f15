//! `llada chat`: an interactive conversation through one library session, whose KV cache
//! carries over between turns (each turn prefills only its new tokens; the timing line shows
//! how many prompt tokens came from the cache).

use crate::cmd::generate::{engine_options, gen_options, sampling_note, ModelArgs, SamplingArgs};
use crate::util::{check_output_file, out_line, warn_unknown, write_trace, StdoutStream};
use anyhow::{bail, Context, Result};
use clap::Args;
use llada::{Engine, Event, Mode, Stats};
use llada_runtime::Tracer;
use std::io::Write;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// System prompt.
    #[arg(long)]
    system: Option<String>,
}

pub fn run(a: ChatArgs) -> Result<()> {
    let opts = gen_options(&a.sampling, false)?;
    if let Some(t) = &a.model.trace {
        check_output_file(t, "--trace")?;
    }
    let engine = Engine::load(&a.model.model, &engine_options(&a.model, false)?)?;
    if engine.is_diffusion() {
        bail!(
            "{} is a diffusion model: run it with `llada generate --mode diffusion`",
            engine.path().display()
        );
    }
    if a.model.trace.is_some() {
        Tracer::global().enable(true);
    }
    engine.tokenizer()?; // a model without one is refused before the first turn
    let mut session = engine.session();
    session.set_system(a.system.as_deref());
    eprintln!(
        "chatting with {} — /reset clears the conversation, /exit quits",
        engine.path().display()
    );
    let mut stdin = std::io::stdin().lock();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let mut bytes = vec![];
        if std::io::BufRead::read_until(&mut stdin, b'\n', &mut bytes).context("reading stdin")?
            == 0
        {
            break;
        }
        let Ok(line) = String::from_utf8(bytes) else {
            eprintln!("(that line is not valid UTF-8: nothing sent; type it again)");
            continue;
        };
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                session.reset();
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        // A turn the session refuses before any text (characters the vocabulary cannot
        // represent, named in the error) leaves stdout untouched.
        let mut stdout = StdoutStream::new();
        let mut started = false;
        let out = session.chat(line, &Mode::Ar, &opts, |e| match e {
            Event::Text(t) => {
                started = true;
                stdout.write(t)
            }
            Event::Unknown(chars) => {
                warn_unknown(chars);
                true
            }
            Event::Step(_) => true,
        });
        stdout.finish()?;
        if out.is_ok() || started {
            out_line("")?;
        }
        match out {
            Ok(g) => {
                if let Stats::Ar(o) = &g.stats {
                    eprintln!(
                        "[{} prompt tokens, {} from the cache; {} generated at {:.1} tok/s; {}]",
                        o.prompt_tokens,
                        o.cached_prompt_tokens,
                        o.generated_tokens,
                        o.generated_tokens as f64 / o.decode_s.max(1e-9),
                        sampling_note(&opts.sampling)
                    );
                }
            }
            Err(e) => eprintln!("error: {e}"),
        }
    }
    write_trace(&a.model, engine.model(), None)
}
