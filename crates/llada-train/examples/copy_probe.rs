//! Debug: can the diffusion objective learn "rev:X=" → "X" (copy at offset −2)? Trains with the
//! bidirectional and with a causal mask and prints the loss on the letter position.
use candle_core::{Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use llada_train::model::{Format, ModelSpec, TrainModel};
use llada_train::objective::{diffusion_batch, weighted_ce};
use llada_train::tasks::TaskGen;
use llada_train::vocab::{CharVocab, BOS, EOS, MASK};
use rand::SeedableRng;

fn main() -> anyhow::Result<()> {
    let dev = Device::Cpu;
    // `copy_probe [STEPS] [LR] [INIT_STD] [ROPE_THETA] [bidir]` (defaults 200, 3e-3, 0.02, 1e4).
    let args: Vec<String> = std::env::args().collect();
    let steps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(200);
    let lr: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3e-3);
    let init_std: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0.02);
    let theta: f64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1e4);
    let only_bidir = args.get(5).is_some_and(|s| s == "bidir");
    let tied = args.get(6).is_some_and(|s| s == "tied");
    let ar = args.get(5).is_some_and(|s| s == "ar");
    for causal in [false, true] {
        if causal && only_bidir {
            break;
        }
        let spec = ModelSpec {
            format: if ar { Format::Llama } else { Format::LLaDA },
            vocab: CharVocab::size(),
            d_model: 128,
            n_layers: 4,
            n_heads: 4,
            n_kv_heads: 4,
            ffn: 384,
            rope_theta: theta,
            rms_eps: 1e-5,
            max_len: 512,
            mask_id: MASK,
            eos_id: EOS,
            bos_id: BOS,
            tied,
            store_f16: false,
            init_std,
        };
        let model = TrainModel::new(spec, &dev, 0)?;
        let mut opt = AdamW::new(
            model.varmap.all_vars(),
            ParamsAdamW {
                lr,
                weight_decay: 0.01,
                ..Default::default()
            },
        )?;
        let mut g = TaskGen::new(1, false);
        g.scale = 0.01;
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        for step in 0..steps {
            let ex: Vec<_> = (0..32).map(|_| g.next(Some("rev"))).collect();
            let b = if ar {
                llada_train::objective::next_token_batch(&ex, false, &dev)?
            } else {
                diffusion_batch(&ex, MASK, 0.05, false, &mut rng, &dev)?
            };
            let logits = model.forward(&b.ids, causal || ar)?;
            let loss = weighted_ce(&logits, &b, false)?;
            opt.backward_step(&loss)?;
            if ar && (step % (steps / 5).max(1) == 0 || step + 1 == steps) {
                // Next-token: the letter (row index 7) is predicted at position 6.
                let lsm = candle_nn::ops::log_softmax(&logits, 2)?;
                let v: Vec<Vec<Vec<f32>>> = lsm.to_vec3()?;
                let tg: Vec<Vec<u32>> = b.targets.to_vec2()?;
                let nll: f32 = (0..32).map(|r| -v[r][6][tg[r][6] as usize]).sum::<f32>() / 32.0;
                println!("ar step {step}: letter nll {nll:.3}");
                continue;
            }
            if step % (steps / 5).max(1) == 0 || step + 1 == steps {
                // Letter position is index 7 (BOS r e v : X =); loss there with it masked.
                let mut ids: Vec<Vec<u32>> = b.ids.to_vec2()?;
                let tg: Vec<Vec<u32>> = b.targets.to_vec2()?;
                for r in ids.iter_mut() {
                    r[7] = MASK;
                }
                let t = Tensor::new(ids, &dev)?;
                let lg = model.forward(&t, causal)?;
                let lsm = candle_nn::ops::log_softmax(&lg, 2)?;
                let v: Vec<Vec<Vec<f32>>> = lsm.to_vec3()?;
                let nll: f32 = (0..32).map(|r| -v[r][7][tg[r][7] as usize]).sum::<f32>() / 32.0;
                println!(
                    "causal={causal} step {step}: loss {:.3}, letter-position nll {nll:.3}",
                    loss.to_scalar::<f32>()?
                );
            }
        }
    }
    Ok(())
}
