//! One layer's SwiGLU MLP: `down(silu(gate(h)) · up(h))`, gate and up as one fused projection.
//!
//! Invariant: SiLU is `a / (1 + exp(-a))` in f32, multiplied by the up row in place.

use crate::weights::Layer;
use crate::{ModelConfig, ModelError};
use llada_runtime::trace::OpSpan;

/// The MLP of layer `l` on the `n` normed rows `h`; returns what the residual stream adds.
pub(super) fn mlp(
    layer: &Layer,
    h: &[f32],
    n: usize,
    l: i32,
    c: &ModelConfig,
) -> Result<Vec<f32>, ModelError> {
    let mut gu = layer.gate_up.forward(h, n, l, "ffn_gate_up")?.into_iter();
    let (mut g, u) = match (gu.next(), gu.next()) {
        (Some(g), Some(u)) => (g, u),
        _ => {
            return Err(ModelError::Other(
                "gate/up projection returned too few outputs".into(),
            ))
        }
    };
    {
        let _s = OpSpan::begin("silu_mul", l, &[n as u64, c.ffn as u64], "F32").cost(
            (2 * n * c.ffn * 4) as u64,
            (n * c.ffn * 4) as u64,
            (5 * n * c.ffn) as u64,
        );
        g.iter_mut()
            .zip(&u)
            .for_each(|(a, b)| *a = *a / (1.0 + (-*a).exp()) * b);
    }
    let mut gq = None;
    layer.w_down.forward(&g, &mut gq, n, l, "ffn_down")
}
