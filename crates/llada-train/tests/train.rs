//! Training lowers the loss on a fixed batch, and saved checkpoints load through the engine's
//! normal HF loader with identical logits.

use candle_core::{Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use llada_model::{AttnMask, ForwardRequest, KvWrite, LoadOptions, LogitRows, Model};
use llada_train::model::{Format, ModelSpec, TrainModel};
use llada_train::objective::{diffusion_batch, next_token_batch, weighted_ce};
use llada_train::tasks::TaskGen;
use llada_train::trainer::{save_with, TaskData};
use llada_train::vocab::{CharVocab, BOS, EOS, MASK};
use rand::{Rng, SeedableRng};

fn spec(format: Format) -> ModelSpec {
    ModelSpec {
        format,
        vocab: CharVocab::size(),
        d_model: 64,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: if format == Format::Dream { 2 } else { 4 },
        ffn: 128,
        rope_theta: 1e4,
        rms_eps: 1e-5,
        max_len: 256,
        mask_id: MASK,
        eos_id: EOS,
        bos_id: BOS,
        tied: format == Format::Llama,
        store_f16: format == Format::Dream,
        init_std: 0.02,
    }
}

#[test]
fn a_few_steps_lower_the_loss_on_a_fixed_batch() {
    let dev = Device::Cpu;
    for format in [Format::LLaDA, Format::Dream, Format::Llama] {
        let model = TrainModel::new(spec(format), &dev, 0).unwrap();
        let mut g = TaskGen::new(5, false);
        g.scale = 0.2;
        let ex: Vec<_> = (0..8).map(|_| g.next(None)).collect();
        let shift = format == Format::Dream;
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let batch = match format {
            Format::Llama => next_token_batch(&ex, false, &dev).unwrap(),
            _ => diffusion_batch(&ex, MASK, 1e-3, shift, &mut rng, &dev).unwrap(),
        };
        let causal = format == Format::Llama;
        let mut opt = AdamW::new(
            model.varmap.all_vars(),
            ParamsAdamW {
                lr: 3e-3,
                ..Default::default()
            },
        )
        .unwrap();
        let loss0 = weighted_ce(&model.forward(&batch.ids, causal).unwrap(), &batch, shift)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        for _ in 0..40 {
            let loss =
                weighted_ce(&model.forward(&batch.ids, causal).unwrap(), &batch, shift).unwrap();
            opt.backward_step(&loss).unwrap();
        }
        let loss1 = weighted_ce(&model.forward(&batch.ids, causal).unwrap(), &batch, shift)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(loss1 < 0.6 * loss0, "{format:?}: loss {loss0} -> {loss1}");
    }
}

#[test]
fn checkpoints_round_trip_through_the_engine_loader() {
    let dev = Device::Cpu;
    for (format, causal, tied) in [
        (Format::LLaDA, false, false),
        (Format::LLaDA, false, true),
        (Format::Dream, false, false),
        (Format::Llama, true, true),
    ] {
        let model = TrainModel::new(
            ModelSpec {
                tied,
                ..spec(format)
            },
            &dev,
            0,
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!(
            "llada-train-rt-{:?}-{tied}-{}",
            format,
            std::process::id()
        ));
        save_with(
            &model,
            &TaskData {
                structured: 0.5,
                ..TaskData::plain(vec![], 1, 0)
            },
            &dir,
        )
        .unwrap();
        let loaded = Model::load(&dir, &LoadOptions::default()).unwrap();
        assert_eq!(loaded.config.shift_logits, format == Format::Dream);
        assert_eq!(loaded.config.tied_embeddings, tied);
        assert_eq!(loaded.config.mask_id.is_some(), format != Format::Llama);
        let tok = loaded.tokenizer.as_ref().unwrap();
        let ids = tok.encode("sort:3 1 2=").unwrap();
        assert_eq!(ids, CharVocab::encode("sort:3 1 2="));
        let positions: Vec<u32> = (0..ids.len() as u32).collect();
        let mut cache = loaded.new_cache();
        let mask = if causal {
            AttnMask::Causal
        } else {
            AttnMask::Bidirectional
        };
        let ours = loaded
            .forward(
                &ForwardRequest {
                    tokens: &ids,
                    positions: &positions,
                    mask,
                    kv_write: KvWrite::None,
                    logits: LogitRows::All,
                },
                &mut cache,
            )
            .unwrap();
        let t = Tensor::from_vec(ids.clone(), (1, ids.len()), &dev).unwrap();
        let reference: Vec<f32> = model
            .forward(&t, causal)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let scale = reference.iter().fold(0f32, |a, b| a.max(b.abs()));
        let err = ours
            .logits
            .iter()
            .zip(&reference)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        // Dream is stored in f16 here: its logits move by the f16 rounding of the weights.
        let tol = if format == Format::Dream { 1e-2 } else { 1e-4 };
        assert!(err / scale < tol, "{format:?}: rel err {}", err / scale);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Every parameter — q/k projections included — receives a gradient (candle-nn's fused softmax
/// records no backward and silently froze attention once).
#[test]
fn every_parameter_gets_a_gradient() {
    let dev = Device::Cpu;
    for format in [Format::LLaDA, Format::Dream, Format::Llama] {
        let model = TrainModel::new(spec(format), &dev, 0).unwrap();
        let mut g = TaskGen::new(8, false);
        g.scale = 0.2;
        let ex: Vec<_> = (0..4).map(|_| g.next(None)).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let shift = format == Format::Dream;
        let batch = match format {
            Format::Llama => next_token_batch(&ex, false, &dev).unwrap(),
            _ => diffusion_batch(&ex, MASK, 1e-3, shift, &mut rng, &dev).unwrap(),
        };
        let loss = weighted_ce(
            &model.forward(&batch.ids, format == Format::Llama).unwrap(),
            &batch,
            shift,
        )
        .unwrap();
        let grads = loss.backward().unwrap();
        let vars = model.varmap.data().lock().unwrap();
        for (name, var) in vars.iter() {
            if name.ends_with(".bias") {
                continue; // zero-initialised biases may legitimately see tiny gradients
            }
            let gr = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{format:?}: no gradient for {name}"));
            let norm = gr
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(norm > 0.0, "{format:?}: zero gradient for {name}");
        }
    }
}

/// Autograd gradients agree with central finite differences for sampled elements of every
/// parameter (attention, MLP, norms, embedding, head): checks the whole backward path, not
/// only that gradients are non-zero.
#[test]
fn gradients_match_finite_differences() {
    let dev = Device::Cpu;
    for format in [Format::LLaDA, Format::Dream, Format::Llama] {
        let mut s = spec(format);
        s.d_model = 16;
        s.n_heads = 2;
        s.n_kv_heads = if format == Format::Dream { 1 } else { 2 };
        s.ffn = 24;
        s.n_layers = 2;
        let model = TrainModel::new(s, &dev, 0).unwrap();
        // Larger weights than the 0.02 init so every term has a measurable effect. Drawn from a
        // seeded generator: candle's CPU `randn` is not seedable, and an unlucky draw once put
        // a probe where the loss curves too fast for the finite difference (60 seeds of this
        // uniform draw pass).
        let mut prng = rand::rngs::StdRng::seed_from_u64(7);
        for var in model.varmap.all_vars() {
            let t = var.as_tensor();
            let r: Vec<f32> = (0..t.elem_count())
                .map(|_| prng.random_range(-0.5f32..0.5))
                .collect();
            let r = candle_core::Tensor::from_vec(r, t.shape(), &dev).unwrap();
            let _ = var.set(&(t + r).unwrap());
        }
        let mut g = TaskGen::new(11, false);
        g.scale = 0.1;
        let ex: Vec<_> = (0..2).map(|_| g.next(Some("rev"))).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let shift = format == Format::Dream;
        let batch = match format {
            Format::Llama => next_token_batch(&ex, false, &dev).unwrap(),
            _ => diffusion_batch(&ex, MASK, 0.5, shift, &mut rng, &dev).unwrap(),
        };
        let loss_of = || -> f64 {
            weighted_ce(
                &model.forward(&batch.ids, format == Format::Llama).unwrap(),
                &batch,
                shift,
            )
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64
        };
        let loss = weighted_ce(
            &model.forward(&batch.ids, format == Format::Llama).unwrap(),
            &batch,
            shift,
        )
        .unwrap();
        let grads = loss.backward().unwrap();
        let vars: Vec<(String, candle_core::Var)> = model
            .varmap
            .data()
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut checked = 0;
        for (name, var) in vars {
            let gr: Vec<f32> = grads
                .get(var.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let orig: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            // The element with the largest gradient (a meaningful, well-conditioned probe).
            let (i, &gi) = gr
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
                .unwrap();
            if gi.abs() < 1e-4 {
                continue;
            }
            let h = 1e-2f32;
            let at = |v: f32| {
                let mut w = orig.clone();
                w[i] = v;
                var.set(&candle_core::Tensor::from_vec(w, var.as_tensor().shape(), &dev).unwrap())
                    .unwrap();
                loss_of()
            };
            // Richardson-extrapolated central difference (error O(h⁴) instead of O(h²)): the
            // probe is the largest gradient, and which element that is can change between runs
            // (parallel sums round in a scheduling-dependent order); with the plain central
            // difference ≈ 1 in 20 runs of this binary on a loaded machine landed on an
            // embedding element where the loss curves too fast for h = 10⁻² (FD 6.19 against
            // autograd 7.36); 0 of 40 with this one.
            let central = |h: f32| (at(orig[i] + h) - at(orig[i] - h)) / (2.0 * h as f64);
            let fd = (4.0 * central(h / 2.0) - central(h)) / 3.0;
            at(orig[i]);
            let rel = (fd - gi as f64).abs() / gi.abs().max(1e-3) as f64;
            assert!(
                rel < 0.05,
                "{format:?} {name}[{i}]: autograd {gi} vs finite difference {fd}"
            );
            checked += 1;
        }
        assert!(
            checked >= 10,
            "{format:?}: only {checked} parameters probed"
        );
    }
}

/// A corpus of `text` in a fresh temporary directory (named by `tag`), with a 300-token BPE
/// trained on it: `(directory, tokenizer, corpus)`.
fn tiny_corpus(
    tag: &str,
    text: &str,
) -> (
    std::path::PathBuf,
    tokenizers::Tokenizer,
    llada_train::prose::Corpus,
) {
    use llada_train::prose::{train_bpe, Corpus};
    let dir = std::env::temp_dir().join(format!("llada-train-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("t.txt");
    std::fs::write(&file, text).unwrap();
    let tok = train_bpe(&[&file], 300).unwrap();
    let corpus = Corpus::load(&[&file], &tok, 0).unwrap();
    (dir, tok, corpus)
}

/// A reduced-vocabulary draft (embedding and head over the K most frequent ids plus one shared
/// row) loads through the engine: in-set ids get the training model's logits, the others none,
/// and out-of-set input ids read the shared row.
#[test]
fn reduced_vocabulary_checkpoint_round_trips() {
    use llada_train::prose::reduce_vocab;
    use llada_train::trainer::ProseData;
    let dev = Device::Cpu;
    let (dir, tok, mut corpus) = tiny_corpus(
        "rv",
        &"It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.\nIn the beginning God created the heaven and the earth.\n".repeat(40),
    );
    let vocab = tok.get_vocab_size(true);
    let k = 16;
    let (ids, cover) = reduce_vocab(&mut corpus, vocab, k);
    assert!(cover > 0.0 && cover < 1.0);
    let mut s = spec(Format::Llama);
    s.vocab = k + 1;
    let model = TrainModel::new(s, &dev, 0).unwrap();
    let out = dir.join("draft");
    let data = ProseData {
        corpus,
        tokenizer: tok,
        batch: 1,
        seq_len: 8,
        reduced_vocab: Some((ids.clone(), vocab)),
        distill: vec![],
        distill_soft: vec![],
        distill_from: 0.0,
        distill_share: 1.0,
        ar_warmup: 0.0,
        two_stream: false,
    };
    save_with(&model, &data, &out).unwrap();
    let loaded = Model::load(&out, &LoadOptions::default()).unwrap();
    assert_eq!(loaded.config.vocab, vocab);
    assert_eq!(loaded.config.vocab_ids.as_deref(), Some(&ids[..]));
    // Input: three in-set ids and one id outside the set.
    let outside = (0..vocab as u32).find(|t| !ids.contains(t)).unwrap();
    let tokens = vec![ids[3], ids[0], outside, ids[7]];
    let rows: Vec<u32> = vec![3, 0, k as u32, 7];
    let positions: Vec<u32> = (0..4).collect();
    let mut cache = loaded.new_cache();
    let ours = loaded
        .forward(
            &ForwardRequest {
                tokens: &tokens,
                positions: &positions,
                mask: AttnMask::Causal,
                kv_write: KvWrite::None,
                logits: LogitRows::All,
            },
            &mut cache,
        )
        .unwrap();
    assert_eq!(ours.vocab, vocab);
    let t = Tensor::from_vec(rows, (1, 4), &dev).unwrap();
    let reference: Vec<Vec<f32>> = model
        .forward(&t, true)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec2()
        .unwrap();
    for (i, r) in reference.iter().enumerate() {
        let row = ours.row(i);
        for (j, &id) in ids.iter().enumerate() {
            assert!((row[id as usize] - r[j]).abs() < 1e-4, "pos {i} id {id}");
        }
        let in_set = row.iter().filter(|&&x| x > -1e29).count();
        assert_eq!(in_set, k, "only the reduced ids get logits");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--distill-from F --distill-share S`: before progress F every training batch is a corpus
/// batch; after it about S of them come from the distillation windows; held-out batches are
/// always the corpus's.
#[test]
fn distillation_starts_at_its_progress_and_takes_its_share() {
    use llada_train::trainer::{DataSource, ProseData};
    let (dir, tok, corpus) = tiny_corpus(
        "dfrom",
        &"In the beginning God created the heaven and the earth.\n".repeat(60),
    );
    // Distillation windows are made of an id no corpus token has.
    const MARK: u32 = 9_999;
    let mut data = ProseData {
        corpus,
        tokenizer: tok,
        batch: 2,
        seq_len: 8,
        reduced_vocab: None,
        distill: vec![(vec![MARK; 8], vec![MARK; 8]); 3],
        distill_soft: vec![],
        distill_from: 0.4,
        distill_share: 0.5,
        ar_warmup: 0.0,
        two_stream: false,
    };
    let s = spec(Format::Llama);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut from_distill = |progress: f64, heldout: bool, rng: &mut rand::rngs::StdRng| {
        let b = data
            .batch(0, progress, &s, heldout, rng, &Device::Cpu)
            .unwrap();
        let ids: Vec<Vec<u32>> = b.ids.to_vec2().unwrap();
        let marked = ids.iter().flatten().filter(|&&t| t == MARK).count();
        assert!(marked == 0 || marked == 16, "a batch mixes sources");
        marked == 16
    };
    for i in 0..200 {
        assert!(!from_distill(0.399 * i as f64 / 200.0, false, &mut rng));
        assert!(!from_distill(0.9, true, &mut rng));
    }
    let late = (0..400)
        .filter(|i| from_distill(0.4 + 0.6 * *i as f64 / 400.0, false, &mut rng))
        .count();
    assert!(
        (160..=240).contains(&late),
        "{late} of 400 late batches distilled"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A distillation batch pairs each drawn window with its own labels (never another window's),
/// weights every position 1/T, and draws from the whole set.
#[test]
fn distillation_batches_pair_windows_with_their_labels() {
    use llada_train::trainer::distill_batch;
    let set: Vec<(Vec<u32>, Vec<u32>)> = (0..5u32)
        .map(|k| {
            (
                (0..4).map(|i| 10 * k + i).collect(),
                (0..4).map(|i| 100 + 10 * k + i).collect(),
            )
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let b = distill_batch(&set, &[], 64, &mut rng, &Device::Cpu).unwrap();
    assert!(b.soft.is_none());
    let ids: Vec<Vec<u32>> = b.ids.to_vec2().unwrap();
    let tg: Vec<Vec<u32>> = b.targets.to_vec2().unwrap();
    let w: Vec<Vec<f32>> = b.weights.to_vec2().unwrap();
    let mut seen = [false; 5];
    for r in 0..64 {
        let k = (ids[r][0] / 10) as usize;
        seen[k] = true;
        assert_eq!(ids[r], set[k].0);
        assert_eq!(tg[r], set[k].1);
        assert!(w[r].iter().all(|&x| (x - 0.25).abs() < 1e-7));
    }
    assert!(seen.iter().all(|&s| s));
    // Soft labels travel with their window: window k's classes are 1000·k + position.
    let soft: Vec<(Vec<u32>, Vec<f32>)> = (0..5u32)
        .map(|k| {
            (
                (0..8).map(|i| 1000 * k + i / 2).collect(),
                vec![0.75, 0.25, 0.75, 0.25, 0.75, 0.25, 0.75, 0.25],
            )
        })
        .collect();
    let b = distill_batch(&set, &soft, 16, &mut rng, &Device::Cpu).unwrap();
    let ids: Vec<Vec<u32>> = b.ids.to_vec2().unwrap();
    let st = b.soft.expect("soft targets");
    assert_eq!(st.classes.len(), 16 * 8);
    for (row, got) in ids.iter().zip(st.classes.chunks(8)) {
        assert_eq!(got, &soft[(row[0] / 10) as usize].0[..]);
    }
    assert!(distill_batch(&set, &soft[..2], 4, &mut rng, &Device::Cpu).is_err());
}

/// A time-budgeted run follows the budget: its progress (curriculum and learning-rate decay)
/// reaches 1 when the budget is spent, even if the step count says otherwise, and the learning
/// rate then sits at its floor (10 % of the peak). Without a budget, progress is by step.
#[test]
fn time_budget_drives_the_schedule() {
    use llada_train::trainer::{learning_rate, run_progress, TrainOptions};
    let mut o = TrainOptions {
        steps: 1000,
        batch: 4,
        lr: 1e-3,
        warmup: 10,
        seed: 0,
        checkpoint_every: 100,
        curriculum: 0.6,
        time_budget_s: None,
        init_from: None,
        data_parallel: 1,
        beta2: 0.999,
    };
    assert!((run_progress(&o, 500, 1e6) - 0.5).abs() < 1e-12);
    assert!(
        (learning_rate(&o, 0, 0.0) - 1e-4).abs() < 1e-12,
        "warm-up starts at lr/warmup"
    );
    assert!(
        (learning_rate(&o, 10, 0.01) - 1e-3).abs() < 1e-9,
        "peak after warm-up"
    );
    assert!(
        (learning_rate(&o, 999, 1.0) - 1e-4).abs() < 1e-9,
        "floor at the end"
    );
    o.time_budget_s = Some(100.0);
    assert!(
        (run_progress(&o, 100, 50.0) - 0.5).abs() < 1e-12,
        "time ahead of steps"
    );
    assert!(
        (run_progress(&o, 800, 50.0) - 0.8).abs() < 1e-12,
        "steps ahead of time"
    );
    assert_eq!(run_progress(&o, 100, 250.0), 1.0);
    let p = run_progress(&o, 300, 100.0);
    assert!((learning_rate(&o, 300, p) - 1e-4).abs() < 1e-9);
    // Monotone decay after warm-up.
    let lrs: Vec<f64> = (0..=10)
        .map(|i| learning_rate(&o, 20, i as f64 / 10.0))
        .collect();
    assert!(lrs.windows(2).all(|w| w[1] <= w[0] + 1e-15), "{lrs:?}");
}

/// Initial parameters are a function of the seed alone (candle's CPU `randn` is unseeded, so the
/// model draws its own): equal for equal seeds, different otherwise.
#[test]
fn initial_parameters_follow_the_seed() {
    let dev = Device::Cpu;
    let params = |seed: u64| -> Vec<(String, Vec<f32>)> {
        let m = TrainModel::new(spec(Format::Dream), &dev, seed).unwrap();
        let data = m.varmap.data().lock().unwrap();
        let mut v: Vec<(String, Vec<f32>)> = data
            .iter()
            .map(|(k, var)| {
                let t = var.as_tensor().flatten_all().unwrap();
                (k.clone(), t.to_vec1::<f32>().unwrap())
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let (a, b, c) = (params(7), params(7), params(8));
    assert_eq!(a, b, "same seed, same parameters");
    let differ = a
        .iter()
        .zip(&c)
        .filter(|(x, y)| x.1.iter().any(|v| *v != 0.0 && *v != 1.0) && x.1 != y.1)
        .count();
    assert!(differ > 0, "another seed must change the random parameters");
    // Random parameters have the spec's scale (`init_std`), not zero.
    let q = &a
        .iter()
        .find(|(k, _)| k.contains("q_proj.weight"))
        .unwrap()
        .1;
    let std = (q.iter().map(|x| x * x).sum::<f32>() / q.len() as f32).sqrt();
    assert!(
        (std - spec(Format::Dream).init_std as f32).abs() < 0.2 * std,
        "std {std}"
    );
}

/// `init_from` (fine-tuning) starts from the given checkpoint's weights instead of the seeded
/// initialisation; a checkpoint of another shape is refused with the tensor's name.
#[test]
fn fine_tuning_starts_from_the_given_checkpoint() {
    use llada_train::trainer::{train, TrainOptions};
    let dev = Device::Cpu;
    let base = std::env::temp_dir().join(format!("llada-train-ft-{}", std::process::id()));
    let data = || TaskData {
        max_scale: 0.1,
        ..TaskData::plain(vec!["rev"], 2, 0)
    };
    let weights = |dir: &std::path::Path| -> Vec<(String, Vec<f32>)> {
        let t = candle_core::safetensors::load(dir.join("model.safetensors"), &dev).unwrap();
        let mut v: Vec<(String, Vec<f32>)> = t
            .into_iter()
            .map(|(k, x)| (k, x.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    // The source checkpoint: seed 1's initial weights.
    let src = base.join("src");
    let m = TrainModel::new(spec(Format::LLaDA), &dev, 1).unwrap();
    save_with(&m, &data(), &src).unwrap();
    // One step at learning rate 0 from seed 2 keeps whatever the run started from.
    let opts = |init_from: Option<std::path::PathBuf>| TrainOptions {
        steps: 1,
        batch: 2,
        lr: 0.0,
        warmup: 1,
        seed: 2,
        checkpoint_every: 1,
        curriculum: 1.0,
        time_budget_s: None,
        init_from,
        data_parallel: 1,
        beta2: 0.999,
    };
    let (ft, fresh) = (base.join("ft"), base.join("fresh"));
    train(
        spec(Format::LLaDA),
        opts(Some(src.clone())),
        &ft,
        false,
        true,
        &mut data(),
    )
    .unwrap();
    train(
        spec(Format::LLaDA),
        opts(None),
        &fresh,
        false,
        true,
        &mut data(),
    )
    .unwrap();
    assert_eq!(
        weights(&ft),
        weights(&src),
        "fine-tuning starts from the checkpoint"
    );
    assert_ne!(weights(&fresh), weights(&src), "without it, from the seed");
    // Another shape: a clear error naming the tensor.
    let wide = ModelSpec {
        d_model: 96,
        ..spec(Format::LLaDA)
    };
    let err = train(
        wide,
        opts(Some(src)),
        &base.join("bad"),
        false,
        true,
        &mut data(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("has shape"), "{err}");
    // Resuming a directory whose train_state.json another trainer wrote (the PyTorch script's
    // layout) is refused with the reason, and the directory is left as it was.
    let foreign = base.join("foreign");
    save_with(&m, &data(), &foreign).unwrap();
    let state = r#"{"steps": 11009, "tokens": 25905664, "wall_s": 2700.0, "options": {}}"#;
    std::fs::write(foreign.join("train_state.json"), state).unwrap();
    let before = weights(&foreign);
    let err = train(
        spec(Format::LLaDA),
        opts(None),
        &foreign,
        true,
        true,
        &mut data(),
    )
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("is not a `llada train` state"), "{msg}");
    assert_eq!(weights(&foreign), before, "nothing overwritten");
    assert_eq!(
        std::fs::read_to_string(foreign.join("train_state.json")).unwrap(),
        state
    );
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn token_budget_trims_long_batches_only() {
    use llada_train::trainer::DataSource;
    let dev = Device::Cpu;
    let s = spec(Format::LLaDA);
    let data = |tasks: Vec<&'static str>, batch_tokens| TaskData {
        batch_tokens,
        ..TaskData::plain(tasks, 32, 3)
    };
    for step in 0..6 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(step);
        // Long sorts (progress 1: full lengths) lose rows to the budget; never below 4.
        let sorts = data(vec!["sort"], 2048)
            .batch(step as usize, 1.0, &s, false, &mut rng, &dev)
            .unwrap();
        let (rows, len) = sorts.ids.dims2().unwrap();
        assert!(
            (4..32).contains(&rows) || len <= 2048 / 32,
            "{rows} x {len}"
        );
        // The budget counts unpadded rows (+ BOS, EOS); the layout pads to a multiple of 8.
        assert!(rows == 4 || rows * (len - 8) <= 2048, "{rows} x {len}");
        // Without a budget, and for the held-out batch, every row stays.
        let mut rng = rand::rngs::StdRng::seed_from_u64(step);
        let full = data(vec!["sort"], 0)
            .batch(step as usize, 1.0, &s, false, &mut rng, &dev)
            .unwrap();
        assert_eq!(full.ids.dims2().unwrap().0, 32);
        let mut rng = rand::rngs::StdRng::seed_from_u64(step);
        let held = data(vec!["sort"], 2048)
            .batch(0, 1.0, &s, true, &mut rng, &dev)
            .unwrap();
        assert_eq!(held.ids.dims2().unwrap().0, 32);
        // Short sums fit the budget whole.
        let mut rng = rand::rngs::StdRng::seed_from_u64(step);
        let sums = data(vec!["add"], 2048)
            .batch(step as usize, 1.0, &s, false, &mut rng, &dev)
            .unwrap();
        assert_eq!(sums.ids.dims2().unwrap().0, 32);
    }
    // Held-out: one batch per task and length quarter, so a sum is never padded to a sort.
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let held = data(vec!["sort", "add"], 2048)
        .heldout_batches(&s, &mut rng, &dev)
        .unwrap();
    assert_eq!(held.len(), 8);
    let lens: Vec<usize> = held.iter().map(|b| b.ids.dims2().unwrap().1).collect();
    assert!(held.iter().all(|b| b.ids.dims2().unwrap().0 == 8));
    // Sort quarters grow in length; sum quarters are all one (fixed-width) length.
    assert!(lens[..4].windows(2).all(|w| w[0] <= w[1]), "{lens:?}");
    assert!(
        lens[4..].iter().all(|&l| l == lens[4] && l < lens[3]),
        "{lens:?}"
    );
    // A task named twice is drawn twice as often, but measured once on the held-out split.
    let mut weighted = data(vec!["sort", "sort", "add"], 0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    assert_eq!(
        weighted.heldout_batches(&s, &mut rng, &dev).unwrap().len(),
        8
    );
    let s_id = llada_train::vocab::CharVocab::encode("s")[0];
    let sorts = (0..300)
        .filter(|&step| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(step);
            let b = weighted
                .batch(step as usize, 0.0, &s, false, &mut rng, &dev)
                .unwrap();
            // Row 0 is BOS, then the prompt: "sort:…" or "add:…".
            b.ids
                .get(0)
                .unwrap()
                .get(1)
                .unwrap()
                .to_scalar::<u32>()
                .unwrap()
                == s_id
        })
        .count();
    assert!((170..230).contains(&sorts), "{sorts} sort batches of 300");
}

/// The two-stream warm-up (`two_stream_batch`): query `i` predicts token `i` from the tokens
/// left of `i` only. Changing the token at position `j` leaves every query `≤ j` bit-identical
/// and changes some query `> j`; and query `i`'s logits equal those of a separate pass over
/// `tokens[..i]` followed by one mask at `i` (the same prediction computed without the
/// two-stream trick: causal, the mask not seeing itself). Targets and weights: token `i` at query `i`, `1/L` on the answer.
#[test]
fn prose_two_stream_windows_predict_each_token_from_its_mask() {
    let dev = Device::Cpu;
    let rows = vec![vec![7u32, 8, 9, 10], vec![11, 12, 13, 14]];
    let b = llada_train::prose::two_stream_windows(&rows, MASK, &dev).unwrap();
    assert!(b.two_stream && !b.causal);
    let ids: Vec<Vec<u32>> = b.ids.to_vec2().unwrap();
    let tg: Vec<Vec<u32>> = b.targets.to_vec2().unwrap();
    let w: Vec<Vec<f32>> = b.weights.to_vec2().unwrap();
    for (r, row) in rows.iter().enumerate() {
        assert_eq!(&ids[r][..4], &row[..]);
        assert!(ids[r][4..].iter().all(|&x| x == MASK));
        assert_eq!(&tg[r][4..], &row[..]);
        // No loss on the content stream nor on query 0 (nothing to its left); 1/3 elsewhere.
        assert_eq!(&w[r][..5], &[0.0; 5]);
        assert!(w[r][5..].iter().all(|&x| (x - 1.0 / 3.0).abs() < 1e-7));
    }
}

#[test]
fn two_stream_queries_see_only_their_left_context() {
    use llada_train::objective::{two_stream_batch, two_stream_layout};
    let dev = Device::Cpu;
    let model = TrainModel::new(spec(Format::LLaDA), &dev, 3).unwrap();
    let mut g = TaskGen::new(8, false);
    g.scale = 0.3;
    let ex = vec![g.next(Some("add"))];
    let b = two_stream_batch(&ex, MASK, false, &dev).unwrap();
    let ids: Vec<u32> = b.ids.flatten_all().unwrap().to_vec1().unwrap();
    let t = ids.len() / 2;
    assert!(ids[t..].iter().all(|&x| x == MASK));
    let tg: Vec<u32> = b.targets.flatten_all().unwrap().to_vec1().unwrap();
    let w: Vec<f32> = b.weights.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(&tg[t..], &ids[..t]);
    assert!(w[..t].iter().all(|&x| x == 0.0));
    let start = 1 + CharVocab::encode(&ex[0].prompt).len();
    let l = (t - start) as f32;
    for (i, &wi) in w[t..].iter().enumerate() {
        assert_eq!(wi, if i >= start { 1.0 / l } else { 0.0 });
    }
    let (pos, vis) = two_stream_layout(t);
    let run = |ids: &[u32]| -> Vec<Vec<f32>> {
        let x = Tensor::from_vec(ids.to_vec(), (1, 2 * t), &dev).unwrap();
        let lg = model.forward_with(&x, Some(&pos), vis.clone()).unwrap();
        lg.squeeze(0).unwrap().to_vec2().unwrap()
    };
    let base = run(&ids);
    let j = start + 2;
    let mut alt = ids.clone();
    alt[j] = if alt[j] == 5 { 6 } else { 5 };
    let other = run(&alt);
    for i in 1..t {
        if i <= j {
            assert_eq!(base[t + i], other[t + i], "query {i} saw position {j}");
        }
    }
    assert!(
        (j + 1..t).any(|i| base[t + i] != other[t + i]),
        "nothing saw position {j}"
    );
    // Query i against a one-stream pass over tokens[..i] + a mask at position i, causal
    // except that the mask does not see itself (as a query does not).
    for i in [start, start + 3, t - 1] {
        let mut seq = ids[..i].to_vec();
        seq.push(MASK);
        let x = Tensor::from_vec(seq, (1, i + 1), &dev).unwrap();
        let table: Vec<u32> = (1..=i as u32).chain([i as u32]).collect();
        let lg: Vec<Vec<f32>> = model
            .forward_with(
                &x,
                None,
                llada_train::ops::Visibility::Prefix(std::sync::Arc::new(table)),
            )
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2()
            .unwrap();
        let diff = lg[i]
            .iter()
            .zip(&base[t + i])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-4, "query {i}: {diff}");
    }
}

/// Data-parallel shards give the whole batch's loss and gradient: rows split 4 + 3 (and
/// 3 + 2 + 2), each shard's loss scaled by its share of the rows, gradients summed — for the
/// diffusion (LLaDA), shifted (Dream), two-stream and soft-distillation batches.
#[test]
fn data_parallel_gradient_equals_the_whole_batch() {
    use llada_train::objective::two_stream_batch;
    use llada_train::trainer::{distill_batch, DataParallel};
    let dev = Device::Cpu;
    let mut g = TaskGen::new(9, false);
    g.scale = 0.3;
    let ex: Vec<_> = (0..7).map(|_| g.next(None)).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let set: Vec<(Vec<u32>, Vec<u32>)> = (0..5u32)
        .map(|k| ((0..6).map(|i| 3 + (k + i) % 40).collect(), vec![0; 6]))
        .collect();
    let soft: Vec<(Vec<u32>, Vec<f32>)> = (0..5u32)
        .map(|k| {
            (
                (0..12).map(|i| 3 + (7 * k + i) % 45).collect(),
                [0.7f32, 0.3].repeat(6),
            )
        })
        .collect();
    let cases = [
        (
            Format::LLaDA,
            diffusion_batch(&ex, MASK, 0.05, false, &mut rng, &dev).unwrap(),
        ),
        (
            Format::Dream,
            diffusion_batch(&ex, MASK, 0.05, true, &mut rng, &dev).unwrap(),
        ),
        (
            Format::LLaDA,
            two_stream_batch(&ex, MASK, false, &dev).unwrap(),
        ),
        // Dream's autoregressive warm-up: shifted layout, causal mask.
        (
            Format::Dream,
            llada_train::objective::shifted_next_token_batch(&ex, false, &dev).unwrap(),
        ),
        (
            Format::Llama,
            distill_batch(&set, &soft, 7, &mut rng, &dev).unwrap(),
        ),
    ];
    for (format, batch) in &cases {
        let model = TrainModel::new(spec(*format), &dev, 3).unwrap();
        let (l1, g1) = DataParallel::new(1)
            .unwrap()
            .loss_and_grads(&model, batch)
            .unwrap();
        for n in [2, 3] {
            let (ln, gn) = DataParallel::new(n)
                .unwrap()
                .loss_and_grads(&model, batch)
                .unwrap();
            assert!(
                (l1 - ln).abs() <= 1e-5 * l1.abs().max(1.0),
                "{format:?}, {n} shards: loss {ln} vs {l1}"
            );
            let flat = |g: &candle_core::backprop::GradStore, v: &candle_core::Var| -> Vec<f32> {
                g.get(v.as_tensor())
                    .expect("gradient")
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            };
            for v in model.varmap.all_vars() {
                let (a, b) = (flat(&g1, &v), flat(&gn, &v));
                let scale = a.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
                let err = a
                    .iter()
                    .zip(&b)
                    .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    err <= 1e-4 * scale,
                    "{format:?}, {n} shards: gradient differs by {err} (scale {scale})"
                );
            }
        }
    }
}

/// The adaptive task mix: weights follow `(1 − a) · n_k / n + a · L_k / Σ L`, and a source
/// told its held-out losses draws the tasks in those proportions (here: all of the adaptive
/// share to the one task with loss, none to the solved one).
#[test]
fn adaptive_mix_draws_tasks_by_held_out_loss() {
    use llada_train::trainer::{DataSource, TaskMix};
    // Weights from the formula, by hand: add listed once, sort twice; losses 1 and 3.
    let w = TaskMix::weights_for(
        0.5,
        &["add", "sort", "sort"],
        &[("add", 1.0), ("sort", 3.0)],
    );
    let (add, sort) = (w[0].1, w[1].1);
    assert!((add - (0.5 / 3.0 + 0.5 / 4.0)).abs() < 1e-12, "{add}");
    assert!(
        (sort - (0.5 * 2.0 / 3.0 + 0.5 * 3.0 / 4.0)).abs() < 1e-12,
        "{sort}"
    );
    // All losses zero or non-finite: the listing's uniform weights.
    let w = TaskMix::weights_for(1.0, &["add", "rev"], &[("add", 0.0), ("rev", f64::NAN)]);
    assert_eq!((w[0].1, w[1].1), (0.5, 0.5));

    let dev = Device::Cpu;
    let s = spec(Format::LLaDA);
    let mut data = TaskData {
        max_scale: 0.3,
        mix: TaskMix::with_adaptive(1.0),
        ..TaskData::plain(vec!["add", "rev"], 4, 5)
    };
    let task_of = |data: &mut TaskData, step: u64| -> String {
        let mut rng = rand::rngs::StdRng::seed_from_u64(step);
        let b = data
            .batch(step as usize, 1.0, &s, false, &mut rng, &dev)
            .unwrap();
        let row: Vec<u32> = b.ids.get(0).unwrap().to_vec1().unwrap();
        CharVocab::decode(&row[1..4])
    };
    // Before any losses: uniform, both tasks drawn.
    let seen: std::collections::HashSet<String> = (0..40).map(|i| task_of(&mut data, i)).collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let held = data.heldout_batches(&s, &mut rng, &dev).unwrap();
    assert_eq!(held.len(), 8, "four length quarters per task");
    // add solved (loss 0), rev not: every draw is a reversal; the log names both losses.
    let line = data
        .observe_heldout(&[0.0, 0.0, 0.0, 0.0, 2.0, 1.0, 1.0, 2.0])
        .unwrap();
    assert!(
        line.contains("add 0.0000") && line.contains("rev 1.5000"),
        "{line}"
    );
    for i in 0..40 {
        assert_eq!(task_of(&mut data, i), "rev", "step {i}");
    }
    // A loss vector of the wrong length is ignored (nothing changes, no panic).
    assert!(data.observe_heldout(&[1.0]).is_none());
}

/// The Python task generator of the accelerator path (`scripts/task_data.py`, used by
/// `scripts/train_tasks_torch.py`) answers the Rust generator's prompts the same way and puts
/// them on the same side of the held-out split, for every task, training and held-out.
#[test]
fn python_task_generator_agrees() {
    use llada_train::tasks::{held_out_split, is_held_out, TaskGen};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut g = TaskGen::new(7, false);
    let mut lines = String::new();
    let examples = (0..600).map(|_| g.next(None)).chain(held_out_split(20));
    for e in examples {
        let held = u8::from(is_held_out(&e.prompt));
        lines.push_str(&format!("{}\t{}\t{held}\n", e.prompt, e.answer));
    }
    let file = std::env::temp_dir().join(format!("llada-tasks-{}.tsv", std::process::id()));
    std::fs::write(&file, lines).unwrap();
    let out = std::process::Command::new("python3")
        .arg(root.join("scripts/task_data.py"))
        .arg("--check")
        .arg(&file)
        .output()
        .expect("python3 runs (the project's scripts need it)");
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("700/700"), "{text}");
}

/// Hidden batch padding (`diffusion_batch_padded(.., hide_padding = true, ..)`): a row of a
/// batch with longer rows trains exactly as it would alone in its own `llada eval` layout
/// (`BOS prompt answer-region`). Its masks and weights stay inside its region, its logits
/// equal a pass over the row cut at its end, and the batch's loss gradient equals the mean of
/// the rows' gradients computed alone — in both formats (Dream's shifted targets included).
/// With the padding as answer (the default before), the short row's logits change.
#[test]
fn hidden_padding_trains_each_row_as_if_alone() {
    use llada_train::objective::{answer_region, diffusion_batch_padded, Batch};
    use llada_train::ops::Visibility;
    use std::sync::Arc;
    let dev = Device::Cpu;
    for format in [Format::LLaDA, Format::Dream] {
        let shift = format == Format::Dream;
        let model = TrainModel::new(spec(format), &dev, 5).unwrap();
        let mut g = TaskGen::new(11, false);
        // Sorts of very different lengths: regions of 32 and 64 tokens.
        let mut ex = vec![];
        while ex.len() < 3 {
            let e = g.next(Some("sort"));
            let long = e.answer.len() > 40;
            if ex.len() == 2 && long || ex.len() < 2 && !long {
                ex.push(e);
            }
        }
        let mk = |hide: bool| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(2);
            diffusion_batch_padded(&ex, MASK, 0.05, shift, 0.5, 32, &[], hide, &mut rng, &dev)
                .unwrap()
        };
        let (b, open) = (mk(true), mk(false));
        assert!(open.ends.is_none());
        let ends = b.ends.clone().expect("hidden padding sets row ends");
        let (rows, t) = b.ids.dims2().unwrap();
        let w: Vec<Vec<f32>> = b.weights.to_vec2().unwrap();
        for (r, e) in ex.iter().enumerate() {
            let s = 1 + CharVocab::encode(&e.prompt).len();
            let end = s + answer_region(CharVocab::encode(&e.answer).len(), 1, 32);
            assert_eq!(ends[r] as usize, end);
            // Weights (already shifted for Dream: entry i is target i + 1) only in s..end.
            let off = usize::from(shift);
            for (i, &wi) in w[r].iter().enumerate() {
                let pos = i + off;
                if !(s..end).contains(&pos) {
                    assert_eq!(wi, 0.0, "row {r} weight at {pos} outside {s}..{end}");
                }
            }
            assert!(w[r].iter().any(|&x| x > 0.0));
        }
        let vis = |ends: &[u32], t: usize| Visibility::Ends {
            ends: Arc::from(ends),
            per: spec(format).n_heads * t,
        };
        let full: Vec<Vec<Vec<f32>>> = model
            .forward_with(&b.ids, None, vis(&ends, t))
            .unwrap()
            .to_vec3()
            .unwrap();
        let opened: Vec<Vec<Vec<f32>>> = model.forward(&b.ids, false).unwrap().to_vec3().unwrap();
        // Row r alone, cut at its end, as a one-row batch.
        let alone = |r: usize| -> Batch {
            let end = ends[r] as usize;
            let n = if shift { end - 1 } else { end };
            Batch {
                ids: b.ids.narrow(0, r, 1).unwrap().narrow(1, 0, end).unwrap(),
                targets: b.targets.narrow(0, r, 1).unwrap().narrow(1, 0, n).unwrap(),
                weights: b.weights.narrow(0, r, 1).unwrap().narrow(1, 0, n).unwrap(),
                tokens: end,
                causal: false,
                two_stream: false,
                soft: None,
                ends: None,
            }
        };
        let mut max_diff = 0f32;
        for r in 0..rows {
            let end = ends[r] as usize;
            let one: Vec<Vec<f32>> = model
                .forward(&alone(r).ids, false)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec2()
                .unwrap();
            for i in 0..end {
                for (a, c) in full[r][i].iter().zip(&one[i]) {
                    max_diff = max_diff.max((a - c).abs());
                }
            }
        }
        assert!(
            max_diff < 1e-4,
            "{format:?}: hidden rows differ from alone by {max_diff}"
        );
        let short = (0..rows).min_by_key(|&r| ends[r]).unwrap();
        let seen: f32 = (0..ends[short] as usize)
            .flat_map(|i| full[short][i].iter().zip(&opened[short][i]))
            .map(|(a, c)| (a - c).abs())
            .fold(0.0, f32::max);
        assert!(
            seen > 1e-3,
            "{format:?}: visible padding should change the short row"
        );
        // Gradients: batch loss (Σ over rows / B) against the rows' own losses / B.
        let vars = model.varmap.all_vars();
        let logits = model.forward_with(&b.ids, None, vis(&ends, t)).unwrap();
        let gb = weighted_ce(&logits, &b, shift).unwrap().backward().unwrap();
        let mut sum: Vec<Option<Tensor>> = vec![None; vars.len()];
        for r in 0..rows {
            let a = alone(r);
            let lg = model.forward(&a.ids, false).unwrap();
            let gr = (weighted_ce(&lg, &a, shift).unwrap() / rows as f64)
                .unwrap()
                .backward()
                .unwrap();
            for (k, v) in vars.iter().enumerate() {
                if let Some(x) = gr.get(v.as_tensor()) {
                    sum[k] = Some(match sum[k].take() {
                        Some(s) => (s + x).unwrap(),
                        None => x.clone(),
                    });
                }
            }
        }
        for (k, v) in vars.iter().enumerate() {
            let x = gb
                .get(v.as_tensor())
                .expect("every parameter gets a gradient");
            let y = sum[k].as_ref().expect("and alone too");
            let max_abs =
                |t: &Tensor| -> f32 { t.abs().unwrap().max_all().unwrap().to_scalar().unwrap() };
            let (d, m) = (max_abs(&(x - y).unwrap()), max_abs(x));
            assert!(
                d <= 1e-4 * m.max(1e-3),
                "{format:?}: gradient {k} differs by {d} (max {m})"
            );
        }
    }
}

/// Random EOS tails (`TaskData::eos_tail`): with hidden padding, diffusion training rows get
/// regions of answer + 1 + U(0..=max) EOS instead of the rounded one; the autoregressive
/// warm-up and batches without hidden padding keep the rounded layout.
#[test]
fn task_data_eos_tails() {
    use llada_train::trainer::{DataSource, TaskMix};
    let dev = Device::Cpu;
    let s = spec(Format::LLaDA);
    let data = |eos_tail, hide_padding, ar_warmup| TaskData {
        structured: 0.5,
        ar_warmup,
        pad_answers: 32,
        eos_tail,
        hide_padding,
        bands: false,
        mix: TaskMix::with_adaptive(0.0),
        ..TaskData::plain(vec!["sort"], 16, 9)
    };
    let eq = CharVocab::encode("=")[0];
    // Per row of one training batch: (clean prompt + answer, answer length, region length).
    let rows = |d: &mut TaskData, step: usize| -> Vec<(Vec<u32>, usize, usize)> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(step as u64);
        let b = d.batch(step, 0.5, &s, false, &mut rng, &dev).unwrap();
        // LLaDA: the targets are the clean rows.
        let clean: Vec<Vec<u32>> = b.targets.to_vec2().unwrap();
        let ends = b.ends.expect("hidden padding sets row ends");
        clean
            .iter()
            .zip(ends.iter())
            .map(|(row, &e)| {
                let start = row.iter().position(|&t| t == eq).unwrap() + 1;
                let answer = row[start..].iter().position(|&t| t == EOS).unwrap();
                assert!(row[start + answer..].iter().all(|&t| t == EOS));
                (row[..start + answer].to_vec(), answer, e as usize - start)
            })
            .collect()
    };
    // P = 1, MAX = 0: every region is exactly the answer and one EOS.
    let mut exact = data(Some((1.0, 0)), true, 0.0);
    for (_, answer, region) in rows(&mut exact, 1) {
        assert_eq!(region, answer + 1);
    }
    // P = 1, MAX = 64: regions of answer + 1..=65, varied, mostly not whole 32-token blocks.
    let mut tailed = data(Some((1.0, 64)), true, 0.0);
    let r: Vec<(Vec<u32>, usize, usize)> = (0..4).flat_map(|i| rows(&mut tailed, i)).collect();
    assert!(r.iter().all(|(_, a, g)| (a + 1..=a + 65).contains(g)));
    assert!(r.iter().filter(|x| x.2 % 32 != 0).count() > r.len() / 2);
    let tails: std::collections::HashSet<usize> = r.iter().map(|(_, a, g)| g - a).collect();
    assert!(tails.len() > 8, "{tails:?}");
    // No tails: every region is answer + 1 rounded up to 32, and the examples are the same.
    let mut plain = data(None, true, 0.0);
    for i in 0..4 {
        let p = rows(&mut plain, i);
        assert!(p.iter().all(|(_, a, g)| *g == (a + 1).next_multiple_of(32)));
        let t = rows(&mut tailed, i);
        assert!(p.iter().zip(&t).all(|(x, y)| x.0 == y.0));
    }
    // The warm-up's next-token rows and batches without hidden padding take no tails: with a
    // token budget, the same rows (count and width) as without the option.
    let shape = |eos_tail, hide, ar_warmup, progress| {
        let mut d = data(eos_tail, hide, ar_warmup);
        d.batch_tokens = 2048;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let b = d.batch(3, progress, &s, false, &mut rng, &dev).unwrap();
        (b.ids.dims2().unwrap(), b.causal, b.ends.is_some())
    };
    let warm = shape(Some((1.0, 64)), true, 0.5, 0.1);
    assert!(warm.1, "a warm-up batch");
    assert_eq!(warm, shape(None, true, 0.5, 0.1));
    let open = shape(Some((1.0, 64)), false, 0.0, 0.5);
    assert!(!open.2, "no row ends without hidden padding");
    assert_eq!(open, shape(None, false, 0.0, 0.5));
    // With hidden padding the tails widen the rows, and the budget takes fewer of them.
    let (tailed_dims, _, _) = shape(Some((1.0, 64)), true, 0.0, 0.5);
    let (plain_dims, _, _) = shape(None, true, 0.0, 0.5);
    assert!(tailed_dims.1 > plain_dims.1 && tailed_dims.0 <= plain_dims.0);
    assert!(tailed_dims.0 * tailed_dims.1 <= 2048 + tailed_dims.1 + 8 * tailed_dims.0);
}
