//! The llama.cpp peer (docs/peer.md): find its binaries, run `llama-bench` on a GGUF file and
//! read its speed, so that benchmarks can measure llama.cpp beside us on the same file, thread
//! count and machine.
//!
//! The binaries are built once by `scripts/peer/llama_cpp.sh` into
//! `<cache>/peer/llama.cpp-<version>/bin` ([`default_dir`]); `--peer-dir DIR` or
//! `LLADA_PEER_DIR` point elsewhere ([`find_bin_dir`]).
//!
//! `llama-bench -p N -n 0` times one pass over an N-token prompt (prefill, or the cost of an
//! N-row batch: [`batch_pass`]); `-p 0 -n N` times N single-token decode steps
//! ([`llama_bench`]).

use crate::error::{Error, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The llama-cpp-python release whose vendored llama.cpp the build script compiles.
pub const LLAMA_CPP_PYTHON_VERSION: &str = "0.3.36";
/// The script that builds the peer (relative to the repository root).
pub const BUILD_SCRIPT: &str = "scripts/peer/llama_cpp.sh";
/// The environment variable naming the peer's binary directory.
pub const DIR_ENV: &str = "LLADA_PEER_DIR";
/// The file the build script writes beside the binaries: version, CPU, cmake flags.
pub const BUILD_FLAGS_FILE: &str = "build-flags.txt";

/// Where the build script puts the binaries: `<cache>/peer/llama.cpp-<version>/bin`, with the
/// cache directory the `llada` binary uses (`$LLADA_CACHE`, else `$XDG_CACHE_HOME/llada`,
/// else `~/.cache/llada`).
pub fn default_dir() -> PathBuf {
    llada::models::cache_dir()
        .join("peer")
        .join(format!("llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"))
        .join("bin")
}

/// The peer's binary directory: `explicit` (`--peer-dir`), else `$LLADA_PEER_DIR`, else
/// [`default_dir`]; an error naming the build script when it holds no `llama-bench`.
pub fn find_bin_dir(explicit: Option<&Path>) -> Result<PathBuf> {
    let (dir, from) = match explicit {
        Some(d) => (d.to_path_buf(), "--peer-dir"),
        None => match std::env::var_os(DIR_ENV) {
            Some(d) if !d.is_empty() => (PathBuf::from(d), DIR_ENV),
            _ => (default_dir(), "the default location"),
        },
    };
    let bench = dir.join("llama-bench");
    if !bench.is_file() {
        return Err(Error::Invalid(format!(
            "the llama.cpp peer is not built: no llama-bench in {} ({from}); build it once with \
             {BUILD_SCRIPT} (about 20 minutes on two cores), or point --peer-dir / {DIR_ENV} at \
             a directory holding llama-bench",
            dir.display()
        )));
    }
    Ok(dir)
}

/// The build script's record beside the binaries (version, CPU, cmake flags), if present.
pub fn build_info(bin_dir: &Path) -> Option<String> {
    std::fs::read_to_string(bin_dir.join(BUILD_FLAGS_FILE))
        .ok()
        .map(|s| s.trim().to_string())
}

/// One `llama-bench` test's result, from its JSON output.
#[derive(serde::Serialize, Clone, Debug, PartialEq)]
pub struct BenchResult {
    /// Tokens per second, averaged over its repetitions (`avg_ts`).
    pub tok_s: f64,
    pub n_prompt: u64,
    pub n_gen: u64,
    pub n_threads: u64,
    pub build_commit: String,
    pub build_number: u64,
    pub cpu_info: String,
    pub model_type: String,
}

/// The result of the test with `n_prompt` prompt and `n_gen` generated tokens in `llama-bench
/// -o json` output (an array of test objects).
pub fn parse_llama_bench_json(text: &str, n_prompt: usize, n_gen: usize) -> Result<BenchResult> {
    let bad = |why: &str| {
        let head: String = text.chars().take(400).collect();
        Error::Invalid(format!(
            "llama-bench's JSON output {why} (pp{n_prompt} tg{n_gen}); it began: {head}"
        ))
    };
    let v: Value =
        serde_json::from_str(text.trim()).map_err(|e| bad(&format!("is not JSON: {e}")))?;
    let tests = v.as_array().ok_or_else(|| bad("is not an array"))?;
    let num = |t: &Value, k: &str| t.get(k).and_then(Value::as_u64);
    let test = tests
        .iter()
        .find(|t| {
            num(t, "n_prompt") == Some(n_prompt as u64) && num(t, "n_gen") == Some(n_gen as u64)
        })
        .ok_or_else(|| bad("holds no test with these n_prompt and n_gen"))?;
    let tok_s = test
        .get("avg_ts")
        .and_then(Value::as_f64)
        .ok_or_else(|| bad("has no numeric avg_ts"))?;
    if !(tok_s.is_finite() && tok_s > 0.0) {
        return Err(bad(&format!("has avg_ts {tok_s}")));
    }
    let s = |k: &str| {
        test.get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    Ok(BenchResult {
        tok_s,
        n_prompt: n_prompt as u64,
        n_gen: n_gen as u64,
        n_threads: num(test, "n_threads").unwrap_or(0),
        build_commit: s("build_commit"),
        build_number: num(test, "build_number").unwrap_or(0),
        cpu_info: s("cpu_info"),
        model_type: s("model_type"),
    })
}

/// The last `n` lines of `s`.
pub(crate) fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs `llama-bench` from `bin_dir` once (`-r 1`, after its own warm-up run) on `model` with
/// `threads` threads: `-p n_prompt -n n_gen -o json`. One of `n_prompt` and `n_gen` should be
/// 0 (a prefill test or a decode test). A run that fails to start, exits non-zero or prints no
/// usable JSON is an error carrying the command and its stderr's tail.
pub fn run_llama_bench(
    bin_dir: &Path,
    model: &Path,
    threads: usize,
    n_prompt: usize,
    n_gen: usize,
) -> Result<BenchResult> {
    if n_prompt == 0 && n_gen == 0 {
        return Err(Error::Invalid(
            "llama-bench needs a prompt or tokens to generate (both are 0)".into(),
        ));
    }
    let exe = bin_dir.join("llama-bench");
    let args: Vec<String> = [
        "-m",
        &model.display().to_string(),
        "-t",
        &threads.to_string(),
        "-p",
        &n_prompt.to_string(),
        "-n",
        &n_gen.to_string(),
        "-r",
        "1",
        "-o",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let shown = format!("{} {}", exe.display(), args.join(" "));
    let out = Command::new(&exe)
        .args(&args)
        .output()
        .map_err(|e| Error::Invalid(format!("could not start `{shown}`: {e}")))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(Error::Invalid(format!(
            "the llama.cpp peer failed ({}): `{shown}`; its stderr ended with:\n{}",
            out.status,
            tail(&stderr, 20)
        )));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    parse_llama_bench_json(&stdout, n_prompt, n_gen).map_err(|e| {
        Error::Invalid(format!(
            "{e}\n(from `{shown}`; its stderr ended with:\n{})",
            tail(&stderr, 10)
        ))
    })
}

/// llama.cpp's speed in tokens per second on `model` with `threads` threads: prefill of
/// `n_prompt` tokens (`n_gen` 0) or decode of `n_gen` tokens (`n_prompt` 0); see
/// [`run_llama_bench`].
pub fn llama_bench(
    bin_dir: &Path,
    model: &Path,
    threads: usize,
    n_prompt: usize,
    n_gen: usize,
) -> Result<f64> {
    Ok(run_llama_bench(bin_dir, model, threads, n_prompt, n_gen)?.tok_s)
}

/// llama.cpp's tokens per second of one forward pass over `rows` rows at once (`-p rows -n
/// 0`): what a batch of `rows` positions costs it, for comparison with our batched passes
/// (the diffusion window sweep, speculative verification).
pub fn batch_pass(bin_dir: &Path, model: &Path, threads: usize, rows: usize) -> Result<f64> {
    llama_bench(bin_dir, model, threads, rows, 0)
}

/// (model, window, our ms, llama.cpp's ms) for every window of a sweep measured by both (the
/// peer's points are named `llama.cpp MODEL`).
pub fn peer_ratios(sweep: &[super::diffusion::SweepPoint]) -> Vec<(String, usize, f64, f64)> {
    sweep
        .iter()
        .filter_map(|p| {
            let theirs = sweep
                .iter()
                .find(|q| q.window == p.window && q.model == format!("llama.cpp {}", p.model))?;
            Some((p.model.clone(), p.window, p.ms, theirs.ms))
        })
        .collect()
}

/// A reading of the machine's CPU time and this process's (with its waited-for children, such
/// as finished `llama-bench` runs), to tell how busy other processes kept the cores during a
/// comparison: llama.cpp's threads wait for each other at every operation, so when another
/// process takes a core its figures fall far more than ours. Linux only (`/proc`).
#[derive(Clone, Copy, Debug)]
pub struct CpuSample {
    /// Busy ticks of all cores (user, nice, system, irq, softirq, steal), USER_HZ.
    machine: u64,
    /// This process's user and system ticks and its waited-for children's.
    ours: u64,
    at: std::time::Instant,
}

/// The kernel's unit of `/proc` CPU times (USER_HZ: 100 on Linux).
const USER_HZ: f64 = 100.0;

impl CpuSample {
    /// Now; `None` where `/proc` cannot be read.
    pub fn now() -> Option<CpuSample> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = stat
            .lines()
            .next()?
            .strip_prefix("cpu ")?
            .split_whitespace()
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        // user nice system idle iowait irq softirq steal [guest guest_nice]
        if cpu.len() < 8 {
            return None;
        }
        let machine = cpu[0] + cpu[1] + cpu[2] + cpu[5] + cpu[6] + cpu[7];
        let me = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may hold spaces): state is field 3, utime 14,
        // stime 15, cutime 16, cstime 17.
        let rest: Vec<&str> = me.get(me.rfind(')')? + 1..)?.split_whitespace().collect();
        let tick = |i: usize| rest.get(i).and_then(|f| f.parse::<u64>().ok());
        let ours = tick(11)? + tick(12)? + tick(13)? + tick(14)?;
        Some(CpuSample {
            machine,
            ours,
            at: std::time::Instant::now(),
        })
    }

    /// The cores other processes (and the hypervisor's steal) kept busy on average since this
    /// sample: 0 on a quiet machine, 1.0 for one core busy throughout.
    pub fn others_since(&self) -> Option<f64> {
        let now = CpuSample::now()?;
        let wall = now.at.duration_since(self.at).as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        let machine = now.machine.saturating_sub(self.machine) as f64;
        let ours = now.ours.saturating_sub(self.ours) as f64;
        Some(((machine - ours) / USER_HZ / wall).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stdout of `llama-bench -m SmolLM2-135M-Instruct.Q4_1.gguf -t 2 -p 64 -n 0 -r 1 -o
    /// json`, the llama.cpp vendored in llama-cpp-python 0.3.36 built by
    /// scripts/peer/llama_cpp.sh (on a loaded machine: the figure is not one to quote).
    const SAMPLE: &str = r#"[
  {
    "build_commit": "unknown",
    "build_number": 0,
    "cpu_info": "Intel(R) Xeon(R) Processor",
    "gpu_info": "",
    "backends": "CPU",
    "model_filename": "/root/.cache/llada/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "model_type": "llama 256M Q4_1",
    "model_size": 96576768,
    "model_n_params": 134515008,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "cpu_mask": "0x0",
    "cpu_strict": false,
    "poll": 50,
    "type_k": "f16",
    "type_v": "f16",
    "n_gpu_layers": -1,
    "n_cpu_moe": 0,
    "split_mode": "layer",
    "main_gpu": 0,
    "no_kv_offload": false,
    "flash_attn": -1,
    "devices": "auto",
    "tensor_split": "0.00",
    "tensor_buft_overrides": "none",
    "load_mode": "auto",
    "lazy_mode": "auto",
    "embeddings": false,
    "no_op_offload": 0,
    "no_host": false,
    "repack": true,
    "fit_target": 0,
    "fit_min_ctx": 0,
    "n_prompt": 64,
    "n_gen": 0,
    "n_depth": 0,
    "test_time": "2026-12-07T18:55:26Z",
    "avg_ns": 1877680171,
    "stddev_ns": 0,
    "avg_ts": 34.084612,
    "stddev_ts": 0.000000,
    "samples_ns": [ 1877680171 ],
    "samples_ts": [ 34.0846 ]
  }
]"#;

    #[test]
    fn parses_a_captured_llama_bench_run() {
        let r = parse_llama_bench_json(SAMPLE, 64, 0).unwrap();
        assert_eq!(r.tok_s, 34.084612);
        assert_eq!((r.n_prompt, r.n_gen, r.n_threads), (64, 0, 2));
        assert_eq!(r.model_type, "llama 256M Q4_1");
        assert_eq!(r.cpu_info, "Intel(R) Xeon(R) Processor");
        // The other test is not in this output.
        let e = parse_llama_bench_json(SAMPLE, 0, 128)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no test"), "{e}");
    }

    #[test]
    fn rejects_output_that_is_not_its_json() {
        for bad in [
            "",
            "[",
            "{}",
            r#"[{"n_prompt": 64, "n_gen": 0}]"#,
            r#"[{"n_prompt": 64, "n_gen": 0, "avg_ts": "fast"}]"#,
            r#"[{"n_prompt": 64, "n_gen": 0, "avg_ts": 0.0}]"#,
        ] {
            let e = parse_llama_bench_json(bad, 64, 0).unwrap_err().to_string();
            assert!(e.contains("llama-bench's JSON output"), "{bad}: {e}");
        }
        let ok = r#"[{"n_prompt": 0, "n_gen": 128, "avg_ts": 123.5, "n_threads": 4}]"#;
        let r = parse_llama_bench_json(ok, 0, 128).unwrap();
        assert_eq!((r.tok_s, r.n_threads), (123.5, 4));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_the_cpu_time_of_the_machine_and_of_this_process() {
        let s = CpuSample::now().expect("/proc is readable");
        // Spin a little so that some time passes.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 50 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let others = s.others_since().unwrap();
        let cores = std::thread::available_parallelism().map_or(64, |n| n.get()) as f64;
        assert!((0.0..=cores).contains(&others), "{others}");
    }

    #[test]
    fn an_absent_peer_is_an_error_naming_the_build_script() {
        let dir = std::env::temp_dir().join(format!("llada-no-peer-{}", std::process::id()));
        let e = find_bin_dir(Some(&dir)).unwrap_err().to_string();
        assert!(e.contains(BUILD_SCRIPT) && e.contains("--peer-dir"), "{e}");
        let e = llama_bench(&dir, Path::new("m.gguf"), 1, 64, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("could not start"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn a_failing_peer_reports_its_stderr() {
        // A stand-in llama-bench that fails the way a broken build does.
        let dir = std::env::temp_dir().join(format!("llada-bad-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("llama-bench");
        std::fs::write(
            &exe,
            "#!/bin/sh\necho 'error: failed to load model' >&2\nexit 1\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_bin_dir(Some(&dir)).unwrap(), dir);
        // A process forked by another test while the script was open for writing can hold it
        // for a moment ("Text file busy"): try again then.
        let mut e = String::new();
        for _ in 0..50 {
            e = llama_bench(&dir, Path::new("m.gguf"), 1, 64, 0)
                .unwrap_err()
                .to_string();
            if !e.contains("os error 26") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::fs::remove_dir_all(&dir).ok();
        assert!(
            e.contains("peer failed") && e.contains("failed to load model"),
            "{e}"
        );
    }

    fn point(model: &str, window: usize, ms: f64) -> super::super::diffusion::SweepPoint {
        super::super::diffusion::SweepPoint {
            model: model.into(),
            window,
            ms,
            ms_per_token: ms / window as f64,
        }
    }

    #[test]
    fn peer_ratios_pair_each_window_with_the_peers_pass() {
        let sweep = [
            point("tiny", 8, 1.0),
            point("llada-8b-q4_0", 8, 500.0),
            point("llama.cpp llada-8b-q4_0", 8, 1000.0),
            point("llada-8b-q4_0", 16, 800.0),
            point("llama.cpp llada-8b-q4_0", 16, 400.0),
            point("llada-8b-q4_0", 32, 900.0),
        ];
        let r = peer_ratios(&sweep);
        assert_eq!(
            r,
            vec![
                ("llada-8b-q4_0".to_string(), 8, 500.0, 1000.0),
                ("llada-8b-q4_0".to_string(), 16, 800.0, 400.0),
            ]
        );
    }
}
