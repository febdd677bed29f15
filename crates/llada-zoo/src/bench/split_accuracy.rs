//! Accuracy as users meet it, for `llada bench diffusion`: each strategy's exact match on the
//! whole held-out `eval` split of a task model ([`llada_train::tasks::held_out_tasks`]), in
//! each answer layout — `auto` (the answer plus one EOS, rounded up to whole blocks) and fixed
//! regions such as 64 (a user's `--gen-length 64`: the model must end the answer itself).
//!
//! A fixed region holds only the tasks whose longest answer fits with its EOS (64: sums,
//! sorts, reversals and running sums; the 139-character five-question rows do not), and draws
//! more examples of each so that every layout scores at least as many examples as `auto`.

use crate::error::{msg, Result};
use crate::eval::{decode_examples, AnswerRegion, Layout, Split, TaskEval};
use crate::progress::Progress;
use llada_decode::diffusion::DiffusionConfig;
use llada_decode::strategy::DiffusionLanes;
use llada_model::Model;
use llada_train::tasks::{longest_answer, Example, Score, TASKS};
use serde::Serialize;

/// One strategy's accuracy on the eval split in one layout.
#[derive(Serialize, Clone, Debug)]
pub struct SplitAccuracy {
    pub model: String,
    pub strategy: String,
    /// `auto` or the fixed region's length.
    pub region: String,
    pub examples: usize,
    pub accuracy: f64,
    pub char_accuracy: f64,
    /// Answer positions per second of decoding over the split (one pass, not interleaved).
    pub tokens_per_s: f64,
}

/// The tasks a layout scores and the eval-split examples of each: `auto` all tasks with
/// `per_task` each; a fixed region the tasks that fit it, with ⌈`per_task` · 5 / fitting⌉
/// each (64: four tasks of 63, 252 examples against `auto`'s 250).
pub fn layout_examples(
    region: AnswerRegion,
    block: usize,
    per_task: usize,
) -> Result<Vec<Example>> {
    layout_examples_in(Split::Eval, region, block, per_task)
}

/// [`layout_examples`] from `split`.
pub fn layout_examples_in(
    split: Split,
    region: AnswerRegion,
    block: usize,
    per_task: usize,
) -> Result<Vec<Example>> {
    let fits = |t: &&str| {
        let need = longest_answer(t) + 1;
        need <= region.length(need, block)
    };
    let tasks: Vec<&'static str> = TASKS.iter().copied().filter(fits).collect();
    if tasks.is_empty() {
        return Err(msg(format!(
            "answer region {} holds no task's longest answer",
            region.label(block)
        )));
    }
    let n = (per_task * TASKS.len()).div_ceil(tasks.len());
    Ok(split.examples(n, &tasks, 1.0)?)
}

/// Decode `examples` in `region` with the strategy `name` (`cfg_for(region length)`), on
/// `threads` threads.
#[allow(clippy::too_many_arguments)]
pub fn split_accuracy(
    model: &Model,
    model_name: &str,
    name: &str,
    cfg_for: &dyn Fn(usize) -> Result<DiffusionConfig>,
    examples: &[Example],
    layout: Layout,
    threads: usize,
    progress: &dyn Progress,
) -> Result<SplitAccuracy> {
    let lanes = DiffusionLanes::new(threads, &cfg_for(layout.block)?, name == "full-sparse-pool")?;
    let r = decode_examples(model, &lanes, examples, layout, cfg_for, 0, progress)?;
    Ok(SplitAccuracy::of(&r, model_name, name, layout))
}

impl SplitAccuracy {
    /// The record of evaluation `r` of strategy `name` on `model` in `layout`.
    pub fn of(r: &TaskEval, model: &str, name: &str, layout: Layout) -> Self {
        let all = r.scores.values().fold(Score::default(), |a, s| a.merge(*s));
        Self {
            model: model.to_string(),
            strategy: name.to_string(),
            region: layout.region.label(layout.block),
            examples: r.examples,
            accuracy: all.exact_rate().unwrap_or(0.0),
            char_accuracy: all.char_rate().unwrap_or(0.0),
            tokens_per_s: r.tokens_per_s(),
        }
    }
}

/// The worst (lowest) `strategy − base` difference in points over every (model, layout) both
/// were scored in, by `metric`; `None` when no pair was.
pub fn worst_delta(
    acc: &[SplitAccuracy],
    strategy: &str,
    base: &str,
    metric: fn(&SplitAccuracy) -> f64,
) -> Option<f64> {
    acc.iter()
        .filter(|a| a.strategy == strategy)
        .filter_map(|a| {
            let b = acc
                .iter()
                .find(|b| b.strategy == base && b.model == a.model && b.region == a.region)?;
            Some(100.0 * (metric(a) - metric(b)))
        })
        .reduce(f64::min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_score_at_least_the_auto_count() {
        let auto = layout_examples(AnswerRegion::Auto, 32, 3).unwrap();
        assert_eq!(auto.len(), 15);
        let fixed = layout_examples(AnswerRegion::Fixed(64), 32, 3).unwrap();
        // Four tasks fit 64 (not the 139-character rows): ⌈15 / 4⌉ = 4 each.
        assert_eq!(fixed.len(), 16);
        assert!(fixed
            .iter()
            .all(|e| e.task != "multi" && e.answer.len() < 64));
        assert!(layout_examples(AnswerRegion::Fixed(8), 8, 3).is_err());
        // The whole split: 250 in auto, 252 in 64.
        assert_eq!(
            layout_examples(AnswerRegion::Fixed(64), 32, 50)
                .unwrap()
                .len(),
            252
        );
    }

    #[test]
    fn the_delta_is_the_worst_pair() {
        let a = |s: &str, m: &str, r: &str, acc: f64| SplitAccuracy {
            model: m.into(),
            strategy: s.into(),
            region: r.into(),
            examples: 1,
            accuracy: acc,
            char_accuracy: 1.0,
            tokens_per_s: 1.0,
        };
        let v = vec![
            a("vanilla", "x", "auto", 0.99),
            a("full", "x", "auto", 1.0),
            a("vanilla", "y", "64", 0.98),
            a("full", "y", "64", 0.95),
            a("full", "z", "64", 0.10),
        ];
        let d = worst_delta(&v, "full", "vanilla", |s| s.accuracy).unwrap();
        assert!((d + 3.0).abs() < 1e-9, "{d}");
        assert_eq!(worst_delta(&v, "prefix", "vanilla", |s| s.accuracy), None);
    }
}
