//! SIMD kernels and the run-time choice of instruction set (ggml-cpu's dispatch).
//!
//! [`isa`] picks, once, the widest instruction set this CPU supports and the environment allows;
//! the type table (`super::traits`) then hands out, for each type, that instruction set's
//! kernels from `x86` or `aarch64` or the scalar references, but for each quantized type's dot products,
//! which come from the instruction set measured fastest for it (`super::choice`). Every kernel returns exactly, bit for bit, what
//! the type's scalar `vec_dot_ref` (or [`super::vec_dot_f32`]'s reference loop) returns, for
//! every input: the integer part of each block is computed with SIMD and the float part does the
//! reference's operations in the reference's order (see `x86`). A model's output therefore does
//! not depend on the instruction set.
//!
//! `MINFER_NO_AVX512=1` keeps the choice at AVX2 or below and `MINFER_NO_AVX2=1` forces the
//! scalar references; on aarch64 `MINFER_NO_I8MM=1` keeps it at the SDOT kernels,
//! `MINFER_NO_DOTPROD=1` at baseline NEON and `MINFER_NO_NEON=1` forces the scalar references; [`simd_level`] names the choice. [`amx`]
//! says whether the prompt's products also use AMX tiles (`MINFER_NO_AMX=1` turns them off).
//! Other targets always use the scalar references. This module owns the choice and the kernels' arithmetic; which kernel
//! serves which type is the table's.

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

#[cfg(target_arch = "aarch64")]
pub(crate) mod aarch64;

#[cfg(test)]
mod tests;

use bytemuck::Pod;
use std::sync::OnceLock;

/// An instruction set the dot products have kernels for, each architecture's narrowest first
/// (the order compares levels of one architecture: a CPU supports one architecture's alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// The scalar references.
    Scalar,
    /// AVX2 with F16C.
    Avx2,
    /// The AVX2 kernels with AVX-512 VNNI's `vpdpbusd`/`vpdpwssd` and BW's byte masks (256-bit,
    /// needs AVX-512 F, VL, BW and VNNI).
    Avx512,
    /// aarch64's NEON (every aarch64 CPU has it).
    Neon,
    /// The NEON kernels with the `dotprod` extension's SDOT.
    Dotprod,
    /// The SDOT kernels, and for prompts two weight rows times two tokens at once with the
    /// `i8mm` extension's SMMLA (needs `dotprod` too, as every CPU with `i8mm` has).
    I8mm,
}

impl Isa {
    /// Every instruction set, each architecture's narrowest first.
    pub const ALL: [Isa; 6] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon, Isa::Dotprod, Isa::I8mm];

    /// The name [`simd_level`] reports.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512-vnni",
            Isa::Neon => "neon",
            Isa::Dotprod => "neon-dotprod",
            Isa::I8mm => "neon-i8mm",
        }
    }

    /// Whether this CPU runs the kernels of `self` (whatever the environment says).
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Isa::Dotprod => Isa::Neon.is_supported() && std::arch::is_aarch64_feature_detected!("dotprod"),
            #[cfg(target_arch = "aarch64")]
            Isa::I8mm => Isa::Dotprod.is_supported() && std::arch::is_aarch64_feature_detected!("i8mm"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The widest supported instruction set not switched off: `no_matrix` (`MINFER_NO_I8MM`)
    /// stops at the SDOT kernels, `no_wide` (`MINFER_NO_AVX512`, `MINFER_NO_DOTPROD`) at AVX2 or
    /// NEON, `no_simd` (`MINFER_NO_AVX2`, `MINFER_NO_NEON`) at the scalar references.
    pub fn best_supported(no_matrix: bool, no_wide: bool, no_simd: bool) -> Isa {
        let allowed = |isa: Isa| match isa {
            Isa::Scalar => true,
            Isa::Avx2 | Isa::Neon => !no_simd,
            Isa::Avx512 | Isa::Dotprod => !no_simd && !no_wide,
            Isa::I8mm => !no_simd && !no_wide && !no_matrix,
        };
        Isa::ALL
            .into_iter()
            .rev()
            .find(|&isa| allowed(isa) && isa.is_supported())
            .unwrap_or(Isa::Scalar)
    }
}

/// The scalar reference `reference` of one weight row `x` with each of the activation rows `ys`,
/// on their bytes: the scalar table's dot products, with the signature of the SIMD kernels.
///
/// # Panics
/// If a row is not aligned for its blocks or not a whole number of them.
#[inline]
pub(crate) fn reference_rows<W: Pod, A: Pod, const N: usize>(
    x: &[u8],
    ys: [&[u8]; N],
    reference: impl Fn(&[W], &[A]) -> f32,
) -> [f32; N] {
    let x = bytemuck::cast_slice(x);
    ys.map(|y| reference(x, bytemuck::cast_slice(y)))
}

/// Whether the environment variable `name` is set to something other than empty or `0`.
fn env_flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The widest instruction set this CPU supports and the environment allows (`MINFER_NO_AVX512`,
/// `MINFER_NO_AVX2`; `MINFER_NO_I8MM`, `MINFER_NO_DOTPROD`, `MINFER_NO_NEON`), chosen on the
/// first call.
pub fn isa() -> Isa {
    static CHOSEN: OnceLock<Isa> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        Isa::best_supported(
            env_flag("MINFER_NO_I8MM"),
            env_flag("MINFER_NO_AVX512") || env_flag("MINFER_NO_DOTPROD"),
            env_flag("MINFER_NO_AVX2") || env_flag("MINFER_NO_NEON"),
        )
    })
}

/// Whether the prompt's matrix products run their full tiles of 16 tokens as AMX tile products
/// (`crate::quant::gemm`): the CPU has AMX-TILE and AMX-INT8, the OS granted the tile state,
/// [`isa`] chose the AVX-512 kernels (whose float steps the tile kernels share) and
/// `MINFER_NO_AMX` is not set. Decided on the first call.
pub fn amx() -> bool {
    static CHOSEN: OnceLock<bool> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            isa() == Isa::Avx512 && !env_flag("MINFER_NO_AMX") && x86::amx::hardware_available()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// The name of the instruction set [`isa`] chose: `"avx512-vnni"`, `"avx2"`, `"neon-i8mm"`,
/// `"neon-dotprod"`, `"neon"` or `"scalar"`.
pub fn simd_level() -> &'static str {
    isa().name()
}
