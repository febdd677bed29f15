//! Replay a trace on a profile and print the Markdown report:
//! `cargo run --release -p llada-sim --example replay -- PROFILE TRACE.jsonl [MODEL_SHAPE]`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [profile, trace, rest @ ..] = args.as_slice() else {
        return Err("usage: replay PROFILE TRACE.jsonl [MODEL_SHAPE]".into());
    };
    let trace = llada_sim::Trace::load(trace.as_ref())?;
    let profile = llada_sim::Profile::load(profile)?;
    let opts = llada_sim::Options {
        model_shape: rest.first().cloned(),
        ..Default::default()
    };
    println!(
        "{}",
        llada_sim::simulate(&trace, &profile, &opts)?.markdown()
    );
    Ok(())
}
