//! Streaming weights under a memory budget changes where bytes live, never the numbers: a
//! model with streamed layers and head gives bit-identical logits, and reads exactly the
//! planned bytes per pass.

use llada_model::store::Budget;
use llada_model::{AttnMask, ForwardRequest, KvWrite, LoadOptions, LogitRows, Model};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

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
            let before = st.stats.bytes_read.load(Ordering::Relaxed);
            let got = logits(&m, &tokens);
            assert_eq!(got, want, "{name} at {frac}: streamed logits differ");
            // Two passes, each reading every streamed unit once.
            let read = st.stats.bytes_read.load(Ordering::Relaxed) - before;
            assert_eq!(read, 2 * st.plan.streamed_bytes(), "{name} at {frac}");
        }
    }
}
