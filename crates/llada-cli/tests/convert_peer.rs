//! `llada convert` / `llada quantize` against the llama.cpp peer (docs/peer.md, docs/convert.md):
//!
//! * `llama-quantize` loads the GGUF we convert from the zoo's tiny-llada-prose and, for every
//!   mixed type, gives each tensor the type our `quantize` gives it.
//! * `llama-diffusion-cli` runs our converted tiny-llada-prose, greedy, and writes the text our
//!   `generate --mode diffusion` writes from the same file at the same settings.
//! * `llama-completion` runs a SmolLM2-layout LLaMA we convert (SmolLM2-135M-Instruct's weights,
//!   from the cached GGUF, written out as an HF directory with SmolLM2's tokenizer), greedy: the
//!   same prompt token ids and the same text as our `generate`.
//!
//! Each test skips, saying why, when the peer is not built (`scripts/peer/llama_cpp.sh`;
//! `LLADA_PEER_DIR` points elsewhere) or, for SmolLM2, when its GGUF is not in the cache
//! (`llada fetch smollm2`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `$LLADA_CACHE`, else `~/.cache/llada`.
fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("LLADA_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            let home = std::env::var_os("HOME")?;
            Some(PathBuf::from(home).join(".cache/llada"))
        })
}

/// The peer binary `tool` (in `$LLADA_PEER_DIR`, else the cache's llama.cpp build), if built.
fn peer_tool(tool: &str) -> Option<PathBuf> {
    let d = std::env::var_os("LLADA_PEER_DIR")
        .map(PathBuf::from)
        .or_else(|| Some(cache_dir()?.join("peer/llama.cpp-0.3.36/bin")))?;
    let p = d.join(tool);
    p.is_file().then_some(p)
}

/// A test's start: this file's lock (`one_at_a_time`) and the peer tool it runs; `None`, having
/// said why the test skips, when the tool is not built.
fn start(tool: &str) -> Option<(std::sync::MutexGuard<'static, ()>, PathBuf)> {
    let Some(p) = peer_tool(tool) else {
        eprintln!(
            "skipping: the llama.cpp peer is not built (no {tool}; build it with \
             scripts/peer/llama_cpp.sh or set LLADA_PEER_DIR)"
        );
        return None;
    };
    Some((one_at_a_time(), p))
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llada-convert-peer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Run a command that must succeed; its output.
fn run_ok(c: &mut Command) -> std::process::Output {
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{c:?} failed ({}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// One test of this file at a time: the peer's logger (below) loses lines when the cores are
/// busy, and these tests are what keeps them busy.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run a peer tool until its log is complete (`done`), at most 8 times. llama.cpp's logger
/// writes from a worker thread and is never flushed at exit (`common_log_main` leaks it on
/// purpose; llama.cpp issue 22142), so a run can end, rc 0, before its last lines (the answer)
/// are printed. Seen on two busy cores: 2 runs in 8 with 8 at once, more with 12. OpenMP's
/// spinning workers starve the logger thread; `OMP_WAIT_POLICY=passive` makes the loss rarer.
fn run_peer(c: &mut Command, done: impl Fn(&std::process::Output) -> bool) -> std::process::Output {
    c.env("OMP_WAIT_POLICY", "passive");
    for _ in 0..8 {
        let o = run_ok(c);
        if done(&o) {
            return o;
        }
        eprintln!("{c:?}: its log ended early (llama.cpp's logger lost its last lines); again");
    }
    panic!("{c:?}: 8 runs, none printed its whole log");
}

/// `llada generate ... --json`: its JSON line.
fn llada_json(args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let o = run_ok(
        Command::new(env!("CARGO_BIN_EXE_llada"))
            .args(args)
            .arg("--json"),
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

fn llada(args: &[&std::ffi::OsStr]) {
    let o = Command::new(env!("CARGO_BIN_EXE_llada"))
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `llada convert SRC -o OUT --type TY`.
fn convert(src: &Path, out: &Path, ty: &str) {
    llada(&[
        "convert".as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
        "--type".as_ref(),
        ty.as_ref(),
    ]);
}

/// The zoo's tiny-llada-prose converted to f16 in `d`.
fn prose_f16(d: &Path) -> PathBuf {
    let hf = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-llada-prose");
    let out = d.join("prose-f16.gguf");
    convert(&hf, &out, "f16");
    out
}

/// (tensor, type) of every tensor, by name (llama-quantize writes them in its own order).
fn types(p: &Path) -> std::collections::BTreeMap<String, String> {
    let g = llada_formats::gguf::GgufFile::open(p).unwrap();
    g.tensors
        .values()
        .map(|t| (t.name.clone(), t.ty.name().to_string()))
        .collect()
}

#[test]
fn llama_quantize_reads_our_files_and_mixes_types_as_we_do() {
    let Some((_one, quantize)) = start("llama-quantize") else {
        return;
    };
    let d = scratch("quantize");
    let f16 = prose_f16(&d);
    for t in ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0"] {
        let theirs = d.join(format!("peer-{t}.gguf"));
        let o = Command::new(&quantize)
            .args([f16.as_os_str(), theirs.as_os_str(), t.as_ref()])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "llama-quantize {t}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let ours = d.join(format!("ours-{t}.gguf"));
        let lower = t.to_lowercase();
        llada(&[
            "quantize".as_ref(),
            f16.as_os_str(),
            ours.as_os_str(),
            "--type".as_ref(),
            lower.as_ref(),
        ]);
        assert_eq!(types(&ours), types(&theirs), "{t}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// The text `llama-diffusion-cli` prints after its timing line (`LOG_INF("\n%s\n", text)`, with
/// `--no-log-prefix --no-log-timestamps`, on stderr); `None` when the log stops before it.
fn diffusion_cli_text(stderr: &[u8]) -> Option<String> {
    let s = String::from_utf8_lossy(stderr);
    let rest = &s[s.rfind("total time:")?..];
    let rest = &rest[rest.find('\n')? + 1..];
    let text = rest.strip_prefix('\n')?;
    Some(text.strip_suffix('\n').unwrap_or(text).to_string())
}

/// Greedy LLaDA diffusion, llama.cpp's `llama-diffusion-cli` against ours, on tiny-llada-prose
/// converted to f16.
///
/// llama.cpp's greedy is `--top-k 1` (with `--temp 0` its sampler chain still ends in a random
/// draw from the top-k/top-p candidates). Its confidence is then the probability *after* the
/// top-k cut, 1.0 at every position, and its ties go to the lowest position: it commits masked
/// tokens left to right, whatever the block length, where our `top-prob` commits the most
/// confident first. The settings where both are one algorithm are one token per step: our
/// `--block-length 1 --steps N` (left to right by construction) and llama.cpp's one step per
/// token at block length 1 and at block length 8. Its blocks are counted over prompt plus
/// answer (`max_length` = `-ub` = prompt + answer must be a multiple of the block length, and
/// `--diffusion-steps` a multiple of the block count): the prompt here is 8 tokens with BOS, the
/// answer 32, so `-ub 40` and 40 steps.
#[test]
fn llama_diffusion_cli_greedy_equals_ours_on_tiny_llada_prose() {
    let Some((_one, cli)) = start("llama-diffusion-cli") else {
        return;
    };
    let d = scratch("diffusion");
    let gguf = prose_f16(&d);
    let prompt = "And God said unto Moses, saying";
    let gen = 32usize;
    let ours = llada_json(&[
        "generate".as_ref(),
        "--mode".as_ref(),
        "diffusion".as_ref(),
        "-m".as_ref(),
        gguf.as_os_str(),
        "--raw".as_ref(),
        "-t".as_ref(),
        "0".as_ref(),
        "--gen-length".as_ref(),
        gen.to_string().as_ref(),
        "--block-length".as_ref(),
        "1".as_ref(),
        "--steps".as_ref(),
        gen.to_string().as_ref(),
        prompt.as_ref(),
    ]);
    let prompt_ids = ids(&ours["prompt_ids"]);
    assert_eq!(prompt_ids.len(), 8, "prompt ids {prompt_ids:?}");
    assert_eq!(prompt_ids[0], 1, "LLaDA's BOS first");
    let tokens = ids(&ours["tokens"]);
    assert_eq!(tokens.len(), gen);
    // Our text stops at the first EOS; llama.cpp prints every answer token, special ones as
    // nothing. Decode all of ours the same way.
    let g = llada_formats::gguf::GgufFile::open(&gguf).unwrap();
    let ours_text = llada_formats::tokenizer::Tokenizer::from_gguf(&g)
        .unwrap()
        .decode(&tokens);
    assert!(!ours_text.trim().is_empty());
    let max_len = (prompt_ids.len() + gen).to_string();
    for block in ["1", "8"] {
        let mut c = Command::new(&cli);
        c.args([
            "-m".as_ref(),
            gguf.as_os_str(),
            "-p".as_ref(),
            prompt.as_ref(),
            "--diffusion-steps".as_ref(),
            max_len.as_ref(),
            "--diffusion-block-length".as_ref(),
            block.as_ref(),
            "-ub".as_ref(),
            max_len.as_ref(),
            "-b".as_ref(),
            max_len.as_ref(),
            "-c".as_ref(),
            max_len.as_ref(),
            "--top-k".as_ref(),
            "1".as_ref(),
            "--temp".as_ref(),
            "0".as_ref(),
            "-t".as_ref(),
            "2".as_ref(),
            "--no-log-prefix".as_ref(),
            "--no-log-timestamps".as_ref(),
        ]);
        let o = run_peer(&mut c, |o| diffusion_cli_text(&o.stderr).is_some());
        let theirs = diffusion_cli_text(&o.stderr).unwrap();
        eprintln!("llama-diffusion-cli (block {block}): {theirs:?}\nours: {ours_text:?}");
        assert_eq!(theirs, ours_text, "llama-diffusion-cli block {block}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Write `tensors` as one F16 safetensors file.
fn write_f16_safetensors(path: &Path, tensors: &[llada_model::load::ExportedTensor]) {
    use std::io::Write;
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for t in tensors {
        let n = t.data.len() * 2;
        header.insert(
            t.name.clone(),
            serde_json::json!({"dtype": "F16", "shape": t.shape, "data_offsets": [off, off + n]}),
        );
        off += n;
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    for t in tensors {
        let bytes: Vec<u8> = t
            .data
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        f.write_all(&bytes).unwrap();
    }
    f.flush().unwrap();
}

/// An HF `LlamaForCausalLM` directory in SmolLM2-135M's layout (30 layers, d 576, 9 heads with 3
/// KV heads, FFN 1536, tied embeddings, 49 152 tokens) holding SmolLM2-135M-Instruct's weights:
/// the cached Q4_1 GGUF dequantized (q/k rows un-permuted) and stored as f16, with SmolLM2's
/// tokenizer (`models/smollm2-draft/tokenizer.json`, the same 49 152-token BPE).
fn write_smollm2_hf_dir(gguf: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let (c, _) = llada_model::load::export_layers_f32(gguf, &[]).unwrap();
    let layers: Vec<usize> = (0..c.n_layers).collect();
    let (c, tensors) = llada_model::load::export_layers_f32(gguf, &layers).unwrap();
    assert!(c.tied_embeddings && c.vocab == 49152 && c.n_kv_heads < c.n_heads);
    let cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": c.d_model, "intermediate_size": c.ffn, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "vocab_size": c.vocab, "max_position_embeddings": c.max_ctx, "rope_theta": c.rope_theta,
        "rms_norm_eps": c.rms_eps, "tie_word_embeddings": true, "bos_token_id": 1,
        "eos_token_id": 2, "torch_dtype": "float16"
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let draft = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/smollm2-draft");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(draft.join(f), dir.join(f)).unwrap();
    }
    write_f16_safetensors(&dir.join("model.safetensors"), &tensors);
}

/// The prompt token ids `llama-completion --verbose-prompt` lists (`   504 -> 'The'`).
fn verbose_prompt_ids(stderr: &[u8]) -> Vec<u32> {
    let s = String::from_utf8_lossy(stderr);
    s.lines()
        .filter_map(|l| {
            let (id, rest) = l.trim_start().split_once(" -> '")?;
            (!rest.is_empty()).then_some(())?;
            id.trim().parse().ok()
        })
        .collect()
}

/// Greedy autoregressive decoding, llama.cpp's `llama-completion` against ours, on a
/// SmolLM2-layout LLaMA HF directory converted to f16: the same prompt token ids, the same text
/// of up to 48 tokens, and the same stop (an end-of-generation token or `-n`). No
/// `--ignore-eos`: llama.cpp's bans end-of-generation tokens (a −∞ logit bias) where ours
/// generates past them, so the two differ by design at the first `<|im_end|>`.
#[test]
fn llama_completion_greedy_equals_ours_on_smollm2_layout() {
    let Some((_one, cli)) = start("llama-completion") else {
        return;
    };
    let Some(src) = cache_dir()
        .map(|c| c.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
        .filter(|p| p.is_file())
    else {
        eprintln!(
            "skipping: SmolLM2-135M-Instruct.Q4_1.gguf is not in the cache (`llada fetch \
             smollm2` puts it there); the SmolLM2-layout HF directory is written from it"
        );
        return;
    };
    let d = scratch("smollm2");
    let hf = d.join("hf");
    write_smollm2_hf_dir(&src, &hf);
    let gguf = d.join("smollm2-f16.gguf");
    convert(&hf, &gguf, "f16");
    std::fs::remove_dir_all(&hf).unwrap();
    let n = "48";
    for prompt in ["The capital of France is", "def fibonacci(n):"] {
        let ours = llada_json(&[
            "generate".as_ref(),
            "-m".as_ref(),
            gguf.as_os_str(),
            "--raw".as_ref(),
            "-t".as_ref(),
            "0".as_ref(),
            "-n".as_ref(),
            n.as_ref(),
            prompt.as_ref(),
        ]);
        let ours_text = ours["text"].as_str().unwrap();
        let mut c = Command::new(&cli);
        c.args([
            "-m".as_ref(),
            gguf.as_os_str(),
            "-p".as_ref(),
            prompt.as_ref(),
            "-n".as_ref(),
            n.as_ref(),
            "--temp".as_ref(),
            "0".as_ref(),
            "--top-k".as_ref(),
            "1".as_ref(),
            "-no-cnv".as_ref(),
            "--no-warmup".as_ref(),
            "-c".as_ref(),
            "128".as_ref(),
            "-t".as_ref(),
            "2".as_ref(),
            "--verbose-prompt".as_ref(),
            "--no-display-prompt".as_ref(),
            "--no-log-prefix".as_ref(),
            "--no-log-timestamps".as_ref(),
        ]);
        // common_perf_print's last line comes after the answer and its closing "\n\n".
        let o = run_peer(&mut c, |o| {
            String::from_utf8_lossy(&o.stderr).contains("common_perf_print:    graphs reused")
        });
        let stdout = String::from_utf8_lossy(&o.stdout);
        eprintln!(
            "llama-completion: {stdout:?}\nours: {ours_text:?} ({})",
            ours["stop_reason"]
        );
        assert_eq!(
            verbose_prompt_ids(&o.stderr),
            ids(&ours["prompt_ids"]),
            "prompt ids of {prompt:?}"
        );
        // llama-completion prints the answer, " [end of text]\n" when it stopped at an
        // end-of-generation token, then "\n\n".
        let theirs = stdout
            .strip_suffix("\n\n")
            .expect("llama-completion's closing lines");
        let (theirs, theirs_eos) = match theirs.strip_suffix(" [end of text]\n") {
            Some(t) => (t, true),
            None => (theirs, false),
        };
        assert_eq!(theirs, ours_text, "greedy text of {prompt:?}");
        assert_eq!(
            theirs_eos,
            ours["stop_reason"] == "eos",
            "both stop at an end-of-generation token, or both at -n, for {prompt:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}
