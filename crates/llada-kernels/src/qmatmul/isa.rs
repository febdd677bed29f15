//! Which instruction set the quantized kernels run on: run-time CPU feature detection
//! ([`best_isa`]) and the process-wide choice ([`isa`]: the best the CPU has, unless
//! `LLADA_KERNEL_ISA` or [`set_isa`] asks for another; [`isa_reason`] says which and why).
//!
//! Invariants: the choice is process-wide (one path for every pass, [`isa`]) and never exceeds
//! what the CPU offers: a kernel compiled with `#[target_feature]` runs only where those
//! features were detected, and the features checked here are the `#[target_feature]` sets of
//! `x86/avx2.rs`, `x86/avx512.rs` and `arm/neon.rs` (`dotprod`; NEON itself is baseline on
//! aarch64). A request for another architecture's set falls back to the best this CPU has.

/// Instruction set the quantized kernels run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// 512-bit registers and `vpdpbusd` (AVX-512 F/BW/VNNI: Intel Ice Lake and later, AMD Zen 4
    /// and later).
    Avx512Vnni,
    /// 256-bit registers, `vpmaddubsw` + `vpmaddwd` (AVX2/FMA/F16C).
    Avx2,
    /// aarch64 NEON with the dot-product extension (`sdot`; Armv8.2+ cores such as Cortex-A55,
    /// A75, A76 and later, Apple M1 and later).
    NeonDot,
    /// aarch64 NEON without `sdot` (`smull` + `sadalp`; Cortex-A53, A72, A73).
    Neon,
    /// Scalar Rust, the same integer sums (other CPUs).
    Portable,
}

impl Isa {
    /// The name `LLADA_KERNEL_ISA` and the benchmarks use.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Avx2 => "avx2",
            Isa::NeonDot => "neon-dot",
            Isa::Neon => "neon",
            Isa::Portable => "portable",
        }
    }
    /// Every variant, in declaration order (`code` indexes it).
    const ALL: [Isa; 5] = [
        Isa::Avx512Vnni,
        Isa::Avx2,
        Isa::NeonDot,
        Isa::Neon,
        Isa::Portable,
    ];
    fn code(self) -> u8 {
        self as u8 + 1
    }
    /// Whether this build has kernels for `self` (the CPU may still lack its features).
    fn compiled(self) -> bool {
        match self {
            Isa::Avx512Vnni | Isa::Avx2 => cfg!(target_arch = "x86_64"),
            Isa::NeonDot | Isa::Neon => cfg!(target_arch = "aarch64"),
            Isa::Portable => true,
        }
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
    #[cfg(target_arch = "aarch64")]
    {
        if dotprod_available() {
            return Isa::NeonDot;
        }
        return Isa::Neon;
    }
    #[allow(unreachable_code)]
    Isa::Portable
}

/// The instruction set the kernels use: the best this CPU offers ([`best_isa`]), unless the
/// environment variable `LLADA_KERNEL_ISA` (`avx512-vnni`, `avx2`, `neon-dot`, `neon`,
/// `portable`) or [`set_isa`] asks for another; a request the CPU cannot serve falls back to the
/// best it has. The two NEON paths compute the same sums in the same order: their results are
/// bit for bit equal.
///
/// One path serves every pass of a process (a tree verification has to reproduce one-row
/// decoding bit for bit, and the paths round differently), so the choice is per CPU, not per
/// shape: AVX-512 VNNI where present, whose batched passes are 1.2–2x AVX2's and whose one-row
/// passes are on par (docs/kernels.md has the table).
pub fn isa() -> Isa {
    use std::sync::atomic::Ordering;
    match ISA.load(Ordering::Relaxed) {
        0 => set_isa(requested().unwrap_or_else(best_isa)),
        code => Isa::ALL[code as usize - 1],
    }
}

/// The path `LLADA_KERNEL_ISA` asks for, if it names one.
fn requested() -> Option<Isa> {
    match std::env::var("LLADA_KERNEL_ISA").as_deref() {
        Ok("avx512-vnni") | Ok("avx512") => Some(Isa::Avx512Vnni),
        Ok("avx2") => Some(Isa::Avx2),
        Ok("neon-dot") | Ok("dotprod") => Some(Isa::NeonDot),
        Ok("neon") => Some(Isa::Neon),
        Ok("portable") => Some(Isa::Portable),
        Ok("") | Err(_) => None,
        Ok(other) => {
            eprintln!(
                "warning: LLADA_KERNEL_ISA={other:?} is not avx512-vnni, avx2, neon-dot, neon or \
                 portable; using this CPU's best ({})",
                best_isa()
            );
            None
        }
    }
}

/// One line saying which path runs and why (for `llada bench` and `llada info`).
pub fn isa_reason() -> String {
    let (now, best) = (isa(), best_isa());
    let features = match best {
        Isa::Avx512Vnni => "AVX-512 F/BW/VNNI and AVX2/FMA/F16C detected",
        Isa::Avx2 => "AVX2/FMA/F16C detected, no AVX-512 VNNI",
        Isa::NeonDot => "NEON and the dot-product extension detected",
        Isa::Neon => "NEON, no dot-product extension",
        Isa::Portable => "no SIMD kernel for this CPU",
    };
    match requested() {
        Some(r) if r != now => {
            format!("{now}: LLADA_KERNEL_ISA asked for {r}, which this CPU lacks ({features})")
        }
        Some(_) if now != best => {
            format!("{now}: chosen by LLADA_KERNEL_ISA (this CPU's best: {best}; {features})")
        }
        _ if now != best => format!("{now}: chosen by the program (this CPU's best: {best})"),
        _ => format!("{now}: this CPU's best ({features})"),
    }
}

/// Run the kernels on `wanted`, or on the best this CPU offers where it lacks `wanted`; returns
/// the one chosen. Process-wide, and meant to be called before any matmul: passes computed on
/// two paths round differently, and a tree verification must reproduce one-row decoding bit
/// for bit (benchmarks switch between whole runs).
pub fn set_isa(wanted: Isa) -> Isa {
    let chosen = choose(wanted);
    ISA.store(chosen.code(), std::sync::atomic::Ordering::Relaxed);
    chosen
}

/// What [`set_isa`] picks for `wanted`: `wanted`, or the best this CPU offers where it lacks
/// `wanted` (another architecture's set included).
pub(super) fn choose(wanted: Isa) -> Isa {
    if wanted.compiled() {
        wanted.max(best_isa())
    } else {
        best_isa()
    }
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

/// The dot-product extension (`sdot`): the feature the [`Isa::NeonDot`] kernels add to NEON.
#[cfg(target_arch = "aarch64")]
fn dotprod_available() -> bool {
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| std::arch::is_aarch64_feature_detected!("dotprod"))
}
