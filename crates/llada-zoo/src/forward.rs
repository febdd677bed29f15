//! One causal forward over a window and what is read off its rows: the logits, the argmax and
//! the renormalised top k of every position (shared by labelling, evaluation and training).

use crate::error::Result;
use llada_model::Model;
use llada_runtime::Lane;

/// Logits of every row of one causal forward over `tokens` (a fresh cache, nothing kept).
pub fn causal_logits(m: &Model, lane: &Lane, tokens: &[u32]) -> Result<llada_model::ForwardOutput> {
    use llada_model::{AttnMask, ForwardRequest, KvWrite, LogitRows};
    let pos: Vec<u32> = (0..tokens.len() as u32).collect();
    let mut cache = m.new_cache();
    Ok(lane.run(|| {
        m.forward(
            &ForwardRequest {
                tokens,
                positions: &pos,
                mask: AttnMask::Causal,
                kv_write: KvWrite::None,
                logits: LogitRows::All,
            },
            &mut cache,
        )
    })?)
}

/// Argmax of each row of a forward over `tokens` (causal), one per position.
pub fn causal_argmax(m: &Model, lane: &Lane, tokens: &[u32]) -> Result<Vec<u32>> {
    let out = causal_logits(m, lane, tokens)?;
    Ok(argmax_rows(&out, tokens.len()))
}

/// Argmax of each of the first `rows` rows of a forward's logits.
pub fn argmax_rows(out: &llada_model::ForwardOutput, rows: usize) -> Vec<u32> {
    (0..rows)
        .map(|i| llada_decode::sampling::argmax(out.row(i)))
        .collect()
}

/// The `k` largest entries of the softmax of every row of one causal forward over `tokens`,
/// renormalised over those `k`, most likely first: `(ids, probabilities)`, `tokens.len()·k`
/// each.
pub fn causal_top_k(
    m: &Model,
    lane: &Lane,
    tokens: &[u32],
    k: usize,
) -> Result<(Vec<u32>, Vec<f32>)> {
    let out = causal_logits(m, lane, tokens)?;
    Ok(top_k_rows(&out, tokens.len(), k))
}

/// [`top_k_softmax`] of the first `rows` rows of a forward's logits, concatenated.
pub fn top_k_rows(out: &llada_model::ForwardOutput, rows: usize, k: usize) -> (Vec<u32>, Vec<f32>) {
    let (mut ids, mut probs) = (Vec::new(), Vec::new());
    for i in 0..rows {
        let (c, p) = top_k_softmax(out.row(i), k);
        ids.extend(c);
        probs.extend(p);
    }
    (ids, probs)
}

/// The `k` most likely classes of `softmax(logits)` (ties: lower id first), probabilities
/// renormalised over them. Fewer than `k` logits: all of them.
pub fn top_k_softmax(logits: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let k = k.min(idx.len());
    if k < idx.len() {
        idx.select_nth_unstable_by(k, by_logit);
        idx.truncate(k);
    }
    idx.sort_by(by_logit);
    let max = idx.first().map_or(0.0, |&i| logits[i as usize]);
    let e: Vec<f32> = idx
        .iter()
        .map(|&i| (logits[i as usize] - max).exp())
        .collect();
    let z: f32 = e.iter().sum();
    (idx, e.into_iter().map(|v| v / z).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Top-k of a softmax against values worked by hand: logits ln 4, ln 2, ln 1, ln 1 (softmax
    /// 0.5, 0.25, 0.125, 0.125); the top 3 renormalised are 4/7, 2/7, 1/7, ties to the lower id.
    #[test]
    fn top_k_softmax_renormalises_the_largest() {
        let l = [1f32.ln(), 4f32.ln(), 1f32.ln(), 2f32.ln()];
        let (c, p) = top_k_softmax(&l, 3);
        assert_eq!(c, vec![1, 3, 0]);
        for (got, want) in p.iter().zip([4.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0]) {
            assert!((got - want).abs() < 1e-6, "{p:?}");
        }
        let (c, p) = top_k_softmax(&l, 9);
        assert_eq!(c, vec![1, 3, 0, 2]);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
}
