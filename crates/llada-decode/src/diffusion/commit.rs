//! Commit selection: each masked target's token and confidence, how many commit per step
//! (LLaDA's and Dream's schedules, or a confidence threshold), and which.

use super::{Confidence, DiffusionConfig, Schedule};
use crate::sampling::{argmax, softmax};
use llada_model::ForwardOutput;
use rand::rngs::StdRng;
use rand::Rng;

/// LLaDA's `get_num_transfer_tokens`: how many tokens each of `steps` steps commits.
pub fn transfer_schedule(masked: usize, steps: usize) -> Vec<usize> {
    let base = masked / steps;
    let rem = masked % steps;
    (0..steps).map(|i| base + usize::from(i < rem)).collect()
}

/// Dream's per-step count: `int(masked · (1 − s/t))` with `t, s` from `linspace(1, eps, steps+1)`
/// in f32, everything left at the last step.
pub fn dream_transfer(masked: usize, step: usize, steps: usize, eps: f32) -> usize {
    if step + 1 >= steps {
        return masked;
    }
    let ts = |i: usize| -> f32 { 1.0 + (eps - 1.0) * (i as f32 / steps as f32) };
    let (t, s) = (ts(step), ts(step + 1));
    (masked as f32 * (1.0 - s / t)) as usize
}

/// Confidence and token for one position's logits (temperature 0: argmax).
fn score(logits: &[f32], conf: Confidence, tok: u32, rng: &mut StdRng) -> f32 {
    match conf {
        Confidence::Random => rng.random::<f32>(),
        c => {
            let mut p = logits.to_vec();
            softmax(&mut p);
            match c {
                Confidence::TopProb => p[tok as usize],
                Confidence::Margin => {
                    let mut top2 = f32::NEG_INFINITY;
                    for (i, v) in p.iter().enumerate() {
                        if i != tok as usize && *v > top2 {
                            top2 = *v;
                        }
                    }
                    p[tok as usize] - top2
                }
                _ => p.iter().map(|v| v * (v + 1e-10).ln()).sum(),
            }
        }
    }
}

/// One masked position's prediction.
#[derive(Debug, Clone, Copy)]
pub(super) struct Candidate {
    pub confidence: f32,
    /// Absolute position.
    pub pos: usize,
    pub token: u32,
}

/// The prediction for each of `targets` (absolute positions; `out`'s rows in the same order).
/// Per target, in target order, the RNG draws the Gumbel noise (temperature > 0), then the
/// confidence's (`Random`).
pub(super) fn predict(
    out: &ForwardOutput,
    targets: &[usize],
    cfg: &DiffusionConfig,
    rng: &mut StdRng,
) -> Vec<Candidate> {
    let mut cand = Vec::with_capacity(targets.len());
    for (j, &pos) in targets.iter().enumerate() {
        let logits = out.row(j);
        let token = choose_token(logits, cfg.temperature, rng);
        let confidence = score(logits, cfg.confidence, token, rng);
        cand.push(Candidate {
            confidence,
            pos,
            token,
        });
    }
    cand
}

/// Argmax, or at a positive temperature Gumbel-max sampling, as LLaDA's add_gumbel_noise.
fn choose_token(logits: &[f32], temperature: f32, rng: &mut StdRng) -> u32 {
    if temperature > 0.0 {
        let noisy: Vec<f32> = logits
            .iter()
            .map(|&v| {
                let u: f64 = rng.random::<f64>().max(1e-20);
                (v as f64 / temperature as f64 - (-(u.ln())).ln()) as f32
            })
            .collect();
        argmax(&noisy)
    } else {
        argmax(logits)
    }
}

/// Where one step stands in its block's schedule.
pub(super) struct StepInBlock<'a> {
    /// Steps taken in this block so far.
    pub step: usize,
    pub steps_per_block: usize,
    /// LLaDA's per-step counts for this block ([`transfer_schedule`]).
    pub plan: &'a [usize],
    /// The current block's end (absolute): candidates past it are speculative.
    pub block_end: usize,
}

/// The candidates that commit, each with whether it is speculative: the current block by
/// schedule or threshold, future blocks (multi-block speculation) by threshold only
/// (`cfg.threshold`, else 0.9). With `alg_temp` the RNG draws which of the block commit.
pub(super) fn select(
    cand: Vec<Candidate>,
    at: &StepInBlock,
    cfg: &DiffusionConfig,
    rng: &mut StdRng,
) -> Vec<(Candidate, bool)> {
    let (mut now, future): (Vec<_>, Vec<_>) = cand.into_iter().partition(|c| c.pos < at.block_end);
    // Highest confidence first; ties to the leftmost position.
    now.sort_by(|a, b| {
        b.confidence
            .total_cmp(&a.confidence)
            .then(a.pos.cmp(&b.pos))
    });
    let k = commit_count(&now, at, cfg);
    if cfg.alg_temp > 0.0 && cfg.threshold.is_none() && k < now.len() {
        // Dream's alg_temp: which positions commit is sampled, not the top k.
        let conf: Vec<f32> = now.iter().map(|c| c.confidence).collect();
        let pick = sample_transfer(&conf, k, cfg.alg_temp, rng);
        now = pick.iter().map(|&j| now[j]).collect();
    }
    let spec_threshold = cfg.threshold.unwrap_or(0.9);
    now.into_iter()
        .take(k)
        .map(|c| (c, false))
        .chain(
            future
                .into_iter()
                .filter(|c| c.confidence >= spec_threshold)
                .map(|c| (c, true)),
        )
        .collect()
}

/// How many of the current block's candidates (`now`, by confidence) commit this step.
fn commit_count(now: &[Candidate], at: &StepInBlock, cfg: &DiffusionConfig) -> usize {
    match (cfg.threshold, cfg.schedule) {
        (Some(th), _) => now.iter().filter(|c| c.confidence >= th).count().max(1),
        _ if at.step >= at.steps_per_block => now.len(),
        (None, Schedule::Uniform) => at.plan[at.step],
        (None, Schedule::Timesteps { eps }) => {
            dream_transfer(now.len(), at.step, at.steps_per_block, eps)
        }
    }
}

/// `k` distinct indices of `conf` drawn without replacement with probabilities
/// `softmax(conf / alg_temp)` (renormalised over what is left after each draw), as Dream's
/// `torch.multinomial(softmax(confidence / alg_temp), k)`. Confidences of −∞ are never drawn
/// while a finite one is left.
pub fn sample_transfer(conf: &[f32], k: usize, alg_temp: f32, rng: &mut impl Rng) -> Vec<usize> {
    let mx = conf
        .iter()
        .copied()
        .filter(|c| c.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let mut w: Vec<f64> = conf
        .iter()
        .map(|&c| {
            if c.is_finite() {
                (((c - mx) / alg_temp) as f64).exp()
            } else {
                0.0
            }
        })
        .collect();
    let mut out = Vec::with_capacity(k.min(conf.len()));
    while out.len() < k.min(conf.len()) {
        let total: f64 = w.iter().sum();
        let j = if total > 0.0 {
            let mut u = rng.random::<f64>() * total;
            let mut pick = None;
            for (j, &wj) in w.iter().enumerate() {
                if wj > 0.0 {
                    pick = Some(j);
                    if u < wj {
                        break;
                    }
                    u -= wj;
                }
            }
            pick
        } else {
            // Only −∞ (or underflowed) weights left: the leftmost not yet drawn.
            (0..conf.len()).find(|j| !out.contains(j))
        };
        let Some(j) = j else { break };
        w[j] = 0.0;
        out.push(j);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Draw frequencies against the analytic probabilities: the first draw follows
    /// softmax(conf / T); a pair's draw follows the without-replacement product.
    #[test]
    fn alg_temp_draws_follow_the_softmax() {
        let conf = [0.9f32, 0.5, 0.2, f32::NEG_INFINITY];
        let t = 0.25f32;
        let e: Vec<f64> = conf[..3]
            .iter()
            .map(|&c| ((c as f64) / t as f64).exp())
            .collect();
        let z: f64 = e.iter().sum();
        let mut rng = StdRng::seed_from_u64(7);
        let n = 40_000;
        let (mut first, mut pair01) = ([0usize; 4], 0usize);
        for _ in 0..n {
            let d = sample_transfer(&conf, 2, t, &mut rng);
            assert_eq!(d.len(), 2);
            assert_ne!(d[0], d[1]);
            assert!(!d.contains(&3), "a −∞ confidence was drawn");
            first[d[0]] += 1;
            pair01 += usize::from(d == [0, 1]);
        }
        for j in 0..3 {
            let p = e[j] / z;
            let f = first[j] as f64 / n as f64;
            // 5 standard errors.
            assert!(
                (f - p).abs() < 5.0 * (p * (1.0 - p) / n as f64).sqrt(),
                "{j}: {f} vs {p}"
            );
        }
        let p01 = e[0] / z * e[1] / (z - e[0]);
        let f01 = pair01 as f64 / n as f64;
        assert!((f01 - p01).abs() < 5.0 * (p01 * (1.0 - p01) / n as f64).sqrt());
        // Only −∞ left: still k distinct indices.
        assert_eq!(
            sample_transfer(&[f32::NEG_INFINITY; 3], 2, 1.0, &mut rng),
            vec![0, 1]
        );
        // A tiny temperature is top-k.
        assert_eq!(sample_transfer(&conf, 2, 1e-4, &mut rng), vec![0, 1]);
    }

    #[test]
    fn schedule_matches_llada() {
        assert_eq!(transfer_schedule(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(transfer_schedule(32, 32), vec![1; 32]);
        assert_eq!(transfer_schedule(5, 8), vec![1, 1, 1, 1, 1, 0, 0, 0]);
        assert_eq!(transfer_schedule(10, 4).iter().sum::<usize>(), 10);
    }
}
