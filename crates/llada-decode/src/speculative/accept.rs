//! Lossless acceptance rules: the output equals what the target alone would produce.
//!
//! * greedy: accept a child iff it is the target's argmax at its parent;
//! * sampling, any deterministic tree shape: at each node draw `y ~ p_target(node)`; if `y` is a
//!   child, descend, else emit `y` and stop (exact for any tree whose shape does not depend on
//!   the draw);
//! * chain rejection sampling: accept the drafted `x ~ q` with probability `min(1, p(x)/q(x))`;
//!   on rejection emit a draw from the residual `norm(max(0, p − q))`; if every node is
//!   accepted, emit a draw from `p` at the last node.

use super::tree::DraftTree;
#[cfg(test)]
use crate::sampling::argmax;
use crate::sampling::Sampler;

/// What a verification accepted: the path of tree nodes and the target's own next token.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    pub path: Vec<usize>,
    pub bonus: u32,
}

/// Greedy acceptance. `choice(r)`: the target's greedy token at verify row `r` (0 = root,
/// `j + 1` = node `j`): the argmax of its logits, penalised for the row's history
/// ([`crate::SamplingParams::greedy_after`]).
pub fn greedy(tree: &DraftTree, choice: impl Fn(usize) -> u32) -> Accepted {
    let mut path = vec![];
    let mut node: Option<usize> = None;
    loop {
        let row = node.map_or(0, |n| n + 1);
        let y = choice(row);
        match tree.children(node).find(|&c| tree.tokens[c] == y) {
            Some(c) => {
                path.push(c);
                node = Some(c);
            }
            None => return Accepted { path, bonus: y },
        }
    }
}

/// Sampling with a deterministic tree shape. `dist(r)`: the target's sampling distribution at
/// row `r` (penalties for the row's history, temperature, top-k/top-p/min-p applied).
pub fn tree_sampling(
    tree: &DraftTree,
    dist: impl Fn(usize) -> Vec<f32>,
    sampler: &mut Sampler,
) -> Accepted {
    let mut path = vec![];
    let mut node: Option<usize> = None;
    loop {
        let row = node.map_or(0, |n| n + 1);
        let y = sampler.draw(&dist(row));
        match tree.children(node).find(|&c| tree.tokens[c] == y) {
            Some(c) => {
                path.push(c);
                node = Some(c);
            }
            None => return Accepted { path, bonus: y },
        }
    }
}

/// `norm(max(0, p − q))`; `p` itself when the residual vanishes (then p = q).
pub fn residual(p: &[f32], q: &[f32]) -> Vec<f32> {
    let mut r: Vec<f32> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
    let s: f32 = r.iter().sum();
    if s <= 0.0 {
        return p.to_vec();
    }
    r.iter_mut().for_each(|v| *v /= s);
    r
}

/// Chain rejection sampling. The tree must be a chain whose node `j` was drawn from the draft
/// distribution `q(j)`; `p(r)` is the target's distribution at verify row `r`.
pub fn chain_rejection(
    tree: &DraftTree,
    p: impl Fn(usize) -> Vec<f32>,
    q: impl Fn(usize) -> Vec<f32>,
    sampler: &mut Sampler,
) -> Accepted {
    let mut path = vec![];
    let mut node: Option<usize> = None;
    loop {
        let row = node.map_or(0, |n| n + 1);
        let pr = p(row);
        let Some(c) = tree.children(node).next() else {
            return Accepted {
                path,
                bonus: sampler.draw(&pr),
            };
        };
        let x = tree.tokens[c] as usize;
        let qc = q(c);
        let ratio = if qc[x] > 0.0 { pr[x] / qc[x] } else { 0.0 };
        if sampler.uniform() < ratio.min(1.0) {
            path.push(c);
            node = Some(c);
        } else {
            return Accepted {
                path,
                bonus: sampler.draw(&residual(&pr, &qc)),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SamplingParams;

    fn chain(tokens: &[u32], q: f32) -> DraftTree {
        let mut t = DraftTree::default();
        let mut parent = None;
        for &x in tokens {
            parent = Some(t.push(parent, x, q, q));
        }
        t
    }

    #[test]
    fn greedy_walks_the_matching_branch() {
        let mut t = DraftTree::default();
        let a = t.push(None, 1, 0.5, 0.5);
        let _b = t.push(None, 2, 0.5, 0.5);
        let _c = t.push(Some(a), 0, 0.5, 0.5);
        // root argmax 1 (→ a), a's argmax 2 (no such child) → emit 2.
        let rows: Vec<Vec<f32>> = vec![
            vec![0.0, 5.0, 1.0],
            vec![0.0, 1.0, 5.0],
            vec![1.0, 0.0, 0.0],
            vec![1.0, 0.0, 0.0],
        ];
        let acc = greedy(&t, |r| argmax(&rows[r]));
        assert_eq!(
            acc,
            Accepted {
                path: vec![0],
                bonus: 2
            }
        );
    }

    #[test]
    fn residual_distribution() {
        let r = residual(&[0.5, 0.3, 0.2], &[0.2, 0.6, 0.2]);
        assert!((r[0] - 1.0).abs() < 1e-6 && r[1] == 0.0 && r[2] == 0.0);
        assert_eq!(residual(&[0.5, 0.5], &[0.5, 0.5]), vec![0.5, 0.5]);
    }

    /// Chi-square of counts against expected probabilities; `df` = categories − 1.
    fn chi2(counts: &[usize], p: &[f32]) -> f64 {
        let n: usize = counts.iter().sum();
        counts
            .iter()
            .zip(p)
            .filter(|(_, &pi)| pi > 0.0)
            .map(|(&c, &pi)| {
                let e = n as f64 * pi as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum()
    }

    #[test]
    fn both_sampling_rules_reproduce_the_target_distribution() {
        // Target p and draft q over 4 tokens at the root and at depth 1 (same for simplicity).
        let p = vec![0.1f32, 0.4, 0.3, 0.2];
        let q = vec![0.4f32, 0.1, 0.1, 0.4];
        let n = 40_000;
        let mut first = [vec![0usize; 4], vec![0usize; 4]];
        let mut second = [vec![0usize; 4], vec![0usize; 4]];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            seed: 7,
            ..Default::default()
        });
        for _ in 0..n {
            // Chain of 2 drafted from q.
            let x0 = s.draw(&q);
            let x1 = s.draw(&q);
            let t = chain(&[x0, x1], 0.5);
            for (k, acc) in [
                chain_rejection(&t, |_| p.clone(), |_| q.clone(), &mut s),
                tree_sampling(&t, |_| p.clone(), &mut s),
            ]
            .into_iter()
            .enumerate()
            {
                let emitted: Vec<u32> = acc
                    .path
                    .iter()
                    .map(|&j| t.tokens[j])
                    .chain([acc.bonus])
                    .collect();
                first[k][emitted[0] as usize] += 1;
                if emitted.len() > 1 {
                    second[k][emitted[1] as usize] += 1;
                }
            }
        }
        // df = 3: the 99.9% quantile is 16.27.
        for k in 0..2 {
            assert!(
                chi2(&first[k], &p) < 16.27,
                "rule {k}: first token {:?}",
                first[k]
            );
            assert!(
                chi2(&second[k], &p) < 16.27,
                "rule {k}: second token {:?}",
                second[k]
            );
        }
    }
}
