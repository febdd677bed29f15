//! Streaming weights under a memory budget changes where bytes live, never the numbers: a
//! model with streamed layers and head gives bit-identical logits (to rounding for a dense
//! head, which is multiplied in row chunks), and reads exactly the
//! planned bytes per pass, holding no more weight memory than the plan's staging buffers.

use llada_kernels::weight_memory;
use llada_model::store::Budget;
use llada_model::{AttnMask, EarlyExit, ForwardRequest, KvWrite, LoadOptions, LogitRows, Model};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// Weight memory is counted process-wide: the tests of this file take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn fixture(name: &str) -> PathBuf {
    std::env::var_os("LLADA_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"))
        .join(name)
}

fn logits(m: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut cache = m.new_cache();
    let pos: Vec<u32> = (0..tokens.len() as u32).collect();
    let a = m
        .forward(
            &ForwardRequest {
                tokens: &tokens[..3],
                positions: &pos[..3],
                mask: AttnMask::Causal,
                kv_write: KvWrite::Append,
                logits: LogitRows::None,
            },
            &mut cache,
        )
        .unwrap();
    assert!(a.logits.is_empty());
    m.forward(
        &ForwardRequest {
            tokens: &tokens[3..],
            positions: &pos[3..],
            mask: AttnMask::Causal,
            kv_write: KvWrite::Append,
            logits: LogitRows::All,
        },
        &mut cache,
    )
    .unwrap()
    .logits
}

#[test]
fn streamed_weights_give_identical_logits() {
    let _turn = serial();
    let mut chunked_heads = 0;
    for name in ["hf-llama", "gguf-llama-q4_1.gguf", "hf-dream"] {
        let path = fixture(name);
        let opts = LoadOptions {
            no_tokenizer: true,
            ..Default::default()
        };
        let resident = Model::load(&path, &opts).unwrap();
        assert!(resident.store.is_none());
        let tokens = [5u32, 9, 17, 3, 44, 61];
        let want = logits(&resident, &tokens);
        for frac in [0.3, 0.01] {
            let m = Model::load(
                &path,
                &LoadOptions {
                    mem_budget: Some(Budget::Fraction(frac)),
                    ..opts.clone()
                },
            )
            .unwrap();
            let st = m.store.as_ref().expect("nothing streamed");
            assert!(st.plan.streamed_bytes() > 0);
            assert!(st.plan.resident_bytes() <= (frac * st.plan.total_bytes() as f64) as u64);
            if !st.plan.resident_head {
                chunked_heads += usize::from(st.plan.head_chunks > 1);
            }
            let before = st.stats.bytes_read.load(Ordering::Relaxed);
            // Weight memory while streaming: the staging buffers the plan declares, no more.
            weight_memory::reset_peak();
            let live = weight_memory::live();
            let evicted = llada_kernels::recycle::evicted_bytes();
            let got = logits(&m, &tokens);
            let staged = weight_memory::peak() - live;
            assert!(
                staged <= st.plan.staging_bytes(),
                "{name} at {frac}: {staged} staged bytes > {}",
                st.plan.staging_bytes()
            );
            // The pool's steady state: after the first pass every arena and read buffer comes
            // from the pool, so making room never frees one (no churn within the staging cap).
            assert_eq!(
                llada_kernels::recycle::evicted_bytes(),
                evicted,
                "{name} at {frac}: pooled buffers freed while streaming one model"
            );
            if name.starts_with("gguf") {
                // Quantized head: the kernels compute each logit row-independently.
                assert_eq!(got, want, "{name} at {frac}: streamed logits differ");
            } else {
                // Dense (f32) head: gemm blocks a row chunk differently from the whole matrix,
                // so chunked logits agree to rounding, not bit for bit.
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert_eq!(got.len(), want.len());
                assert!(
                    worst <= 1e-5,
                    "{name} at {frac}: streamed logits differ by {worst}"
                );
            }
            // Two passes, each reading every streamed unit once; the read-ahead stream may have
            // read the next pass's first units too (at most three: one held by the reader, one
            // by the builder, one in its hands).
            let read = st.stats.bytes_read.load(Ordering::Relaxed) - before;
            let ahead = 3 * st.plan.largest_streamed();
            assert!(
                read >= 2 * st.plan.streamed_bytes()
                    && read <= 2 * st.plan.streamed_bytes() + ahead,
                "{name} at {frac}: {read} bytes read for two passes of {}",
                st.plan.streamed_bytes()
            );
        }
    }
    // The head was streamed in row chunks somewhere (so the chunked path is what was checked).
    assert!(chunked_heads > 0);
}

/// The Q4_1 fixture at a 1 % budget (nearly everything streamed), and the resident model's
/// logits of [`TOKENS`].
fn streamed_q4_1() -> (Model, Vec<f32>) {
    let path = fixture("gguf-llama-q4_1.gguf");
    let opts = LoadOptions {
        no_tokenizer: true,
        ..Default::default()
    };
    let want = logits(&Model::load(&path, &opts).unwrap(), &TOKENS);
    let m = Model::load(
        &path,
        &LoadOptions {
            mem_budget: Some(Budget::Fraction(0.01)),
            ..opts
        },
    )
    .unwrap();
    (m, want)
}

const TOKENS: [u32; 6] = [5, 9, 17, 3, 44, 61];

#[test]
fn streaming_survives_a_pass_that_fails_midway() {
    let _turn = serial();
    // Every pass gets every streamed unit, in order; a pass that fails midway (its reader and
    // builder already ahead of it) must not leave the next one misaligned or hanging.
    let (m, want) = streamed_q4_1();
    let st = m.store.as_ref().expect("nothing streamed");
    assert!(
        !st.plan.resident_layers[0],
        "layer 0 must stream for this test"
    );
    for _ in 0..3 {
        assert_eq!(logits(&m, &TOKENS), want);
    }
    // An early exit that keeps no row fails the pass after layer 0: one unit taken, the
    // rest of the pass (already being read ahead) never.
    let keep = |_: &[f32], alive: &[usize]| vec![false; alive.len()];
    let exit = EarlyExit {
        layer: 0,
        keep: &keep,
    };
    let mut cache = m.new_cache();
    let req = ForwardRequest::causal_append(&TOKENS[..3], &[0, 1, 2]);
    assert!(m.forward_with_exit(&req, &mut cache, Some(&exit)).is_err());
    for _ in 0..2 {
        assert_eq!(logits(&m, &TOKENS), want);
    }
}

#[test]
fn concurrent_passes_each_get_their_own_units() {
    let _turn = serial();
    // One pass holds the store's read-ahead stream; a pass beside it (AHASD's pre-verification
    // does this) streams through a pipeline of its own. Both must see every unit, in order.
    let (m, want) = streamed_q4_1();
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..3)
            .map(|_| s.spawn(|| (0..3).map(|_| logits(&m, &TOKENS)).collect::<Vec<_>>()))
            .collect();
        for r in runs {
            for got in r.join().unwrap() {
                assert_eq!(got, want);
            }
        }
    });
}
