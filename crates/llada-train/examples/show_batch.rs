//! Print one training batch of the task data (masked positions as `_`), for debugging.
use llada_train::model::{Format, ModelSpec};
use llada_train::trainer::{DataSource, TaskData};
use llada_train::vocab::{CharVocab, BOS, EOS, MASK};
use rand::SeedableRng;

fn main() -> anyhow::Result<()> {
    let spec = ModelSpec {
        format: Format::LLaDA,
        vocab: CharVocab::size(),
        d_model: 64,
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 2,
        ffn: 64,
        rope_theta: 1e4,
        rms_eps: 1e-5,
        max_len: 512,
        mask_id: MASK,
        eos_id: EOS,
        bos_id: BOS,
        tied: false,
        store_f16: false,
        init_std: 0.02,
    };
    let mut d = TaskData {
        curriculum: 0.6,
        max_scale: 0.25,
        structured: 0.5,
        ..TaskData::plain(vec!["rev"], 6, 0)
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let b = d.batch(100, 0.5, &spec, false, &mut rng, &candle_core::Device::Cpu)?;
    let ids: Vec<Vec<u32>> = b.ids.to_vec2()?;
    let tg: Vec<Vec<u32>> = b.targets.to_vec2()?;
    let w: Vec<Vec<f32>> = b.weights.to_vec2()?;
    let show = |v: &[u32]| -> String {
        v.iter()
            .map(|&t| match t {
                0 => '.',
                1 => '^',
                2 => '_',
                t => CharVocab::decode(&[t]).chars().next().unwrap_or('?'),
            })
            .collect()
    };
    for r in 0..ids.len() {
        println!("in  {}", show(&ids[r]));
        println!("tgt {}", show(&tg[r]));
        println!(
            "w   {:?}",
            &w[r]
                .iter()
                .filter(|x| **x > 0.0)
                .take(3)
                .collect::<Vec<_>>()
        );
    }
    Ok(())
}
