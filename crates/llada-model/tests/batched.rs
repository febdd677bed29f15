//! Continuous batching: several sequences in one pass ([`Model::forward_many`]) get exactly the
//! logits and KV rows each would get alone ([`Model::forward`]), bit for bit, whatever else
//! shares the pass — prefill chunks, one-row decode steps, revision and token trees, causal and
//! bidirectional masks — on f32 checkpoints and on quantized ones (the kernels' batched tiles
//! must compute each row as the one-row path does); a refused request leaves every cache as it
//! was.

use llada_model::{AttnMask, ForwardRequest, KvWrite, LoadOptions, LogitRows, Model, SeqPass};
use llada_runtime::KvCache;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn load(p: &std::path::Path) -> Model {
    let opts = LoadOptions {
        no_tokenizer: true,
        ..Default::default()
    };
    Model::load(p, &opts).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Owned request parts.
struct Req {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    mask: Option<Vec<bool>>,
    causal: bool,
    slots: Option<Vec<Option<usize>>>,
    logits: Option<Vec<usize>>,
}

impl Req {
    fn get(&self) -> ForwardRequest<'_> {
        ForwardRequest {
            tokens: &self.tokens,
            positions: &self.positions,
            mask: match (&self.mask, self.causal) {
                (Some(m), _) => AttnMask::Explicit(m),
                (None, true) => AttnMask::Causal,
                (None, false) => AttnMask::Bidirectional,
            },
            kv_write: self
                .slots
                .as_ref()
                .map_or(KvWrite::Append, |s| KvWrite::Slots(s)),
            logits: self
                .logits
                .as_ref()
                .map_or(LogitRows::All, |r| LogitRows::Rows(r)),
        }
    }
}

fn ids(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97)) % vocab as u32)
        .collect()
}

/// A cache holding `n` prompt rows of `seed`'s ids.
fn prefilled(m: &Model, n: usize, seed: u32, causal: bool) -> KvCache {
    let mut c = m.new_cache();
    if n > 0 {
        let r = Req {
            tokens: ids(n, seed, m.config.vocab),
            positions: (0..n as u32).collect(),
            mask: None,
            causal,
            slots: None,
            logits: Some(vec![]),
        };
        m.forward(&r.get(), &mut c).unwrap();
    }
    c
}

/// Three sequences' next requests: a decode step, a prefill chunk, and a tree with a revised
/// slot (explicit mask over its rows, logits of some rows only).
fn mixed(m: &Model, causal: bool) -> Vec<(KvCache, Req)> {
    let v = m.config.vocab;
    let decode = Req {
        tokens: ids(1, 5, v),
        positions: vec![9],
        mask: None,
        causal,
        slots: None,
        logits: None,
    };
    let chunk = Req {
        tokens: ids(7, 6, v),
        positions: (3..10).collect(),
        mask: None,
        causal,
        slots: None,
        logits: Some(vec![6]),
    };
    // Rows: 0 rewrites slot 4; 1, 2 children of 0; 3 child of 1.
    #[rustfmt::skip]
    let mask = vec![
        true, false, false, false,
        true, true, false, false,
        true, false, true, false,
        true, true, false, true,
    ];
    let tree = Req {
        tokens: ids(4, 7, v),
        positions: vec![4, 5, 5, 6],
        mask: Some(mask),
        causal,
        slots: Some(vec![Some(4), Some(5), None, Some(6)]),
        logits: Some(vec![1, 2, 3]),
    };
    vec![
        (prefilled(m, 9, 1, causal), decode),
        (prefilled(m, 3, 2, causal), chunk),
        (prefilled(m, 5, 3, causal), tree),
    ]
}

fn passes_of(seqs: &mut [(KvCache, Req)]) -> Vec<SeqPass<'_, '_>> {
    seqs.iter_mut()
        .map(|(c, r)| SeqPass {
            req: r.get(),
            cache: c,
        })
        .collect()
}

fn check_batched_equals_alone(m: &Model, what: &str) {
    for causal in [true, false] {
        let alone: Vec<_> = mixed(m, causal)
            .into_iter()
            .map(|(mut c, r)| {
                let o = m.forward(&r.get(), &mut c).unwrap();
                (o, c)
            })
            .collect();
        let mut seqs = mixed(m, causal);
        let mut passes = passes_of(&mut seqs);
        let many = m.forward_many(&mut passes).unwrap();
        assert_eq!(many.len(), alone.len());
        for (i, ((o, c), (mo, (mc, _)))) in alone.iter().zip(many.iter().zip(&seqs)).enumerate() {
            assert_eq!(o.rows, mo.rows, "{what} seq {i} rows");
            assert!(
                o.logits == mo.logits,
                "{what} causal={causal} seq {i}: logits differ"
            );
            assert!(o.features == mo.features, "{what} seq {i}: features differ");
            assert!(c.same_rows(mc), "{what} seq {i}: KV rows differ");
        }
    }
}

#[test]
fn sequences_sharing_a_pass_get_what_they_get_alone() {
    let dir = fixtures();
    for f in [
        "hf-qwen2",
        "hf-llada",
        "gguf-llama-q4_1.gguf",
        "gguf-llama-q8.gguf",
    ] {
        check_batched_equals_alone(&load(&dir.join(f)), f);
    }
}

/// The real quantized model (Q4_1, 576-wide rows): the batched kernels' tiles against the
/// one-row path.
#[test]
fn real_model_rows_are_batch_independent() {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let p = home.join(".cache/llada/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !p.exists() {
        assert!(
            std::env::var_os("LLADA_REQUIRE_REAL_MODELS").is_none(),
            "{} missing",
            p.display()
        );
        eprintln!("skipped: {} not fetched", p.display());
        return;
    }
    check_batched_equals_alone(&load(&p), "smollm2");
}

#[test]
fn a_refused_sequence_leaves_every_cache_untouched() {
    let m = load(&fixtures().join("hf-qwen2"));
    let mut seqs = mixed(&m, true);
    // The third sequence writes a slot past its cache's end: a hole.
    seqs[2].1.slots = Some(vec![Some(4), Some(5), None, Some(9)]);
    let before: Vec<KvCache> = seqs.iter().map(|(c, _)| c.clone()).collect();
    let mut passes = passes_of(&mut seqs);
    assert!(m.forward_many(&mut passes).is_err());
    for ((c, _), b) in seqs.iter().zip(&before) {
        assert!(c.same_rows(b) && c.len() == b.len());
    }
    assert!(m.forward_many(&mut []).unwrap().is_empty());
}
