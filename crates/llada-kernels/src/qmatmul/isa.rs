//! Which instruction set the quantized kernels run on: run-time CPU feature detection
//! ([`best_isa`]) and the process-wide choice ([`isa`], `LLADA_KERNEL_ISA`, [`set_isa`]).
//!
//! Invariants: the choice is process-wide (one path for every pass, [`isa`]) and never exceeds
//! what the CPU offers: a kernel compiled with `#[target_feature]` runs only where those
//! features were detected, and the features checked here are the `#[target_feature]` sets of
//! `x86/avx2.rs` and `x86/avx512.rs`.

/// Instruction set the quantized kernels run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// 512-bit registers and `vpdpbusd` (AVX-512 F/BW/VNNI: Intel Ice Lake and later, AMD Zen 4
    /// and later).
    Avx512Vnni,
    /// 256-bit registers, `vpmaddubsw` + `vpmaddwd` (AVX2/FMA/F16C).
    Avx2,
    /// Scalar Rust, the same integer sums (other CPUs).
    Portable,
}

impl Isa {
    /// The name `LLADA_KERNEL_ISA` and the benchmarks use.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }
    fn code(self) -> u8 {
        self as u8 + 1
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The [`Isa`] in use as `1 + ` its index; 0 until the first call decides.
static ISA: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The best instruction set this CPU offers the kernels.
pub fn best_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512_vnni_available() {
            return Isa::Avx512Vnni;
        }
        if avx2_available() {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// The instruction set the kernels use: AVX2 where the CPU has it (else portable), unless the
/// environment variable `LLADA_KERNEL_ISA` (`avx512-vnni`, `avx2`, `portable`) or [`set_isa`]
/// asks for another; a request the CPU cannot serve falls back to the best it has.
///
/// AVX-512 VNNI is opt-in: on batched passes it is faster (prefill ≈ 1.17x, Q8_0 at M ≥ 8
/// 1.4–2.0x), but on one-row decoding of SmolLM2's shapes it is slower (the 49 152 × 576 Q8_0
/// head 1.0–1.25 ms against 0.54–0.86 with AVX2, docs/kernels.md), and a process must use one
/// path for every pass: a tree verification has to reproduce one-row decoding bit for bit, and
/// the two paths round differently.
pub fn isa() -> Isa {
    use std::sync::atomic::Ordering;
    match ISA.load(Ordering::Relaxed) {
        1 => Isa::Avx512Vnni,
        2 => Isa::Avx2,
        3 => Isa::Portable,
        _ => set_isa(match std::env::var("LLADA_KERNEL_ISA").as_deref() {
            Ok("avx512-vnni") | Ok("avx512") => Isa::Avx512Vnni,
            Ok("portable") => Isa::Portable,
            Ok("avx2") | Ok("") | Err(_) => Isa::Avx2,
            Ok(other) => {
                eprintln!(
                    "warning: LLADA_KERNEL_ISA={other:?} is not avx512-vnni, avx2 or portable; \
                     using avx2"
                );
                Isa::Avx2
            }
        }),
    }
}

/// Run the kernels on `wanted`, or on the best this CPU offers where it lacks `wanted`; returns
/// the one chosen. Process-wide, and meant to be called before any matmul: passes computed on
/// two paths round differently, and a tree verification must reproduce one-row decoding bit
/// for bit (benchmarks switch between whole runs).
pub fn set_isa(wanted: Isa) -> Isa {
    let chosen = wanted.max(best_isa());
    ISA.store(chosen.code(), std::sync::atomic::Ordering::Relaxed);
    chosen
}

/// AVX2, FMA and F16C: the features of the [`Isa::Avx2`] kernels.
#[cfg(target_arch = "x86_64")]
fn avx2_available() -> bool {
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// AVX-512 F/BW/VNNI on top of [`avx2_available`]: the features of the [`Isa::Avx512Vnni`]
/// kernels.
#[cfg(target_arch = "x86_64")]
fn avx512_vnni_available() -> bool {
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        avx2_available()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    })
}
