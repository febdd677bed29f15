//! Times one bidirectional forward pass of `w` window rows over a cached prefix on a model
//! directory (default `models/tiny-llada-tasks`), for widths 8 … 64: the per-width curve the
//! diffusion window's static shapes are chosen from.
//!
//! `cargo run --release -p llada-model --example window_pass [-- MODEL_DIR]` (medians of 9
//! runs of 50 passes, µs per pass, inside a rayon pool as the engine's lanes run it).
use llada_model::{AttnMask, ForwardRequest, KvWrite, LoadOptions, LogitRows, Model};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "models/tiny-llada-tasks".into());
    let model = Model::load(
        std::path::Path::new(&dir),
        &LoadOptions {
            no_tokenizer: true,
            ..Default::default()
        },
    )?;
    rayon::ThreadPoolBuilder::new()
        .build()?
        .install(|| run(&model))
}

fn run(model: &Model) -> anyhow::Result<()> {
    let mask = model.config.mask_id.unwrap_or(0);
    let prefix = 64usize;
    let mut cache = model.new_cache();
    let toks: Vec<u32> = (0..prefix as u32).map(|i| 3 + i % 40).collect();
    let pos: Vec<u32> = (0..prefix as u32).collect();
    model.forward(
        &ForwardRequest {
            tokens: &toks,
            positions: &pos,
            mask: AttnMask::Bidirectional,
            kv_write: KvWrite::Append,
            logits: LogitRows::None,
        },
        &mut cache,
    )?;
    println!("{:>4} {:>9} {:>9}", "w", "µs/pass", "µs/row");
    let widths: Vec<usize> = std::env::var("WIDTHS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![8, 16, 24, 28, 32, 36, 40, 48, 64]);
    for w in widths {
        let toks = vec![mask; w];
        let pos: Vec<u32> = (prefix as u32..(prefix + w) as u32).collect();
        let rows: Vec<usize> = (0..w).collect();
        let mut t = vec![];
        for _ in 0..9 {
            let a = Instant::now();
            for _ in 0..50 {
                std::hint::black_box(model.forward(
                    &ForwardRequest {
                        tokens: &toks,
                        positions: &pos,
                        mask: AttnMask::Bidirectional,
                        kv_write: KvWrite::None,
                        logits: LogitRows::Rows(&rows),
                    },
                    &mut cache,
                )?);
            }
            t.push(a.elapsed().as_secs_f64() * 1e6 / 50.0);
        }
        t.sort_by(|a, b| a.total_cmp(b));
        println!("{w:>4} {:>9.1} {:>9.2}", t[4], t[4] / w as f64);
    }
    Ok(())
}
