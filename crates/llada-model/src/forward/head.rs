//! The head of the pass: the final RMSNorm and the LM head, only for the rows that want logits
//! (selective logits), from resident weights or streamed in row chunks.
//!
//! Invariants: a streamed head's every chunk is received even when no row wants logits (the
//! prefetch thread must finish its pass); logits come back in vocabulary order (a model with
//! a vocabulary map scatters its head's rows back); `features` are the normed rows the head
//! multiplied.

use super::batch::Batch;
use super::ops::rmsnorm;
use super::ForwardOutput;
use crate::store::Unit;
use crate::stream::PassStream;
use crate::{Model, ModelConfig, ModelError};
use llada_kernels::QuantizedActs;

/// A pass's weight stream.
pub(super) type Stream<'s> = PassStream<'s>;

impl Model {
    /// Logits (and features) of the batch's logit rows, per sequence.
    pub(super) fn head(
        &self,
        b: &Batch,
        stream: Option<&mut Stream>,
    ) -> Result<Vec<ForwardOutput>, ModelError> {
        let c = &self.config;
        let w = &self.weights;
        let vocab = c.vocab;
        let m = b.logit_rows.len();
        let h = if m == 0 {
            vec![]
        } else {
            rmsnorm(&b.x, &w.final_norm, c.rms_eps, &b.logit_rows, -1)
        };
        let mut hq = None;
        let mut logits = match (&w.lm_head, stream) {
            (Some(head), _) if m > 0 => head.forward(&h, &mut hq, m, -1, "lm_head")?,
            (Some(_), _) => vec![],
            (None, Some(s)) => streamed_head(s, &h, &mut hq, m, c)?,
            (None, None) => return Err(ModelError::Other("the LM head is not loaded".into())),
        };
        if m > 0 {
            if let Some(map) = &w.vocab_map {
                logits = map.scatter(&logits, vocab);
            }
        }
        Ok(b.split(&logits, &h, vocab))
    }
}

/// A streamed head arrives in row chunks, each multiplied as it lands (the read of chunk
/// j + 1 overlaps it): `m × rows` logits of the normed rows `h`.
fn streamed_head(
    st: &mut PassStream,
    h: &[f32],
    hq: &mut Option<QuantizedActs>,
    m: usize,
    c: &ModelConfig,
) -> Result<Vec<f32>, ModelError> {
    let rows = c.embedding_rows();
    let mut out = vec![0f32; m * rows];
    let mut done = 0;
    while done < rows {
        match st.next()? {
            Unit::HeadRows(r0, part) => {
                let n = part.rows();
                if m > 0 {
                    let y = part.forward(h, hq, m, -1, "lm_head")?;
                    for (o, yr) in out.chunks_exact_mut(rows).zip(y.chunks_exact(n)) {
                        o[r0..r0 + n].copy_from_slice(yr);
                    }
                }
                done += n;
            }
            Unit::Layer(_) => return Err(ModelError::Other("weight stream out of order".into())),
        }
    }
    Ok(out)
}
