//! `llada bench MODEL`: prefill (of `--prompt-tokens` and of 512 tokens) and decode speed, the
//! memory-bandwidth floor measured in the same run, and quantized matmul throughput (ours vs
//! candle's) for the model's quant types (measured by [`llada_zoo::bench::ar`]). With `--peer`,
//! llama.cpp's llama-bench runs on the same GGUF file and thread count in each round, between
//! ours ([`llada_zoo::bench::peer`], docs/peer.md).

use super::BenchArgs;
use crate::progress::Bar;
use crate::LoadContext;
use anyhow::{bail, Result};
use llada_model::{LoadOptions, Model};
use llada_runtime::{Lane, Tracer};
use llada_zoo::bench::ar::{
    bench_matmul, decode_speed, matmul_types, measure_bandwidth, median, prefill_speed,
    synthetic_prompt, warm_up,
};
use llada_zoo::bench::peer;
use llada_zoo::Progress;

/// Largest matmul rows and size `llada bench` measures (a 16384² f32 weight is 1 GB, built
/// once per quantized type).
const MAX_MATMUL: usize = 16384;

/// The long prompt's length: prefill of 512 tokens (measured when the model's context holds it).
const LONG_PROMPT: usize = 512;

/// Rounds `--peer` needs at least (each round runs ours and the peer's once).
const MIN_PEER_ROUNDS: usize = 3;

/// Cores other processes may keep busy during a `--peer` comparison before it warns.
const BUSY_CORES: f64 = 0.1;

pub fn run(a: BenchArgs) -> Result<()> {
    if a.reps == 0 || a.prompt_tokens == 0 {
        bail!("--reps and --prompt-tokens must be at least 1");
    }
    if a.gen_tokens < 2 {
        bail!("--gen-tokens must be at least 2 (the first token comes from the prefill)");
    }
    if !a.no_matmul {
        if let Some(m) = a.matmul_m.iter().find(|m| !(1..=MAX_MATMUL).contains(*m)) {
            bail!("--matmul-m {m}: rows must be between 1 and {MAX_MATMUL}");
        }
        // Its multiple is checked against the model's block sizes once the model is loaded.
        if !(32..=MAX_MATMUL).contains(&a.matmul_size) {
            bail!(
                "--matmul-size {}: between 32 and {MAX_MATMUL}",
                a.matmul_size
            );
        }
    }
    if let Some(t) = &a.trace {
        crate::check_output_file(t, "--trace")?;
    }
    if a.peer && a.reps < MIN_PEER_ROUNDS {
        bail!(
            "--peer --reps {}: the comparison takes the median of at least {MIN_PEER_ROUNDS} interleaved rounds",
            a.reps
        );
    }
    // The peer is found before the model loads: its absence is the first thing to say.
    let peer_dir = if a.peer {
        Some(peer::find_bin_dir(a.peer_dir.as_deref())?)
    } else {
        None
    };
    let threads = crate::threads(a.threads)?;
    let path = crate::models::resolve(&a.model, a.json)?;
    if peer_dir.is_some() && !path.is_file() {
        bail!(
            "--peer: llama.cpp runs GGUF files; {} is not one",
            path.display()
        );
    }
    // A line at once, whatever stderr is (the bar below draws only on a terminal).
    eprintln!(
        "benchmarking {}: memory bandwidth, {}prefill of {} and (if the context holds it) {LONG_PROMPT} tokens and decode of {} tokens, {} runs each{}",
        path.display(),
        if a.no_matmul { "" } else { "the matmul table, " },
        a.prompt_tokens,
        a.gen_tokens,
        a.reps,
        match &peer_dir {
            Some(d) => format!(", interleaved with llama.cpp's llama-bench ({})", d.display()),
            None => String::new(),
        }
    );
    let model = Model::load(&path, &LoadOptions::default()).load_context(&path)?;
    // Prefill and one-token decode are left-to-right measures: a diffusion model decodes in
    // steps over a whole block, which `bench diffusion` times.
    crate::left_to_right(
        &model,
        &path.display().to_string(),
        "`llada bench diffusion` measures its decoding; `llada bench` times left-to-right prefill and decode",
    )?;
    // The prefill run generates one token after the prompt; the decode run continues the
    // prompt's first 8 tokens.
    let need = (a.prompt_tokens + 1).max(8.min(a.prompt_tokens) + a.gen_tokens);
    if need > model.config.max_ctx {
        bail!(
            "--prompt-tokens {} / --gen-tokens {} need {need} positions; the model's context is {}",
            a.prompt_tokens,
            a.gen_tokens,
            model.config.max_ctx
        );
    }
    // The quantized types the matmul table measures (the model's), and the size fits their blocks.
    let types = matmul_types(&model);
    if !a.no_matmul {
        if let Some(t) = types
            .iter()
            .find(|t| !a.matmul_size.is_multiple_of(t.block_elems()))
        {
            bail!(
                "--matmul-size {}: a multiple of {} for this model's {} weights",
                a.matmul_size,
                t.block_elems(),
                t.name()
            );
        }
    }
    // Prefill of the long prompt generates one token after it.
    let long = LONG_PROMPT < model.config.max_ctx;
    let lane = Lane::new("dense", threads)?;
    let reps = a.reps;
    // Per round: prefill, long prefill, decode (ours and, with --peer, the peer's).
    let per_round = (2 + usize::from(long)) * if peer_dir.is_some() { 2 } else { 1 };
    let steps = 2 + per_round * reps + if a.no_matmul { 0 } else { 1 };
    let pb = Bar::styled(steps as u64, "{bar:30} {pos}/{len} {msg}");

    pb.status("memory bandwidth");
    let bw = measure_bandwidth(&lane);
    pb.inc(1);

    let prompt = synthetic_prompt(&model, a.prompt_tokens);
    let long_prompt = synthetic_prompt(&model, LONG_PROMPT);
    let decode_prompt = &prompt[..8.min(prompt.len())];
    pb.status("warm-up");
    warm_up(&model, &lane, &prompt)?;
    if long {
        warm_up(&model, &lane, &long_prompt)?;
    }
    pb.inc(1);
    // Rounds: ours then the peer's, each once per round, so that the machine's drift within
    // minutes reaches both alike.
    let (mut prefill, mut prefill_long, mut decode) = (vec![], vec![], vec![]);
    let (mut peer_prefill, mut peer_prefill_long, mut peer_decode) = (vec![], vec![], vec![]);
    let mut peer_run = None;
    let cpu_start = peer_dir.as_ref().and(peer::CpuSample::now());
    for _ in 0..reps {
        pb.status("prefill");
        prefill.push(prefill_speed(&model, &lane, &prompt)?);
        pb.inc(1);
        if long {
            pb.status("prefill 512");
            prefill_long.push(prefill_speed(&model, &lane, &long_prompt)?);
            pb.inc(1);
        }
        pb.status("decode");
        Tracer::global().enable(a.trace.is_some());
        let d = decode_speed(&model, &lane, decode_prompt, a.gen_tokens);
        Tracer::global().enable(false);
        decode.push(d?);
        pb.inc(1);
        if let Some(dir) = &peer_dir {
            pb.status("llama.cpp prefill");
            let r = peer::run_llama_bench(dir, &path, threads, a.prompt_tokens, 0)?;
            peer_prefill.push(r.tok_s);
            peer_run = Some(r);
            pb.inc(1);
            if long {
                pb.status("llama.cpp prefill 512");
                peer_prefill_long.push(peer::llama_bench(dir, &path, threads, LONG_PROMPT, 0)?);
                pb.inc(1);
            }
            pb.status("llama.cpp decode");
            peer_decode.push(peer::llama_bench(dir, &path, threads, 0, a.gen_tokens)?);
            pb.inc(1);
        }
    }
    // How busy other processes kept the cores during the rounds (with --peer).
    let others = cpu_start.and_then(|c| c.others_since());
    if let Some(o) = others.filter(|o| *o > BUSY_CORES) {
        eprintln!(
            "warning: other processes kept {o:.2} cores busy during the comparison; llama.cpp's \
             threads wait for each other and slow down far more than ours when a core is taken: \
             compare on a quiet machine"
        );
    }
    if let Some(p) = &a.trace {
        let recs = Tracer::global().drain();
        let header = serde_json::json!({"llada_trace": 1, "model": path.display().to_string(), "bench": "decode"});
        llada_formats::atomic::write_with(p, |w| Tracer::write_jsonl(w, &header, &recs))?;
    }
    let mut matmul = vec![];
    if !a.no_matmul {
        pb.status("matmul");
        for &t in &types {
            matmul.extend(bench_matmul(&lane, t, &a.matmul_m, a.matmul_size)?);
        }
        pb.inc(1);
    }
    pb.finish();

    let bpt = model.bytes_per_token();
    let floor = bw * 1e9 / bpt as f64;
    let (prefill_runs, prefill_long_runs, decode_runs) =
        (prefill.clone(), prefill_long.clone(), decode.clone());
    let prefill_tok_s = median(prefill);
    let prefill512_tok_s = (!prefill_long.is_empty()).then(|| median(prefill_long));
    let decode_tok_s = median(decode);
    let peer = peer_dir.as_ref().map(|dir| PeerFigures {
        dir: dir.clone(),
        build: peer::build_info(dir),
        run: peer_run.clone(),
        prefill_tok_s: median(peer_prefill.clone()),
        prefill512_tok_s: (!peer_prefill_long.is_empty())
            .then(|| median(peer_prefill_long.clone())),
        decode_tok_s: median(peer_decode.clone()),
    });
    // Ours over the peer's: above 1 we are faster.
    let ratio = |ours: Option<f64>, theirs: Option<f64>| match (ours, theirs) {
        (Some(o), Some(t)) => Some(o / t),
        _ => None,
    };
    let decode_vs = peer.as_ref().map(|p| decode_tok_s / p.decode_tok_s);
    let prefill_vs = peer.as_ref().map(|p| prefill_tok_s / p.prefill_tok_s);
    let prefill512_vs = ratio(
        prefill512_tok_s,
        peer.as_ref().and_then(|p| p.prefill512_tok_s),
    );
    if a.json {
        let mut j = serde_json::json!({
            "model": path.display().to_string(),
            "threads": threads,
            "kernel_isa": llada_kernels::qmatmul::isa().name(),
            "kernel_isa_reason": llada_kernels::isa_reason(),
            "prefill_tokens": prompt.len(),
            "prefill_tok_s": prefill_tok_s,
            "prefill512_tok_s": prefill512_tok_s,
            "decode_tokens": a.gen_tokens,
            "decode_tok_s": decode_tok_s,
            "measured_bw_gbs": bw,
            "bytes_per_token": bpt,
            "bw_floor_tok_s": floor,
            "decode_fraction_of_floor": decode_tok_s / floor,
            "matmul": matmul,
        });
        if let Some(p) = &peer {
            let run = p.run.as_ref();
            j["peer"] = serde_json::json!({
                "name": "llama.cpp",
                "source": format!("llama.cpp vendored in llama-cpp-python {}", peer::LLAMA_CPP_PYTHON_VERSION),
                "bin_dir": p.dir.display().to_string(),
                "build_commit": run.map(|r| r.build_commit.as_str()),
                "build_number": run.map(|r| r.build_number),
                "cpu_info": run.map(|r| r.cpu_info.as_str()),
                "model_type": run.map(|r| r.model_type.as_str()),
                "build": p.build,
                "rounds": reps,
                "prefill_tok_s": p.prefill_tok_s,
                "prefill512_tok_s": p.prefill512_tok_s,
                "decode_tok_s": p.decode_tok_s,
                "prefill_runs": peer_prefill,
                "prefill512_runs": peer_prefill_long,
                "decode_runs": peer_decode,
            });
            // Our per-round figures beside the peer's (the rounds pair them up).
            j["prefill_runs"] = serde_json::json!(prefill_runs);
            j["prefill512_runs"] = serde_json::json!(prefill_long_runs);
            j["decode_runs"] = serde_json::json!(decode_runs);
            j["others_busy_cores"] = serde_json::json!(others);
            j["decode_vs_peer"] = serde_json::json!(decode_vs);
            j["prefill_vs_peer"] = serde_json::json!(prefill_vs);
            j["prefill512_vs_peer"] = serde_json::json!(prefill512_vs);
        }
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(());
    }
    println!("model            {}", path.display());
    println!("threads          {threads}");
    println!("kernels          {}", llada_kernels::isa_reason());
    println!("memory bandwidth {bw:.1} GB/s (measured now)");
    println!("weights/token    {:.1} MiB", bpt as f64 / (1 << 20) as f64);
    println!(
        "prefill          {prefill_tok_s:.1} tok/s ({} tokens, median of {reps})",
        prompt.len()
    );
    match prefill512_tok_s {
        Some(t) => {
            println!("prefill 512      {t:.1} tok/s ({LONG_PROMPT} tokens, median of {reps})")
        }
        None => println!(
            "prefill 512      - (the model's context, {}, does not hold {LONG_PROMPT} tokens)",
            model.config.max_ctx
        ),
    }
    println!(
        "decode           {decode_tok_s:.1} tok/s ({} tokens, median of {reps})",
        a.gen_tokens
    );
    println!(
        "bandwidth floor  {floor:.1} tok/s -> decode at {:.0}% of it",
        100.0 * decode_tok_s / floor
    );
    if let Some(p) = &peer {
        println!();
        let commit = p
            .run
            .as_ref()
            .map(|r| r.build_commit.as_str())
            .filter(|c| !c.is_empty() && *c != "unknown")
            .map_or(String::new(), |c| format!(" {c}"));
        println!(
            "peer             llama.cpp{commit} (llama-bench -t {threads} -r 1), {reps} rounds interleaved with ours"
        );
        if let Some(o) = others {
            println!("other load       {o:.2} cores busy besides this run (/proc/stat)");
        }
        println!("| measure | ours tok/s | llama.cpp tok/s | ours / llama.cpp |");
        println!("|---|---|---|---|");
        let row = |name: String, ours: Option<f64>, theirs: Option<f64>| {
            let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
            let r = ratio(ours, theirs).map_or("-".to_string(), |r| format!("{r:.2}x"));
            println!("| {name} | {} | {} | {r} |", f(ours), f(theirs));
        };
        row(
            format!("prefill {}", prompt.len()),
            Some(prefill_tok_s),
            Some(p.prefill_tok_s),
        );
        row(
            format!("prefill {LONG_PROMPT}"),
            prefill512_tok_s,
            p.prefill512_tok_s,
        );
        row(
            format!("decode {}", a.gen_tokens),
            Some(decode_tok_s),
            Some(p.decode_tok_s),
        );
    }
    if !matmul.is_empty() {
        println!();
        println!(
            "| type | M | N×K | ours ms | ours GFLOP/s | candle ms | candle GFLOP/s | ratio |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for r in &matmul {
            println!(
                "| {} | {} | {}×{} | {:.2} | {:.1} | {:.2} | {:.1} | {:.2}x |",
                r.dtype,
                r.m,
                r.n,
                r.k,
                r.ours_ms,
                r.ours_gflops,
                r.candle_ms,
                r.candle_gflops,
                r.candle_ms / r.ours_ms
            );
        }
    }
    Ok(())
}

/// The peer's medians over the rounds, and what ran them.
struct PeerFigures {
    dir: std::path::PathBuf,
    /// The build script's record (version, CPU, cmake flags).
    build: Option<String>,
    /// The last prefill run's details (build, CPU, model type as llama-bench reports them).
    run: Option<peer::BenchResult>,
    prefill_tok_s: f64,
    prefill512_tok_s: Option<f64>,
    decode_tok_s: f64,
}
