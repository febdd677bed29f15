//! `llada train` and `llada eval` on bad input: a clear error naming the option, value or
//! file, a non-zero exit, no panic, no hang, and a good checkpoint left as it was.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `llada args` in the repository root (the draft evaluations read data/austen.txt),
/// killing it after `limit`: (exit code, stderr). A hang fails the test.
fn llada(args: &[&str], limit: Duration) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_llada"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run llada");
    let mut stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).ok();
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("llada {args:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), reader.join().unwrap_or_default())
}

/// `llada args` fails (exit 1, no panic) within `limit` with a message containing `want`.
fn fails_with(args: &[&str], want: &str, limit: Duration) {
    let (code, err) = llada(args, limit);
    assert_eq!(code, Some(1), "llada {args:?}: {err}");
    assert!(!err.contains("panicked"), "llada {args:?} panicked: {err}");
    assert!(
        err.contains(want),
        "llada {args:?}: expected {want:?} in: {err}"
    );
}

const TINY: &[&str] = &[
    "train",
    "--preset",
    "tiny-llada-tasks",
    "--layers",
    "1",
    "--d-model",
    "32",
    "--batch-tokens",
    "0",
    "--tasks",
    "rev",
    "--max-scale",
    "0.3",
];

/// [`TINY`] with `extra`, and `--batch 2` unless `extra` gives a batch.
fn tiny(extra: &[&str]) -> Vec<String> {
    let batch: &[&str] = if extra.iter().any(|a| a.starts_with("--batch")) {
        &[]
    } else {
        &["--batch", "2"]
    };
    TINY.iter()
        .chain(batch)
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llada-bad-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Every file of a directory with its bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

const QUICK: Duration = Duration::from_secs(60);

/// `--max-scale` ≤ 0.05 left a task without held-out prompts and the generator redrew forever,
/// in `train` and in `eval`.
#[test]
fn a_max_scale_too_small_for_the_split_is_an_error() {
    let out = scratch("ms05");
    let o = out.to_str().unwrap();
    fails_with(
        &[
            "train",
            "--preset",
            "tiny-llada-tasks",
            "--layers",
            "1",
            "--d-model",
            "32",
            "--batch",
            "2",
            "--batch-tokens",
            "0",
            "--steps",
            "1",
            "--max-scale",
            "0.05",
            "--out",
            o,
        ],
        "--max-scale",
        QUICK,
    );
    assert!(!out.exists(), "nothing written");
    fails_with(
        &[
            "eval",
            "-m",
            "models/tiny-llada-tasks",
            "--per-task",
            "1",
            "--tasks",
            "rev",
            "--max-scale",
            "0.03",
        ],
        "--max-scale 0.03 is too small",
        QUICK,
    );
}

/// Numeric options no run can use are refused before any work, and a resumed checkpoint is
/// never replaced: `--lr nan` used to save NaN weights and `"loss": null` over it.
#[test]
fn bad_numbers_leave_the_checkpoint_as_it_was() {
    let out = scratch("resume");
    let o = out.to_str().unwrap().to_string();
    let (code, err) = llada(&strs(&tiny(&["--steps", "2", "--out", &o])), QUICK);
    assert_eq!(code, Some(0), "{err}");
    let good = files(&out);
    for (flag, want) in [
        (
            "--lr=nan",
            "--lr NaN: the learning rate must be a finite number > 0",
        ),
        ("--lr=-1", "--lr -1"),
        ("--lr=0", "--lr 0"),
        ("--minutes=-1", "--minutes -1"),
        ("--minutes=0", "--minutes 0"),
        ("--batch=0", "--batch 0: between 1 and 4096"),
        ("--steps=0", "--steps must be at least 1"),
        (
            "--checkpoint-every=0",
            "--checkpoint-every must be at least 1",
        ),
    ] {
        let args = tiny(&["--resume", "--out", &o, flag]);
        fails_with(&strs(&args), want, QUICK);
        assert_eq!(files(&out), good, "{flag} changed the checkpoint");
    }
    // A learning rate that is a number but too large: the loss diverges, the run stops
    // naming the step, the checkpoint stays.
    let args = tiny(&["--resume", "--out", &o, "--steps", "8", "--lr", "1e30"]);
    fails_with(&strs(&args), "the loss diverged at step", QUICK);
    assert_eq!(files(&out), good, "a diverged run replaced the checkpoint");
    // And it still resumes.
    let (code, err) = llada(
        &strs(&tiny(&["--resume", "--steps", "3", "--out", &o])),
        QUICK,
    );
    assert_eq!(code, Some(0), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}

/// `--resume` on a directory without a checkpoint is an error naming it (it started afresh),
/// and `--out` naming a file is refused before the training, the file kept.
#[test]
fn output_directories_are_checked_first() {
    let dir = scratch("out");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap().to_string();
    let args = tiny(&["--steps", "2", "--resume", "--out", &d]);
    fails_with(
        &strs(&args),
        &format!("--resume: {d} holds no checkpoint"),
        QUICK,
    );
    assert!(files(&dir).is_empty(), "nothing written");
    let file = dir.join("model.txt");
    std::fs::write(&file, "a good file").unwrap();
    let f = file.to_str().unwrap().to_string();
    let t0 = Instant::now();
    let args = tiny(&["--steps", "2", "--out", &f]);
    fails_with(
        &strs(&args),
        &format!("the output directory {f} is a file"),
        QUICK,
    );
    // The prose preset tokenizes the corpora first: the check comes before.
    fails_with(
        &["train", "--preset", "tiny-llada-prose", "--out", &f],
        "is a file",
        QUICK,
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "a good file");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Draft evaluation: more windows than the held-out split has (it allocated until the kernel
/// killed it), a draft over another vocabulary (either way round; it said only "token id … is
/// outside the vocabulary"), and `--threads 0`.
#[test]
fn draft_evaluation_input_is_checked() {
    // The window count is checked against the prose corpora, which `scripts/fetch_corpora.py`
    // fetches (not part of the test command's setup): checked where they are present.
    let corpora = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/austen.txt");
    if std::path::Path::new(corpora).exists() {
        fails_with(
            &[
                "eval",
                "-m",
                "models/smollm2-draft",
                "--target",
                "smollm2",
                "--windows",
                "100000000",
            ],
            "--windows 100000000: the held-out split of data/austen.txt",
            QUICK,
        );
    }
    for (draft, target) in [
        ("models/smollm2-draft", "models/tiny-llada-tasks"),
        ("models/tiny-llada-tasks", "smollm2"),
    ] {
        fails_with(
            &["eval", "-m", draft, "--target", target, "--windows", "1"],
            "a draft must share the target's tokenizer",
            QUICK,
        );
    }
    fails_with(
        &["eval", "-m", "models/tiny-llada-tasks", "--threads", "0"],
        "--threads must be at least 1",
        QUICK,
    );
}
