//! The diffusion benchmark's measurements (`llada bench diffusion`): the named strategies and
//! ablations as decoder configurations, the long-answer and prose prompts they decode, every
//! strategy on every prompt in interleaved passes (so ratios are meaningful on a noisy
//! machine), and the window sweep — the time of one forward pass versus window tokens over a
//! cached prefix — that shows which window size pays on the device.

use crate::error::{bail, Context, Result};
use crate::progress::Progress;
use llada_decode::diffusion::{CacheMode, DiffusionConfig, MultiBlock, Revision};
use llada_decode::strategy::DiffusionLanes;
use llada_model::{AttnMask, ForwardRequest, KvWrite, LogitRows, Model};
use llada_runtime::Lane;
use llada_train::tasks::{held_out_subset, Example, Score};
use llada_train::vocab::{CharVocab, BOS};
use serde::Serialize;
use std::time::Instant;

/// The strategies and ablations, in report order.
pub const STRATEGIES: [&str; 9] = [
    "vanilla",
    "prefix",
    "dual+threshold",
    "multi-block",
    "full",
    "full-one-lane",
    "full-sparse-pool",
    "full-refresh",
    "revision-only",
];

/// The settings every strategy of the benchmark shares (`llada bench diffusion`'s options).
#[derive(Clone, Copy, Debug)]
pub struct StrategySettings {
    pub block_length: usize,
    /// Confidence threshold of the parallel strategies.
    pub threshold: f32,
    /// Multi-block execution window and lookahead.
    pub window: usize,
    pub lookahead: usize,
    /// Revision: a commit at this confidence or more becomes stable without a probe.
    pub stable_on_commit: Option<f32>,
    pub max_probes: u8,
}

/// The decoder configuration of the strategy `name` (of [`STRATEGIES`], optionally with a
/// `+everyN` suffix) for answers of `gen` tokens.
pub fn strategy(name: &str, a: &StrategySettings, gen: usize) -> Result<DiffusionConfig> {
    let mut c = DiffusionConfig::one_per_step(gen, a.block_length);
    // `NAME+everyN`: NAME with an interval refresh of its cache every N steps.
    let name = match name.rsplit_once("+every") {
        Some((base, n)) => {
            c.refresh_every = n
                .parse()
                .ok()
                .filter(|&n: &usize| n > 0)
                .with_context(|| format!("'{name}': expected +everyN with N ≥ 1"))?;
            base
        }
        None => name,
    };
    let mb = MultiBlock {
        window: a.window,
        lookahead: a.lookahead,
    };
    match name {
        "vanilla" => {}
        "prefix" => c.cache = CacheMode::Prefix,
        "dual+threshold" => {
            c.cache = CacheMode::Dual;
            c.threshold = Some(a.threshold);
        }
        "multi-block" => {
            c.cache = CacheMode::Dual;
            c.threshold = Some(a.threshold);
            c.multi_block = Some(mb);
        }
        // `full-one-lane`: the same decoder with the sparse pass run after the dense pass on
        // the dense lane's threads — what the concurrent lanes cost or save on these cores;
        // `full-sparse-pool`: the sparse lane on a one-thread pool of its own;
        // `full-refresh`: the whole prefix recomputed at each block start (Fast-dLLM's
        // refresh), what it costs and buys against full's appended prefix.
        "full" | "full-one-lane" | "full-sparse-pool" | "full-refresh" => {
            c.refresh_prefix = name == "full-refresh";
            c.cache = CacheMode::Dual;
            c.threshold = Some(a.threshold);
            c.multi_block = Some(mb);
            c.revision = Some(Revision {
                concurrent: name != "full-one-lane",
                stable_on_commit: a.stable_on_commit,
                max_probes: a.max_probes,
                ..Revision::default()
            });
        }
        "revision-only" => {
            c.cache = CacheMode::Dual;
            c.threshold = Some(a.threshold);
            c.revision = Some(Revision {
                stable_on_commit: a.stable_on_commit,
                max_probes: a.max_probes,
                ..Revision::default()
            });
        }
        other => bail!("unknown strategy '{other}' ({})", STRATEGIES.join(", ")),
    }
    c.validate().map_err(crate::error::msg)?;
    Ok(c)
}

/// One (strategy, model) record.
#[derive(Serialize, Clone, Debug)]
pub struct Run {
    pub strategy: String,
    pub model: String,
    pub gen_length: usize,
    pub samples: usize,
    /// End-to-end latency per sample: the median over passes of the per-pass mean.
    pub latency_s: f64,
    /// Mean latency per sample in each interleaved pass (`--repeats`).
    pub latency_passes_s: Vec<f64>,
    pub tokens_per_s: f64,
    /// Mean dense forward passes per sample.
    pub forwards: f64,
    pub tokens_per_forward: f64,
    pub padded_rows: usize,
    pub revised: usize,
    pub sparse_rows: usize,
    /// Fraction of the sparse lane's time that overlapped the dense lane.
    pub lane_overlap: Option<f64>,
    pub accuracy: Option<f64>,
    /// Characters in place over the long answers (`tasks::char_score`): finer than exact match.
    pub char_accuracy: Option<f64>,
}

/// One window of the sweep: the time of one forward pass over it.
#[derive(Serialize, Clone, Debug)]
pub struct SweepPoint {
    pub model: String,
    pub window: usize,
    pub ms: f64,
    pub ms_per_token: f64,
}

/// The tasks with long answers (single sums and running sums stop at 11 and 16 digits):
/// sorts of 24–32 digits (47–63 characters) and five-question answers (139).
pub const LONG_TASKS: [&str; 2] = ["sort", "multi"];

/// Long-answer held-out examples that fit `gen` (answer + at least one EOS).
pub fn long_examples(n: usize, min: usize, gen: usize) -> Vec<Example> {
    let pool = held_out_subset(4 * n + 16, &LONG_TASKS, 1.0);
    let mut by_task: Vec<Vec<Example>> = vec![vec![]; LONG_TASKS.len()];
    for e in pool {
        if e.answer.len() >= min && e.answer.len() < gen {
            let k = LONG_TASKS.iter().position(|t| *t == e.task).unwrap_or(0);
            by_task[k].push(e);
        }
    }
    // Round-robin over tasks so every task is represented.
    let mut out = vec![];
    let mut i = 0;
    while out.len() < n && by_task.iter().any(|v| i < v.len()) {
        for v in &by_task {
            if let Some(e) = v.get(i) {
                if out.len() < n {
                    out.push(e.clone());
                }
            }
        }
        i += 1;
    }
    out
}

/// Prompt ids and, for task models, the expected answer.
pub type Prompt = (Vec<u32>, Option<String>);

pub const PROSE_PROMPTS: [&str; 4] = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune,",
    "And God said unto Moses, Go in unto Pharaoh, and tell him,",
    "Elizabeth walked on, thinking of what her sister had said about",
    "Blessed are they that mourn: for they shall be comforted. Blessed are",
];

/// What one strategy accumulates over the interleaved passes of a model's prompts.
struct Tally {
    name: String,
    cfg: DiffusionConfig,
    lanes: DiffusionLanes,
    /// Summed latency of each pass over the prompts.
    pass_s: Vec<f64>,
    fw: usize,
    pad: usize,
    rev: usize,
    srows: usize,
    sparse_s: f64,
    overlap_s: f64,
    score: Score,
}

/// Every strategy on every prompt, `repeats` times, interleaved: within a pass each prompt is
/// decoded by each strategy in turn, so a slow stretch of this noisy machine hits all of them
/// alike. Counts and accuracy come from the first pass (decoding is deterministic); latency is
/// the median over passes of the per-pass mean.
pub fn run_interleaved(
    model: &Model,
    strategies: &[(String, DiffusionConfig)],
    prompts: &[Prompt],
    repeats: usize,
    threads: usize,
    model_name: &str,
    progress: &dyn Progress,
) -> Result<Vec<Run>> {
    let mut tallies = strategies
        .iter()
        .map(|(name, cfg)| {
            Ok(Tally {
                name: name.clone(),
                cfg: cfg.clone(),
                lanes: DiffusionLanes::new(threads, cfg, name == "full-sparse-pool")?,
                pass_s: vec![0.0; repeats.max(1)],
                fw: 0,
                pad: 0,
                rev: 0,
                srows: 0,
                sparse_s: 0.0,
                overlap_s: 0.0,
                score: Score::default(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    for rep in 0..repeats.max(1) {
        for (p, want) in prompts {
            for t in tallies.iter_mut() {
                progress.status(&format!("{model_name}: pass {} · {}", rep + 1, t.name));
                let clock = Instant::now();
                let out = t.lanes.generate(model, p, &t.cfg, None)?;
                t.pass_s[rep] += clock.elapsed().as_secs_f64();
                if rep == 0 {
                    t.fw += out.forward_passes;
                    t.pad += out.padded_rows;
                    t.rev += out.revised;
                    t.srows += out.sparse_rows;
                    t.sparse_s += out.sparse_s;
                    t.overlap_s += out.overlap_s;
                    if let Some(w) = want {
                        t.score.add(w, &CharVocab::decode(&out.tokens));
                    }
                }
            }
            progress.inc(1);
        }
    }
    let n = prompts.len().max(1) as f64;
    Ok(tallies
        .into_iter()
        .map(|t| {
            let per_pass: Vec<f64> = t.pass_s.iter().map(|s| s / n).collect();
            let lat = median(&per_pass);
            let gen = t.cfg.gen_length as f64;
            Run {
                strategy: t.name,
                model: model_name.to_string(),
                gen_length: t.cfg.gen_length,
                samples: prompts.len(),
                latency_s: lat,
                latency_passes_s: per_pass,
                tokens_per_s: gen / lat.max(1e-12),
                forwards: t.fw as f64 / n,
                tokens_per_forward: gen * n / (t.fw.max(1) as f64),
                padded_rows: t.pad,
                revised: t.rev,
                sparse_rows: t.srows,
                lane_overlap: (t.sparse_s > 0.0).then(|| t.overlap_s / t.sparse_s),
                accuracy: t.score.exact_rate(),
                char_accuracy: t.score.char_rate(),
            }
        })
        .collect())
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        k if k % 2 == 1 => s[k / 2],
        k => 0.5 * (s[k / 2 - 1] + s[k / 2]),
    }
}

/// Speed-up of `fast` over `base`: the median over passes of the per-pass latency ratio (both
/// strategies decoded the same prompts, interleaved, in each pass).
pub fn paired_speedup(base: &Run, fast: &Run) -> Option<f64> {
    let r: Vec<f64> = base
        .latency_passes_s
        .iter()
        .zip(&fast.latency_passes_s)
        .filter(|(_, f)| **f > 0.0)
        .map(|(b, f)| b / f)
        .collect();
    (!r.is_empty()).then(|| median(&r))
}

/// Time of one forward pass of `w` window rows over a cached prefix of `prefix` rows.
pub fn sweep_model(
    model: &Model,
    lane: &Lane,
    windows: &[usize],
    prefix: usize,
    name: &str,
    reps: usize,
) -> Result<Vec<SweepPoint>> {
    let mask = model.config.mask_id.unwrap_or(0);
    let mut cache = model.new_cache();
    let max_w = windows.iter().copied().max().unwrap_or(8);
    if prefix + max_w > model.config.max_ctx {
        bail!(
            "{name}: prefix {prefix} + window {max_w} exceeds the context {}",
            model.config.max_ctx
        );
    }
    let toks: Vec<u32> = (0..prefix as u32)
        .map(|i| 3 + i % (model.config.vocab as u32 - 3).max(1))
        .collect();
    let pos: Vec<u32> = (0..prefix as u32).collect();
    lane.run(|| {
        model.forward(
            &ForwardRequest {
                tokens: &toks,
                positions: &pos,
                mask: AttnMask::Bidirectional,
                kv_write: KvWrite::Append,
                logits: LogitRows::None,
            },
            &mut cache,
        )
    })?;
    let mut out = vec![];
    for &w in windows {
        let toks = vec![mask; w];
        let pos: Vec<u32> = (prefix as u32..(prefix + w) as u32).collect();
        let mut times = vec![];
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            lane.run(|| {
                model.forward(
                    &ForwardRequest {
                        tokens: &toks,
                        positions: &pos,
                        mask: AttnMask::Bidirectional,
                        kv_write: KvWrite::None,
                        logits: LogitRows::All,
                    },
                    &mut cache,
                )
            })?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let ms = median(&times);
        out.push(SweepPoint {
            model: name.to_string(),
            window: w,
            ms,
            ms_per_token: ms / w as f64,
        });
    }
    Ok(out)
}

/// The prompts a benchmarked model decodes and the answer length: for a task model (its
/// character vocabulary), `examples` long-answer held-out examples (answers of `min_answer`
/// characters or more) in answers of `gen_length`; for a prose model the first
/// `prose_prompts` of [`PROSE_PROMPTS`] in answers of `prose_gen_length`.
pub fn prompts_for(
    model: &Model,
    examples: usize,
    min_answer: usize,
    gen_length: usize,
    prose_gen_length: usize,
    prose_prompts: usize,
) -> Result<(usize, Vec<Prompt>)> {
    if model.config.vocab == CharVocab::size() {
        let ex = long_examples(examples, min_answer, gen_length);
        if ex.is_empty() {
            bail!(
                "no held-out example has an answer of {} to {} characters",
                min_answer,
                gen_length
            );
        }
        return Ok((
            gen_length,
            ex.iter()
                .map(|e| {
                    let mut p = vec![BOS];
                    p.extend(CharVocab::encode(&e.prompt));
                    (p, Some(e.answer.clone()))
                })
                .collect(),
        ));
    }
    let tok = model
        .tokenizer
        .as_ref()
        .context("a prose model needs its tokenizer")?;
    let mut ps = vec![];
    for text in PROSE_PROMPTS.iter().take(prose_prompts.max(1)) {
        let mut ids = tok.encode(text).map_err(crate::error::msg)?;
        if let Some(b) = model.config.bos_id {
            ids.insert(0, b);
        }
        ps.push((ids, None));
    }
    Ok((prose_gen_length, ps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_suffix_sets_the_refresh_interval() {
        // `llada bench diffusion`'s defaults.
        let a = StrategySettings {
            block_length: 32,
            threshold: 0.9,
            window: 8,
            lookahead: 8,
            stable_on_commit: Some(0.99),
            max_probes: Revision::default().max_probes,
        };
        let c = strategy("revision-only+every2", &a, 64).unwrap();
        assert_eq!(c.refresh_every, 2);
        assert!(c.revision.is_some() && c.cache == CacheMode::Dual);
        assert_eq!(strategy("revision-only", &a, 64).unwrap().refresh_every, 0);
        assert!(
            strategy("full-refresh+every4", &a, 64)
                .unwrap()
                .refresh_prefix
        );
        for bad in [
            "full+every0",
            "full+everyx",
            "vanilla+every2",
            "nope+every2",
        ] {
            assert!(strategy(bad, &a, 64).is_err(), "{bad}");
        }
    }
}
