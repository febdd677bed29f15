//! Which instruction set the quantized kernels run on: run-time CPU feature detection
//! ([`best_isa`]), the default per CPU ([`default_isa`]) and the process-wide choice ([`isa`]:
//! the default, unless `LLADA_KERNEL_ISA` or [`set_isa`] asks for another; [`isa_reason`]
//! says which and why).
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

/// The instruction set the kernels use: [`default_isa`] for this CPU, unless the environment
/// variable `LLADA_KERNEL_ISA` (`avx512-vnni`, `avx2`, `portable`) or [`set_isa`] asks for
/// another; a request the CPU cannot serve falls back to the best it has.
///
/// One path serves every pass of a process (a tree verification has to reproduce one-row
/// decoding bit for bit, and the paths round differently), so the choice is per CPU, not per
/// shape.
pub fn isa() -> Isa {
    use std::sync::atomic::Ordering;
    match ISA.load(Ordering::Relaxed) {
        0 => set_isa(requested().unwrap_or_else(|| default_isa().0)),
        code => Isa::ALL[code as usize - 1],
    }
}

/// The path this CPU runs by default, and why: the best it has, except on AMD CPUs with
/// AVX-512, which execute 512-bit operations as two 256-bit halves — there one-row decoding
/// measured slower on the AVX-512 path (SmolLM2 decode 140 against 162 tok/s on an EPYC, while
/// prefill gained 1.17x; docs/kernels.md), and decoding is where the default command spends
/// its time. On Intel CPUs with AVX-512 VNNI the 512-bit path is the faster one at every M
/// measured (docs/kernels.md).
pub fn default_isa() -> (Isa, &'static str) {
    let best = best_isa();
    #[cfg(target_arch = "x86_64")]
    if best == Isa::Avx512Vnni && vendor_is_amd() {
        return (
            Isa::Avx2,
            "AMD CPU: AVX-512 runs as two 256-bit halves there, and one-row decoding measured \
             faster on AVX2",
        );
    }
    (best, "this CPU's best")
}

/// Whether CPUID names AMD as the vendor.
#[cfg(target_arch = "x86_64")]
fn vendor_is_amd() -> bool {
    let r = std::arch::x86_64::__cpuid(0);
    let mut v = [0u8; 12];
    v[0..4].copy_from_slice(&r.ebx.to_le_bytes());
    v[4..8].copy_from_slice(&r.edx.to_le_bytes());
    v[8..12].copy_from_slice(&r.ecx.to_le_bytes());
    &v == b"AuthenticAMD"
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
                 portable; using this CPU's default ({})",
                default_isa().0
            );
            None
        }
    }
}

/// One line saying which path runs and why (for `llada bench` and `llada info`).
pub fn isa_reason() -> String {
    let (now, best, (default, why)) = (isa(), best_isa(), default_isa());
    let features = match best {
        Isa::Avx512Vnni => "AVX-512 F/BW/VNNI and AVX2/FMA/F16C detected",
        Isa::Avx2 => "AVX2/FMA/F16C detected, no AVX-512 VNNI",
        Isa::NeonDot => "NEON with the dot-product extension detected",
        Isa::Neon => "NEON detected, no dot-product extension",
        Isa::Portable => "no SIMD kernel for this CPU",
    };
    match requested() {
        Some(r) if r != now => {
            format!("{now}: LLADA_KERNEL_ISA asked for {r}, which this CPU lacks ({features})")
        }
        Some(_) if now != default => {
            format!("{now}: chosen by LLADA_KERNEL_ISA (default here: {default}; {features})")
        }
        _ if now != default => format!("{now}: chosen by the program (default here: {default})"),
        _ => format!("{now}: {why} ({features})"),
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
