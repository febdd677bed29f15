//! Activations quantized once per call to 8-bit blocks of 32 ([`QuantizedActs`]), in the byte
//! order the weight kind's kernel reads ([`ActLayout`]). All kernels compute their integer
//! sums from these same bytes, which is what keeps the instruction sets' results comparable.

/// Byte order of quantized activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActLayout {
    /// Blocks in order, 32 values each (8-bit weights).
    Plain,
    /// Pairs of blocks (A, B) stored as `A0..15 B0..15 A16..31 B16..31` (4-bit weights); an odd
    /// last block is paired with a zero block.
    Paired,
}

/// Activations quantized to 8-bit blocks of 32: `x[i, 32b + l] ≈ d[i, b] · q[i, 32b + l]`.
/// Per row, `d` and `s = d·Σq` are padded with zeros to a multiple of 8 blocks, and `h` (the
/// integer sums of each 16 values, for the K-quants' per-16 scales and mins) to 16 halves.
pub struct QuantizedActs {
    pub m: usize,
    pub k: usize,
    pub layout: ActLayout,
    /// Bytes of `qs` per row.
    pub qstride: usize,
    /// Blocks per row of `d` / `s` (padded).
    pub nbp: usize,
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub h: Vec<i16>,
}

impl QuantizedActs {
    /// Quantize a row-major `m × k` matrix (`k` a multiple of 32).
    pub fn quantize(x: &[f32], m: usize, k: usize, layout: ActLayout) -> Self {
        assert_eq!(x.len(), m * k);
        assert!(
            k.is_multiple_of(32),
            "activation width must be a multiple of 32"
        );
        let nb = k / 32;
        let nbp = nb.next_multiple_of(8);
        let qstride = match layout {
            ActLayout::Plain => k,
            ActLayout::Paired => nb.next_multiple_of(2) * 32,
        };
        let mut qs = vec![0i8; m * qstride];
        let mut d = vec![0f32; m * nbp];
        let mut s = vec![0f32; m * nbp];
        let mut h = vec![0i16; m * nbp * 2];
        let mut tmp = [0i8; 32];
        for i in 0..m {
            for b in 0..nb {
                let xb = &x[i * k + b * 32..i * k + b * 32 + 32];
                let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                let dd = amax / 127.0;
                let id = if dd > 0.0 { 1.0 / dd } else { 0.0 };
                let mut halves = [0i32; 2];
                for (l, (q, v)) in tmp.iter_mut().zip(xb).enumerate() {
                    // Round half away from zero without a libm call (|v·id| ≤ 127).
                    let y = v * id;
                    let qi = (y + 0.5f32.copysign(y)) as i32;
                    *q = qi as i8;
                    halves[l / 16] += qi;
                }
                let sum = halves[0] + halves[1];
                h[(i * nbp + b) * 2] = halves[0] as i16;
                h[(i * nbp + b) * 2 + 1] = halves[1] as i16;
                d[i * nbp + b] = dd;
                s[i * nbp + b] = dd * sum as f32;
                let row = &mut qs[i * qstride..(i + 1) * qstride];
                match layout {
                    ActLayout::Plain => row[b * 32..b * 32 + 32].copy_from_slice(&tmp),
                    ActLayout::Paired => {
                        let base = (b / 2) * 64 + (b % 2) * 16;
                        row[base..base + 16].copy_from_slice(&tmp[..16]);
                        row[base + 32..base + 48].copy_from_slice(&tmp[16..]);
                    }
                }
            }
        }
        Self {
            m,
            k,
            layout,
            qstride,
            nbp,
            qs,
            d,
            s,
            h,
        }
    }

    /// The sum of the 16 values of half `half` (0, 1) of block `b` of row `i`.
    pub(super) fn half_sum(&self, i: usize, b: usize, half: usize) -> i32 {
        self.h[(i * self.nbp + b) * 2 + half] as i32
    }

    /// Value `l` (0..32) of block `b` of row `i`.
    pub(super) fn q(&self, i: usize, b: usize, l: usize) -> i32 {
        let row = &self.qs[i * self.qstride..];
        (match self.layout {
            ActLayout::Plain => row[b * 32 + l],
            ActLayout::Paired => row[(b / 2) * 64 + (b % 2) * 16 + (l / 16) * 32 + l % 16],
        }) as i32
    }
}
