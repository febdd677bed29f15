//! Times one causal verify-shaped pass of `n` rows over a 128-token cached context, with every
//! weight resident and under a memory budget (`BUDGET`, default 25 %): how a streamed pass's
//! time grows with its width, the curve behind Lever's cost model (`io + n · c`).
//!
//! `cargo run --release -p llada-model --example pass_width -- MODEL.gguf` (medians of 15
//! passes, ms per pass, inside a rayon pool as the engine's lanes run it).
use llada_model::{
    store::Budget, AttnMask, ForwardRequest, KvWrite, LoadOptions, LogitRows, Model,
};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: pass_width MODEL"))?;
    let budget = std::env::var("BUDGET").unwrap_or_else(|_| "25%".into());
    let widths: Vec<usize> = std::env::var("WIDTHS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8, 16, 32]);
    for b in [
        None,
        Some(Budget::parse(&budget).map_err(anyhow::Error::msg)?),
    ] {
        let model = Model::load(
            std::path::Path::new(&path),
            &LoadOptions {
                no_tokenizer: true,
                mem_budget: b,
                ..Default::default()
            },
        )?;
        println!("budget {:?}", b);
        rayon::ThreadPoolBuilder::new()
            .build()?
            .install(|| run(&model, &widths))?;
    }
    Ok(())
}

fn run(model: &Model, widths: &[usize]) -> anyhow::Result<()> {
    let ctx = 128usize;
    let mut cache = model.new_cache();
    let toks: Vec<u32> = (0..ctx as u32).map(|i| 300 + i * 7).collect();
    let pos: Vec<u32> = (0..ctx as u32).collect();
    model.forward(
        &ForwardRequest {
            tokens: &toks,
            positions: &pos,
            mask: AttnMask::Causal,
            kv_write: KvWrite::Append,
            logits: LogitRows::None,
        },
        &mut cache,
    )?;
    println!("{:>4} {:>9} {:>9}", "n", "ms/pass", "ms/row");
    for &n in widths {
        let toks: Vec<u32> = (0..n as u32).map(|i| 500 + i).collect();
        let pos: Vec<u32> = (ctx as u32..(ctx + n) as u32).collect();
        let mut t = vec![];
        for _ in 0..15 {
            let a = Instant::now();
            std::hint::black_box(model.forward(
                &ForwardRequest {
                    tokens: &toks,
                    positions: &pos,
                    mask: AttnMask::Causal,
                    kv_write: KvWrite::None,
                    logits: LogitRows::All,
                },
                &mut cache,
            )?);
            t.push(a.elapsed().as_secs_f64() * 1e3);
        }
        t.sort_by(|a, b| a.total_cmp(b));
        let st = model.store.as_ref().map(|s| {
            let g = |a: &std::sync::atomic::AtomicU64| {
                a.swap(0, std::sync::atomic::Ordering::Relaxed) as f64 / 15e6
            };
            (
                g(&s.stats.read_ns),
                g(&s.stats.build_ns),
                g(&s.stats.wait_ns),
            )
        });
        println!("{n:>4} {:>9.2} {:>9.2} {:?}", t[7], t[7] / n as f64, st);
    }
    Ok(())
}
