//! CPU compute kernels for llada-rs.
//!
//! * [`types`]: the GGML tensor element types (block sizes, byte sizes) shared by the GGUF reader
//!   and the kernels.
//! * [`dequant`]: reference dequantisation of every supported block type to f32.
//! * [`qmatmul`]: the batched quantized matmul `Y[M×N] = X[M×K] · W[N×K]ᵀ`.
//!
//! Why a hand-written matmul: diffusion denoising and tree verification run forward passes over
//! 8–256 tokens at once, and candle-core 0.11's quantized matmul does not scale with the number of
//! rows M on CPUs (≈ 21 GFLOP/s for Q8_0 at every M on our 2-core reference machine, where
//! llama.cpp reaches ≈ 98 at M = 32). Our kernel quantizes the activations once to 8-bit blocks,
//! then multiplies register tiles of weight rows × activation rows with AVX2 integer dot products,
//! so every weight block that is unpacked is reused for several activation rows.
pub mod dequant;
pub mod qmatmul;
pub mod types;
pub mod vecops;

pub use qmatmul::{
    best_isa, default_isa, isa, isa_reason, matmul_f32, recycle, set_isa, weight_memory, ActLayout,
    ByteOwner, Isa, QMatrix, QMatrixError, QuantizedActs, StagingBytes,
};
pub use types::GgmlType;

/// Number of worker threads the kernels use (rayon's global pool).
pub fn num_threads() -> usize {
    rayon::current_num_threads()
}
