//! Bad training input is an error that names what is wrong, before any work where it can be,
//! and never replaces a good checkpoint: options no run can use, output directories that are
//! files or hold nothing to resume, length scales too small for the held-out split, and runs
//! whose loss diverges.

use llada_train::model::{Format, ModelSpec};
use llada_train::trainer::{train, TaskData, TrainOptions, TrainState};
use llada_train::vocab::{CharVocab, BOS, EOS, MASK};
use std::path::{Path, PathBuf};

fn spec() -> ModelSpec {
    ModelSpec {
        format: Format::LLaDA,
        vocab: CharVocab::size(),
        d_model: 32,
        n_layers: 1,
        n_heads: 4,
        n_kv_heads: 4,
        ffn: 64,
        rope_theta: 1e4,
        rms_eps: 1e-5,
        max_len: 256,
        mask_id: MASK,
        eos_id: EOS,
        bos_id: BOS,
        tied: false,
        store_f16: false,
        init_std: 0.08,
    }
}

fn data(max_scale: f64) -> TaskData {
    TaskData {
        max_scale,
        ..TaskData::plain(vec!["rev"], 2, 0)
    }
}

fn opts(steps: usize, lr: f64) -> TrainOptions {
    TrainOptions {
        steps,
        batch: 2,
        lr,
        warmup: 1,
        seed: 0,
        checkpoint_every: 1,
        curriculum: 1.0,
        time_budget_s: None,
        init_from: None,
        data_parallel: 1,
        beta2: 0.999,
    }
}

/// A fresh directory under the temp dir (removed first).
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llada-bad-train-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn run(o: TrainOptions, out: &Path, resume: bool, max_scale: f64) -> anyhow::Result<TrainState> {
    train(spec(), o, out, resume, true, &mut data(max_scale))
}

fn err(r: anyhow::Result<TrainState>) -> String {
    format!("{:#}", r.expect_err("an error"))
}

/// Every file of a checkpoint directory, by name.
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

/// Options no run can use are refused before anything is created; a run of 0 steps used to
/// end with a pathless "No such file or directory" (it re-read a state file it never wrote).
#[test]
fn unusable_options_are_refused_before_any_work() {
    let out = scratch("opts");
    let cases: Vec<(TrainOptions, &str)> = vec![
        (opts(0, 1e-3), "--steps must be at least 1"),
        (opts(2, f64::NAN), "--lr NaN"),
        (opts(2, -1.0), "--lr -1"),
        (opts(2, f64::INFINITY), "--lr inf"),
        (
            TrainOptions {
                batch: 0,
                ..opts(2, 1e-3)
            },
            "--batch must be at least 1",
        ),
        (
            TrainOptions {
                time_budget_s: Some(-60.0),
                ..opts(2, 1e-3)
            },
            "--minutes -1",
        ),
        (
            TrainOptions {
                checkpoint_every: 0,
                ..opts(2, 1e-3)
            },
            "--checkpoint-every",
        ),
    ];
    for (o, want) in cases {
        let e = err(run(o, &out, false, 0.1));
        assert!(e.contains(want), "{e}");
        assert!(!out.exists(), "{want}: {} was created", out.display());
    }
}

/// `resume` with no checkpoint in the directory is an error naming it (it silently started a
/// new run); an output path that is a file is refused before the training, and kept.
#[test]
fn output_paths_are_checked_before_training() {
    let dir = scratch("paths");
    std::fs::create_dir_all(&dir).unwrap();
    let e = err(run(opts(2, 1e-3), &dir, true, 0.1));
    assert!(
        e.contains("holds no checkpoint") && e.contains(&dir.display().to_string()),
        "{e}"
    );
    assert!(files(&dir).is_empty(), "nothing written");
    let missing = dir.join("never-made");
    let e = err(run(opts(2, 1e-3), &missing, true, 0.1));
    assert!(e.contains("holds no checkpoint"), "{e}");
    assert!(!missing.exists());
    let file = dir.join("a-file");
    std::fs::write(&file, "keep me").unwrap();
    let t0 = std::time::Instant::now();
    let e = err(run(opts(2, 1e-3), &file, false, 0.1));
    assert!(e.contains("is a file") && e.contains("a-file"), "{e}");
    let e = err(run(opts(2, 1e-3), &file.join("sub"), false, 0.1));
    assert!(e.contains("is a file"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    assert!(t0.elapsed().as_secs() < 5, "{:?}", t0.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A length scale that leaves a task no held-out prompt is an error at once (the generator
/// redrew forever).
#[test]
fn a_scale_too_small_for_the_split_is_an_error() {
    let out = scratch("scale");
    let t0 = std::time::Instant::now();
    let mut d = data(0.05);
    d.tasks = vec!["cumsum"];
    let e = format!(
        "{:#}",
        train(spec(), opts(2, 1e-3), &out, false, true, &mut d).unwrap_err()
    );
    assert!(e.contains("no held-out example of task cumsum"), "{e}");
    assert!(t0.elapsed().as_secs() < 20, "{:?}", t0.elapsed());
    assert!(!out.exists(), "nothing written");
}

/// A run whose loss diverges stops with an error naming the step, and the checkpoint it
/// resumed stays as it was (a NaN learning rate used to save NaN weights and `"loss": null`
/// over it); a state file that such a run wrote is named for what it is. Resuming a run that
/// already reached its steps reports its checkpoint.
#[test]
fn a_diverging_run_keeps_the_previous_checkpoint() {
    let out = scratch("diverge");
    let st = run(opts(2, 2e-3), &out, false, 0.1).unwrap();
    assert_eq!(st.step, 2);
    let good = files(&out);
    // Resumed at an absurd learning rate: the weights overflow within a step or two.
    let o = TrainOptions {
        checkpoint_every: 100,
        ..opts(8, 1e30)
    };
    let e = err(run(o, &out, true, 0.1));
    assert!(e.contains("the loss diverged at step"), "{e}");
    assert!(e.contains("keeps its checkpoint of step 2"), "{e}");
    assert_eq!(files(&out), good, "the checkpoint was replaced");
    // Nothing left to train: the checkpoint's state, not a re-read of a file.
    let again = run(opts(2, 2e-3), &out, true, 0.1).unwrap();
    assert_eq!((again.step, again.loss), (st.step, st.loss));
    // A state file from a diverged run of an older build.
    let state = out.join("train_state.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    v["loss"] = serde_json::Value::Null;
    std::fs::write(&state, v.to_string()).unwrap();
    let e = err(run(opts(4, 2e-3), &out, true, 0.1));
    assert!(e.contains("records a diverged run"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
}
