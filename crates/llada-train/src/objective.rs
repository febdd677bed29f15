//! Training objectives, as batches of (inputs, targets, per-position loss weights).
//!
//! Masked diffusion (LLaDA SFT): per sequence draw `t ~ U(ε, 1)`, mask each *answer* position
//! with probability `t` (at least one), and weight the cross-entropy of masked positions by
//! `1 / (t · L_answer)`; answers are padded with EOS, and the pads are part of the answer (the
//! model learns where the answer ends). The Dream variant predicts position `i` from the output
//! at `i − 1` (shifted logits). Next-token prediction weights every answer position `1 / L`.

use crate::tasks::Example;
use crate::vocab::{CharVocab, BOS, EOS};
use candle_core::{Device, Result, Tensor};
use rand::Rng;

/// Inputs, targets and weights, each `[B, T]`.
pub struct Batch {
    pub ids: Tensor,
    pub targets: Tensor,
    pub weights: Tensor,
    /// Tokens in the batch (for throughput).
    pub tokens: usize,
    /// Run the forward with a causal mask (next-token batches; a Dream model's
    /// autoregressive warm-up). Causal-format models are always causal.
    pub causal: bool,
    /// A [`two_stream_batch`]: `ids` are `[B, 2T]` (content stream, then query stream).
    pub two_stream: bool,
    /// Soft targets (distillation from a teacher's top-k), replacing `targets` in the loss.
    pub soft: Option<SoftTargets>,
    /// Per-row ends (bidirectional batches with hidden padding): row `r` is `0..ends[r]`; the
    /// EOS padding beyond, up to the batch's longest row, is hidden from attention and carries
    /// no loss. `None`: every row spans the whole batch.
    pub ends: Option<std::sync::Arc<[u32]>>,
}

impl Batch {
    /// Rows `start..start + n` as a batch of their own (data-parallel shards): every field is
    /// narrowed along the row dimension; soft targets keep their rows' `T·k` entries each.
    pub fn rows(&self, start: usize, n: usize) -> Result<Batch> {
        let b = self.ids.dim(0)?;
        if n == 0 || start + n > b {
            candle_core::bail!("rows {start}..{} of a {b}-row batch", start + n);
        }
        let soft = match &self.soft {
            Some(s) => {
                let per = s.classes.len() / b;
                if per * b != s.classes.len() || s.probs.len() != s.classes.len() {
                    candle_core::bail!("soft targets do not divide into {b} rows");
                }
                Some(SoftTargets {
                    classes: s.classes[start * per..(start + n) * per].to_vec(),
                    probs: s.probs[start * per..(start + n) * per].to_vec(),
                })
            }
            None => None,
        };
        Ok(Batch {
            ids: self.ids.narrow(0, start, n)?,
            targets: self.targets.narrow(0, start, n)?,
            weights: self.weights.narrow(0, start, n)?,
            tokens: self.tokens * n / b,
            causal: self.causal,
            two_stream: self.two_stream,
            soft,
            ends: self.ends.as_ref().map(|e| e[start..start + n].into()),
        })
    }
}

/// A sparse target distribution per position: `k` = `classes.len() / positions` classes and
/// their probabilities, row-major like `targets` (entries of probability 0 are padding).
#[derive(Debug, Clone, Default)]
pub struct SoftTargets {
    pub classes: Vec<u32>,
    pub probs: Vec<f32>,
}

/// Lay out `examples` as `BOS prompt answer EOS…` rows of one length (multiple of 8); returns
/// rows and the index where each answer starts.
pub fn layout(examples: &[Example], min_pad: usize) -> (Vec<Vec<u32>>, Vec<usize>) {
    let (rows, starts, _) = layout_padded(examples, min_pad, 0, &[]);
    (rows, starts)
}

/// Tokens an answer of `answer` tokens occupies in a [`layout_padded`] row: itself and at least
/// `min_pad` EOS, rounded up to a multiple of `pad_to` (0: no rounding).
pub fn answer_region(answer: usize, min_pad: usize, pad_to: usize) -> usize {
    if pad_to > 0 {
        (answer + min_pad).next_multiple_of(pad_to)
    } else {
        answer + min_pad
    }
}

/// [`answer_region`], or with a random EOS tail `Some(x)` (hidden padding only) exactly the
/// answer, `min_pad` EOS and `x` more, not rounded: a row's region in [`layout_padded`].
pub fn tailed_region(answer: usize, min_pad: usize, pad_to: usize, tail: Option<usize>) -> usize {
    match tail {
        Some(x) => answer + min_pad + x,
        None => answer_region(answer, min_pad, pad_to),
    }
}

/// [`layout`] where every answer region (answer + EOS padding) is at least `answer + min_pad`
/// rounded up to a multiple of `pad_to` (0: no rounding) — the generation lengths `llada eval`
/// decodes with (`(answer + 1)` rounded up to whole 32-token blocks), so that a model meets the
/// long EOS tails of decoding in training too. `tails[r]`, where given and `Some(x)`, replaces
/// row `r`'s rounded region by `answer + min_pad + x` (random EOS tails, [`TaskData::eos_tail`]:
/// the region's end then says nothing about the answer's length); an empty slice keeps every
/// row rounded. Returns the rows, the index where each answer starts and where each row's own
/// region ends (`start + region`; the EOS beyond, up to the batch's longest row, is only there
/// to make the rows one length).
///
/// [`TaskData::eos_tail`]: crate::trainer::TaskData::eos_tail
pub fn layout_padded(
    examples: &[Example],
    min_pad: usize,
    pad_to: usize,
    tails: &[Option<usize>],
) -> (Vec<Vec<u32>>, Vec<usize>, Vec<usize>) {
    let enc: Vec<(Vec<u32>, Vec<u32>)> = examples
        .iter()
        .map(|e| (CharVocab::encode(&e.prompt), CharVocab::encode(&e.answer)))
        .collect();
    // Each row's own end (BOS + prompt + region); the batch's length is the longest.
    let ends: Vec<usize> = enc
        .iter()
        .enumerate()
        .map(|(r, (p, a))| {
            1 + p.len() + tailed_region(a.len(), min_pad, pad_to, tails.get(r).copied().flatten())
        })
        .collect();
    let t = ends.iter().copied().max().unwrap_or(8).next_multiple_of(8);
    let mut rows = vec![];
    let mut starts = vec![];
    for (p, a) in enc {
        let mut r = vec![BOS];
        r.extend(&p);
        starts.push(r.len());
        r.extend(&a);
        r.resize(t, EOS);
        rows.push(r);
    }
    (rows, starts, ends)
}

/// A masked-diffusion batch. `shift`: Dream's shifted logits (targets at `i` read logits at
/// `i − 1`; the returned tensors are already aligned to the logits, length `T − 1`).
pub fn diffusion_batch(
    examples: &[Example],
    mask_id: u32,
    eps: f64,
    shift: bool,
    rng: &mut impl Rng,
    dev: &Device,
) -> Result<Batch> {
    diffusion_batch_padded(examples, mask_id, eps, shift, 0.0, 0, &[], false, rng, dev)
}

/// [`diffusion_batch`] with two options.
///
/// A fraction `structured` of the rows mask a contiguous run instead of independent positions:
/// half of them the last `⌈t·L⌉` answer positions (suffix), half the first (prefix). Same `t`,
/// same `1/(t·L)` weight, so the expected masked count and the loss scale are those of
/// independent masking; what changes is which contexts the model sees. A suffix-masked row
/// trains the prediction a left-to-right decode makes at its frontier (all of the left context
/// visible), a prefix-masked row the right-to-left one (e.g. a sum's high digits from its low
/// digits); with independent masking alone those contexts are rare once answers are long.
///
/// Rows are [`layout_padded`]: answer regions rounded up to multiples of `pad_to` (0: off)
/// with EOS, or for rows with a `tails` entry the answer, one EOS and that many more, all
/// masked and weighted like answer tokens (LLaDA's SFT trains its EOS padding the same way).
///
/// `hide_padding`: a row's answer is its own region (`answer + 1` EOS rounded up to `pad_to`, or
/// answer + 1 + its tail), and the EOS beyond it, up to the batch's longest row, is hidden —
/// no attention to it ([`Batch::ends`]), no mask, no loss — so each row trains in exactly the
/// layout `llada eval` decodes it in, whatever else the batch holds. Tails are meant for it:
/// without it they only widen the rows. Without it a short row's answer runs to the batch's end:
/// its real tokens get a small share of its `1/(t·L)` weight and every attention sum includes
/// EOS columns that decoding never has (sorts alone, 12 minutes of PyTorch training, one
/// thread: 34 % exact with the padding as answer, 66 % hidden; docs/training.md).
#[allow(clippy::too_many_arguments)]
pub fn diffusion_batch_padded(
    examples: &[Example],
    mask_id: u32,
    eps: f64,
    shift: bool,
    structured: f64,
    pad_to: usize,
    tails: &[Option<usize>],
    hide_padding: bool,
    rng: &mut impl Rng,
    dev: &Device,
) -> Result<Batch> {
    let (rows, starts, mut ends) = layout_padded(examples, 1, pad_to, tails);
    let (b, t) = (rows.len(), rows[0].len());
    if !hide_padding {
        ends.fill(t);
    }
    let mut ids = Vec::with_capacity(b * t);
    let mut tg = Vec::with_capacity(b * t);
    let mut w = Vec::with_capacity(b * t);
    // Stratified times: row r draws t from the r-th of B equal slices of [ε, 1] (one shared
    // offset), so every batch spans the whole schedule. Same marginal as t ~ U(ε, 1), far less
    // variance in the 1/t-weighted loss for small batches.
    let u: f64 = rng.random();
    for (r, (row, &s)) in rows.iter().zip(&starts).enumerate() {
        let tt: f64 = eps + (1.0 - eps) * ((r as f64 + u) / b as f64);
        let end = ends[r];
        let l = (end - s) as f64;
        // Drawn only when used: with `structured = 0` the random stream, and so every mask,
        // is that of plain independent masking.
        let shape: f64 = if structured > 0.0 { rng.random() } else { 1.0 };
        let mut masked: Vec<bool> = if shape < structured {
            let k = ((tt * l).ceil() as usize).clamp(1, end - s);
            let run = if shape < structured / 2.0 {
                end - k..end
            } else {
                s..s + k
            };
            (0..t).map(|i| run.contains(&i)).collect()
        } else {
            // Positions past `end` draw nothing: with `end = t` (padding as answer) the
            // stream is the one before hidden padding existed.
            (0..t)
                .map(|i| i >= s && i < end && rng.random::<f64>() < tt)
                .collect()
        };
        if !masked[s..].iter().any(|m| *m) {
            let i = rng.random_range(s..end);
            masked[i] = true;
        }
        for i in 0..t {
            ids.push(if masked[i] { mask_id } else { row[i] });
            tg.push(row[i]);
            w.push(if masked[i] {
                (1.0 / (tt * l)) as f32
            } else {
                0.0
            });
        }
    }
    let ids = Tensor::from_vec(ids, (b, t), dev)?;
    let mut targets = Tensor::from_vec(tg, (b, t), dev)?;
    let mut weights = Tensor::from_vec(w, (b, t), dev)?;
    if shift {
        targets = targets.narrow(1, 1, t - 1)?;
        weights = weights.narrow(1, 1, t - 1)?;
    }
    Ok(Batch {
        ids,
        targets,
        weights,
        tokens: b * t,
        causal: false,
        two_stream: false,
        soft: None,
        ends: hide_padding.then(|| ends.iter().map(|&e| e as u32).collect()),
    })
}

/// A next-token batch over the answers (causal models, and a LLaDA model's plain next-token
/// warm-up). `hide_padding`: as in [`shifted_next_token_batch`].
pub fn next_token_batch(examples: &[Example], hide_padding: bool, dev: &Device) -> Result<Batch> {
    next_token(examples, false, hide_padding, dev)
}

/// A next-token batch in Dream's shifted layout, for a bidirectional Dream model's
/// autoregressive warm-up (Dream-7B starts from an autoregressive model's weights; the tiny
/// Dream model starts with a phase of the same objective): `ids` are the whole unmasked rows
/// `[B, T]`, `targets[i]` = `row[i + 1]` `[B, T − 1]`, weight `1/L` on answer positions, and the
/// forward runs causally. The loss is the one of [`weighted_ce`] with `shift`.
///
/// `hide_padding`: `L` is the row's own answer and its one EOS; the EOS padding beyond, up to
/// the batch's longest row, carries no loss (causal attention never reaches it from inside the
/// row), as in [`diffusion_batch_padded`]. Otherwise every position after the prompt counts.
pub fn shifted_next_token_batch(
    examples: &[Example],
    hide_padding: bool,
    dev: &Device,
) -> Result<Batch> {
    next_token(examples, true, hide_padding, dev)
}

/// Targets `row[1..]` weighted `1/L` on answer positions, causal. Inputs are `row[..T − 1]`,
/// or the whole row with `whole_rows` (Dream's layout: its last output carries no loss).
/// `hide_padding`: answer positions stop at the row's own end (answer + one EOS).
fn next_token(
    examples: &[Example],
    whole_rows: bool,
    hide_padding: bool,
    dev: &Device,
) -> Result<Batch> {
    let (rows, starts, mut ends) = layout_padded(examples, 1, 0, &[]);
    let (b, t) = (rows.len(), rows[0].len());
    if !hide_padding {
        ends.fill(t);
    }
    let ti = if whole_rows { t } else { t - 1 };
    let mut ids: Vec<u32> = Vec::with_capacity(b * ti);
    let mut tg: Vec<u32> = Vec::with_capacity(b * (t - 1));
    let mut w: Vec<f32> = Vec::with_capacity(b * (t - 1));
    for ((row, &s), &end) in rows.iter().zip(&starts).zip(&ends) {
        let l = (end - s) as f32;
        ids.extend(&row[..ti]);
        tg.extend(&row[1..]);
        w.extend((1..t).map(|i| if i >= s && i < end { 1.0 / l } else { 0.0 }));
    }
    Ok(Batch {
        ids: Tensor::from_vec(ids, (b, ti), dev)?,
        targets: Tensor::from_vec(tg, (b, t - 1), dev)?,
        weights: Tensor::from_vec(w, (b, t - 1), dev)?,
        tokens: b * t,
        causal: true,
        two_stream: false,
        soft: None,
        ends: None,
    })
}

/// Left-to-right prediction in LLaDA's own alignment, for a bidirectional LLaDA model's
/// autoregressive warm-up: output `i` predicts token `i` from a mask at `i` and the tokens
/// left of it. A plain next-token warm-up trains output `i` to predict token `i + 1`, which the
/// masked-diffusion phase must then undo; this one needs no such move (as Dream's shifted
/// warm-up needs none for Dream).
///
/// One sequence cannot hold both the token at `i` (context for `i + 1`) and a mask at `i`, so
/// each row carries two streams (XLNet's two-stream attention): columns `0..T` the content
/// stream (the row's tokens, causal: content `r` sees content `0..=r`), columns `T..2T` the
/// query stream (mask tokens at the same RoPE positions `0..T`; query `i` sees content `0..i`,
/// nothing of the query stream, not even itself). Both visibilities are prefixes of the
/// column order, so the fused softmax applies them ([`crate::ops::Visibility::Prefix`]).
/// Targets: token `i` at query `i` for answer positions, weight `1/L`; the content stream
/// carries no loss. Positions and visibility: [`two_stream_layout`]. `hide_padding`: as in
/// [`shifted_next_token_batch`], `L` stops at the row's own end (answer + one EOS).
pub fn two_stream_batch(
    examples: &[Example],
    mask_id: u32,
    hide_padding: bool,
    dev: &Device,
) -> Result<Batch> {
    let (rows, starts, ends) = layout_padded(examples, 1, 0, &[]);
    two_stream_rows(
        &rows,
        &starts,
        hide_padding.then_some(&ends[..]),
        mask_id,
        dev,
    )
}

/// [`two_stream_batch`] over token rows of one length: query `i` of row `r` carries the loss
/// `1/(end − starts[r])` on `starts[r]..end` (from the answer start; 1 for prose windows, whose
/// position 0 has no left context), where `end` is `ends[r]` or, without `ends`, the row's
/// length.
pub fn two_stream_rows(
    rows: &[Vec<u32>],
    starts: &[usize],
    ends: Option<&[usize]>,
    mask_id: u32,
    dev: &Device,
) -> Result<Batch> {
    let (b, t) = (rows.len(), rows[0].len());
    let mut ids: Vec<u32> = Vec::with_capacity(b * 2 * t);
    let mut tg: Vec<u32> = Vec::with_capacity(b * 2 * t);
    let mut w: Vec<f32> = Vec::with_capacity(b * 2 * t);
    for (r, (row, &s)) in rows.iter().zip(starts).enumerate() {
        let end = ends.map_or(t, |e| e[r]);
        let l = (end - s) as f32;
        ids.extend(row);
        ids.extend(std::iter::repeat_n(mask_id, t));
        tg.extend(std::iter::repeat_n(0, t));
        tg.extend(row);
        w.extend(std::iter::repeat_n(0.0, t));
        w.extend((0..t).map(|i| if i >= s && i < end { 1.0 / l } else { 0.0 }));
    }
    Ok(Batch {
        ids: Tensor::from_vec(ids, (b, 2 * t), dev)?,
        targets: Tensor::from_vec(tg, (b, 2 * t), dev)?,
        weights: Tensor::from_vec(w, (b, 2 * t), dev)?,
        tokens: b * t,
        causal: false,
        two_stream: true,
        soft: None,
        ends: None,
    })
}

/// RoPE positions and visibility of a [`two_stream_batch`] of `2t` columns.
pub fn two_stream_layout(t: usize) -> (Vec<u32>, crate::ops::Visibility) {
    let positions: Vec<u32> = (0..t as u32).chain(0..t as u32).collect();
    // Query 0 would see nothing; it is BOS's position, never a target, so it sees content 0.
    let vis: Vec<u32> = (1..=t as u32)
        .chain((0..t as u32).map(|i| i.max(1)))
        .collect();
    (
        positions,
        crate::ops::Visibility::Prefix(std::sync::Arc::new(vis)),
    )
}

/// `Σ weight · CE(logits, target) / B`. With `shift`, `logits` is `[B, T, V]` and the targets
/// `[B, T − 1]`: output `i` predicts target `i`, and the last output carries no loss.
pub fn weighted_ce(logits: &Tensor, batch: &Batch, shift: bool) -> Result<Tensor> {
    let b = logits.dim(0)?;
    if let Some(soft) = &batch.soft {
        if shift {
            candle_core::bail!("soft targets are for causal drafts, not shifted diffusion logits");
        }
        let weights = batch.weights.flatten_all()?.to_vec1::<f32>()?;
        return crate::ops::weighted_soft_nll(
            logits,
            soft.classes.clone(),
            Some(soft.probs.clone()),
            weights,
        )?
        .sum_all()?
            / b as f64;
    }
    // One fused pass over the logits forward and one backward (crate::ops::weighted_nll).
    let mut targets = batch.targets.flatten_all()?.to_vec1::<u32>()?;
    let mut weights = batch.weights.flatten_all()?.to_vec1::<f32>()?;
    if shift {
        // Pad each row with a weight-0 entry for the last output instead of narrowing the
        // logits (a copy of all of them forward, a padded gradient backward).
        let tm1 = targets.len() / b.max(1);
        targets = targets
            .chunks(tm1.max(1))
            .flat_map(|r| r.iter().copied().chain([0]))
            .collect();
        weights = weights
            .chunks(tm1.max(1))
            .flat_map(|r| r.iter().copied().chain([0.0]))
            .collect();
    }
    crate::ops::weighted_nll(logits, targets, weights)?.sum_all()? / b as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::TaskGen;
    use rand::SeedableRng;

    #[test]
    fn masking_schedule_and_weights() {
        let mut g = TaskGen::new(3, false);
        let ex: Vec<Example> = (0..64).map(|_| g.next(Some("sort"))).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let dev = Device::Cpu;
        let (rows, starts) = layout(&ex, 1);
        let b = diffusion_batch(&ex, 2, 1e-3, false, &mut rng, &dev).unwrap();
        let ids: Vec<Vec<u32>> = b.ids.to_vec2().unwrap();
        let w: Vec<Vec<f32>> = b.weights.to_vec2().unwrap();
        let tg: Vec<Vec<u32>> = b.targets.to_vec2().unwrap();
        let mut frac_sum = 0.0;
        for r in 0..ex.len() {
            let s = starts[r];
            // Prompts are never masked; targets are the clean tokens.
            assert!(ids[r][..s].iter().all(|&x| x != 2));
            assert_eq!(tg[r], rows[r]);
            let masked: Vec<usize> = (0..ids[r].len()).filter(|&i| ids[r][i] == 2).collect();
            assert!(!masked.is_empty());
            // Every masked position carries the same weight 1/(t·L), others 0; so t is
            // recoverable and the masked fraction tracks it.
            let l = (ids[r].len() - s) as f32;
            let wm = w[r][masked[0]];
            assert!(masked.iter().all(|&i| (w[r][i] - wm).abs() < 1e-6));
            assert!((0..ids[r].len())
                .filter(|i| !masked.contains(i))
                .all(|i| w[r][i] == 0.0));
            let t = 1.0 / (wm * l);
            assert!(t > 0.0 && t <= 1.0 + 1e-5);
            frac_sum += (masked.len() as f32 / l - t).abs();
        }
        // Mean |masked fraction − t| is small (binomial noise only).
        assert!(
            frac_sum / (ex.len() as f32) < 0.12,
            "{}",
            frac_sum / ex.len() as f32
        );
    }

    #[test]
    fn structured_masks_are_contiguous_runs_with_the_same_weighting() {
        let mut g = TaskGen::new(5, false);
        let ex: Vec<Example> = (0..256).map(|_| g.next(Some("rev"))).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let (_, starts) = layout(&ex, 1);
        let b = diffusion_batch_padded(
            &ex,
            2,
            0.05,
            false,
            1.0,
            0,
            &[],
            false,
            &mut rng,
            &Device::Cpu,
        )
        .unwrap();
        let ids: Vec<Vec<u32>> = b.ids.to_vec2().unwrap();
        let w: Vec<Vec<f32>> = b.weights.to_vec2().unwrap();
        let (mut suffix, mut prefix) = (0, 0);
        for r in 0..ex.len() {
            let (s, t) = (starts[r], ids[r].len());
            let m: Vec<usize> = (0..t).filter(|&i| ids[r][i] == 2).collect();
            assert!(!m.is_empty() && m[0] >= s);
            // One contiguous run touching either end of the answer region.
            assert_eq!(m[m.len() - 1] - m[0] + 1, m.len());
            let at_end = m[m.len() - 1] == t - 1;
            let at_start = m[0] == s;
            assert!(at_end || at_start);
            suffix += usize::from(at_end && !at_start);
            prefix += usize::from(at_start && !at_end);
            // Run length ⌈t·L⌉ with weight 1/(t·L): masked weight sums to ≈ 1 per row.
            let total: f32 = m.iter().map(|&i| w[r][i]).sum();
            let l = (t - s) as f32;
            assert!(
                total >= 1.0 - 1e-4 && total < 1.0 + 1.0 / (0.05 * l) + 1e-4,
                "{total}"
            );
            assert!((0..t).filter(|i| !m.contains(i)).all(|i| w[r][i] == 0.0));
        }
        // Both shapes occur, in roughly equal numbers.
        assert!(suffix > 80 && prefix > 80, "{suffix} {prefix}");
        // structured = 0 is independent masking: some row has a gap.
        let b = diffusion_batch_padded(
            &ex,
            2,
            0.05,
            false,
            0.0,
            0,
            &[],
            false,
            &mut rng,
            &Device::Cpu,
        )
        .unwrap();
        let ids: Vec<Vec<u32>> = b.ids.to_vec2().unwrap();
        assert!(ids.iter().any(|row| {
            let m: Vec<usize> = (0..row.len()).filter(|&i| row[i] == 2).collect();
            m.len() > 1 && m[m.len() - 1] - m[0] + 1 > m.len()
        }));
    }

    #[test]
    fn padded_layout_reaches_the_decode_length() {
        let mut g = TaskGen::new(9, false);
        for task in ["add", "rev", "sort"] {
            let ex: Vec<Example> = (0..6).map(|_| g.next(Some(task))).collect();
            let (rows, starts, ends) = layout_padded(&ex, 1, 32, &[]);
            for (((row, &s), &end), e) in rows.iter().zip(&starts).zip(&ends).zip(&ex) {
                let a = e.answer.chars().count();
                // The region eval decodes, (answer + 1) rounded up to 32, fits in the row, ends
                // the row's own region, and everything after the answer is EOS.
                assert!(row.len() - s >= (a + 1).next_multiple_of(32), "{task}");
                assert_eq!(end, s + (a + 1).next_multiple_of(32), "{task}");
                assert!(row[s + a..].iter().all(|&t| t == EOS), "{task}");
            }
            let (plain, _) = layout(&ex, 1);
            assert!(plain[0].len() <= rows[0].len());
            let b = diffusion_batch_padded(
                &ex,
                2,
                0.05,
                false,
                0.0,
                32,
                &[],
                false,
                &mut rand::rngs::StdRng::seed_from_u64(1),
                &Device::Cpu,
            )
            .unwrap();
            assert_eq!(b.ids.dims2().unwrap(), (6, rows[0].len()));
        }
    }

    #[test]
    fn eos_tails_replace_the_rounded_region() {
        let mut g = TaskGen::new(11, false);
        let ex: Vec<Example> = (0..5).map(|_| g.next(Some("sort"))).collect();
        let tails = [Some(0), None, Some(7), Some(64), None];
        let (rows, starts, ends) = layout_padded(&ex, 1, 32, &tails);
        for (r, e) in ex.iter().enumerate() {
            let (s, a) = (starts[r], e.answer.chars().count());
            // A tail: answer, one EOS and exactly that many more, not rounded; no tail: the
            // rounded region, as without tails.
            let region = match tails[r] {
                Some(x) => a + 1 + x,
                None => (a + 1).next_multiple_of(32),
            };
            assert_eq!(ends[r], s + region, "row {r}");
            assert!(rows[r].len() >= ends[r]);
            assert!(rows[r][s + a..].iter().all(|&t| t == EOS));
        }
        // Fewer tails than rows: those given apply, the rest are rounded.
        let (_, starts2, ends2) = layout_padded(&ex, 1, 32, &tails[..3]);
        assert_eq!(ends2[2], ends[2] - starts[2] + starts2[2]);
        let a3 = ex[3].answer.chars().count();
        assert_eq!(ends2[3], starts2[3] + (a3 + 1).next_multiple_of(32));
        assert_ne!(ends2[3] - starts2[3], ends[3] - starts[3]);
        // Hidden padding: the loss and masks stay inside each row's own (tailed) region.
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..20 {
            let b = diffusion_batch_padded(
                &ex,
                2,
                0.05,
                false,
                0.5,
                32,
                &tails,
                true,
                &mut rng,
                &Device::Cpu,
            )
            .unwrap();
            let be: Vec<usize> = b
                .ends
                .as_ref()
                .unwrap()
                .iter()
                .map(|&e| e as usize)
                .collect();
            assert_eq!(be, ends);
            let w: Vec<Vec<f32>> = b.weights.to_vec2().unwrap();
            for (r, wr) in w.iter().enumerate() {
                assert!(wr
                    .iter()
                    .enumerate()
                    .all(|(i, &x)| x == 0.0 || (starts[r]..ends[r]).contains(&i)));
                assert!(wr[starts[r]..ends[r]].iter().any(|&x| x > 0.0));
            }
        }
    }

    #[test]
    fn shifted_next_token_batch_is_causal_and_unmasked() {
        let mut g = TaskGen::new(6, false);
        let ex: Vec<Example> = (0..4).map(|_| g.next(Some("add"))).collect();
        let (rows, starts) = layout(&ex, 1);
        let b = shifted_next_token_batch(&ex, false, &Device::Cpu).unwrap();
        assert!(b.causal);
        let ids: Vec<Vec<u32>> = b.ids.to_vec2().unwrap();
        let tg: Vec<Vec<u32>> = b.targets.to_vec2().unwrap();
        let w: Vec<Vec<f32>> = b.weights.to_vec2().unwrap();
        for r in 0..ex.len() {
            // Inputs are the clean rows; target i is token i + 1 (Dream's shift).
            assert_eq!(ids[r], rows[r]);
            assert_eq!(tg[r], rows[r][1..].to_vec());
            // Loss on answer tokens only (target index i is row position i + 1).
            let l = (rows[r].len() - starts[r]) as f32;
            for (i, &wi) in w[r].iter().enumerate() {
                let expect = if i + 1 >= starts[r] { 1.0 / l } else { 0.0 };
                assert_eq!(wi, expect);
            }
        }
    }

    #[test]
    fn hidden_padding_stops_the_warm_up_loss_at_each_rows_end() {
        // Sorts of very different lengths: short rows carry long EOS tails.
        let mut g = TaskGen::new(8, false);
        let ex: Vec<Example> = (0..8).map(|_| g.next(Some("sort"))).collect();
        let (rows, starts, ends) = layout_padded(&ex, 1, 0, &[]);
        let t = rows[0].len();
        assert!(ends.iter().any(|&e| e + 8 < t), "a short row");
        let dev = Device::Cpu;
        // (batch, row position of a weight row's first entry)
        for hide in [false, true] {
            let shifted = shifted_next_token_batch(&ex, hide, &dev).unwrap();
            let plain = next_token_batch(&ex, hide, &dev).unwrap();
            let two = two_stream_batch(&ex, 2, hide, &dev).unwrap();
            for (b, at) in [(&shifted, 1usize), (&plain, 1), (&two, 0)] {
                let w: Vec<Vec<f32>> = b.weights.to_vec2().unwrap();
                for r in 0..ex.len() {
                    let end = if hide { ends[r] } else { t };
                    // Two-stream rows: content stream first (no loss), then the query stream.
                    let q = &w[r][w[r].len() - (t - at)..];
                    for (i, &wi) in q.iter().enumerate() {
                        let pos = i + at;
                        let expect = if pos >= starts[r] && pos < end {
                            1.0 / (end - starts[r]) as f32
                        } else {
                            0.0
                        };
                        assert_eq!(wi, expect, "hide {hide} row {r} position {pos}");
                    }
                    let total: f32 = w[r].iter().sum();
                    assert!((total - 1.0).abs() < 1e-4, "row {r}: {total}");
                }
            }
        }
    }

    #[test]
    fn shift_aligns_targets_with_previous_position() {
        let mut g = TaskGen::new(4, false);
        let ex: Vec<Example> = (0..4).map(|_| g.next(Some("rev"))).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let b = diffusion_batch(&ex, 2, 1e-3, true, &mut rng, &Device::Cpu).unwrap();
        let (rows, _) = layout(&ex, 1);
        let tg: Vec<Vec<u32>> = b.targets.to_vec2().unwrap();
        assert_eq!(tg[0], rows[0][1..].to_vec());
        assert_eq!(b.ids.dim(1).unwrap(), rows[0].len());
    }
}
