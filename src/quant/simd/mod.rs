//! SIMD block dot products and their run-time dispatch (ggml-cpu's `type_traits_cpu` idea).
//!
//! One [`DotKernels`] table per instruction set holds a function per weight type; the best
//! table the CPU supports is chosen once, on first use, by [`kernels`]. Every kernel returns
//! exactly, bit for bit, what the type's scalar `vec_dot_ref` (or [`super::vec_dot_f32`]'s
//! reference loop) returns, for every input: the integer part of each block is computed with
//! SIMD and the float part does the reference's operations in the reference's order (see
//! `x86`). A model's output therefore does not depend on the instruction set.
//!
//! `MINFER_NO_AVX512=1` keeps the choice at AVX2 or below and `MINFER_NO_AVX2=1` forces the
//! scalar references; [`simd_level`] names the choice. Targets other than x86-64 always use the
//! scalar references.

#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

#[cfg(test)]
mod tests;

use super::q4_0::{self, BlockQ4_0};
use super::q4_1::{self, BlockQ4_1};
use super::q4_k::{self, BlockQ4K};
use super::q5_0::{self, BlockQ5_0};
use super::q5_1::{self, BlockQ5_1};
use super::q5_k::{self, BlockQ5K};
use super::q6_k::{self, BlockQ6K};
use super::q8_0::{self, BlockQ8_0};
use super::q8_1::BlockQ8_1;
use super::q8_k::BlockQ8K;
use std::sync::OnceLock;

/// An instruction set the dot products have kernels for, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// The scalar references.
    Scalar,
    /// AVX2 with F16C.
    Avx2,
    /// The AVX2 kernels with AVX-512 VNNI's `vpdpbusd`/`vpdpwssd` (256-bit, needs AVX-512 F, VL
    /// and VNNI).
    Avx512,
}

impl Isa {
    /// Every instruction set, narrowest first.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// The name [`simd_level`] reports.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512-vnni",
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
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The widest supported instruction set not switched off: `no_avx512` stops at AVX2,
    /// `no_avx2` at the scalar references.
    pub fn best_supported(no_avx512: bool, no_avx2: bool) -> Isa {
        let allowed = |isa: Isa| match isa {
            Isa::Scalar => true,
            Isa::Avx2 => !no_avx2,
            Isa::Avx512 => !no_avx2 && !no_avx512,
        };
        Isa::ALL
            .into_iter()
            .rev()
            .find(|&isa| allowed(isa) && isa.is_supported())
            .unwrap_or(Isa::Scalar)
    }
}

/// The dot product kernels of one instruction set: a function per weight type, each taking a
/// weight row and an activation row of the same number of blocks (or values), and for the
/// quantized types a second form taking two activation rows, which unpacks each weight block
/// once for both (a matmul over several tokens).
///
/// A table exists only for an instruction set the CPU supports ([`DotKernels::for_isa`]), which
/// is what makes calling its functions sound.
pub struct DotKernels {
    isa: Isa,
    blocks: BlockKernels<1>,
    blocks_x2: BlockKernels<2>,
    f32: unsafe fn(&[u8], &[f32]) -> f32,
    f16: unsafe fn(&[u8], &[f32]) -> f32,
    bf16: unsafe fn(&[u8], &[f32]) -> f32,
}

/// The quantized kernels for `N` activation rows against one weight row.
struct BlockKernels<const N: usize> {
    q4_0: unsafe fn(&[BlockQ4_0], [&[BlockQ8_0]; N]) -> [f32; N],
    q4_1: unsafe fn(&[BlockQ4_1], [&[BlockQ8_1]; N]) -> [f32; N],
    q5_0: unsafe fn(&[BlockQ5_0], [&[BlockQ8_0]; N]) -> [f32; N],
    q5_1: unsafe fn(&[BlockQ5_1], [&[BlockQ8_1]; N]) -> [f32; N],
    q8_0: unsafe fn(&[BlockQ8_0], [&[BlockQ8_0]; N]) -> [f32; N],
    q4_k: unsafe fn(&[BlockQ4K], [&[BlockQ8K]; N]) -> [f32; N],
    q5_k: unsafe fn(&[BlockQ5K], [&[BlockQ8K]; N]) -> [f32; N],
    q6_k: unsafe fn(&[BlockQ6K], [&[BlockQ8K]; N]) -> [f32; N],
}

/// The scalar references over `N` activation rows, one after the other.
mod scalar {
    use super::*;

    macro_rules! rows {
        ($($name:ident: $reference:path, $w:ty, $a:ty;)*) => {$(
            pub(super) fn $name<const N: usize>(x: &[$w], ys: [&[$a]; N]) -> [f32; N] {
                ys.map(|y| $reference(x, y))
            }
        )*};
    }

    rows! {
        q4_0: q4_0::vec_dot_ref, BlockQ4_0, BlockQ8_0;
        q4_1: q4_1::vec_dot_ref, BlockQ4_1, BlockQ8_1;
        q5_0: q5_0::vec_dot_ref, BlockQ5_0, BlockQ8_0;
        q5_1: q5_1::vec_dot_ref, BlockQ5_1, BlockQ8_1;
        q8_0: q8_0::vec_dot_ref, BlockQ8_0, BlockQ8_0;
        q4_k: q4_k::vec_dot_ref, BlockQ4K, BlockQ8K;
        q5_k: q5_k::vec_dot_ref, BlockQ5K, BlockQ8K;
        q6_k: q6_k::vec_dot_ref, BlockQ6K, BlockQ8K;
    }
}

/// A [`BlockKernels`] table from the module `$m` holding one generic function per type, with
/// the generic arguments `$g` before the row count.
macro_rules! block_kernels {
    ($m:path, [$($g:tt)*], $n:literal) => {{
        use $m as m;
        BlockKernels {
            q4_0: m::q4_0::<$($g)* $n>,
            q4_1: m::q4_1::<$($g)* $n>,
            q5_0: m::q5_0::<$($g)* $n>,
            q5_1: m::q5_1::<$($g)* $n>,
            q8_0: m::q8_0::<$($g)* $n>,
            q4_k: m::q4_k::<$($g)* $n>,
            q5_k: m::q5_k::<$($g)* $n>,
            q6_k: m::q6_k::<$($g)* $n>,
        }
    }};
}

static SCALAR: DotKernels = DotKernels {
    isa: Isa::Scalar,
    blocks: block_kernels!(scalar, [], 1),
    blocks_x2: block_kernels!(scalar, [], 2),
    f32: super::vec_dot_f32_ref,
    f16: super::vec_dot_f16_ref,
    bf16: super::vec_dot_bf16_ref,
};

#[cfg(target_arch = "x86_64")]
static AVX2: DotKernels = DotKernels {
    isa: Isa::Avx2,
    blocks: block_kernels!(x86::kernels, [false,], 1),
    blocks_x2: block_kernels!(x86::kernels, [false,], 2),
    f32: x86::float::vec_dot_f32,
    f16: x86::float::vec_dot_f16,
    bf16: x86::float::vec_dot_bf16,
};

#[cfg(target_arch = "x86_64")]
static AVX512: DotKernels = DotKernels {
    isa: Isa::Avx512,
    blocks: block_kernels!(x86::kernels, [true,], 1),
    blocks_x2: block_kernels!(x86::kernels, [true,], 2),
    f32: x86::float::vec_dot_f32,
    f16: x86::float::vec_dot_f16,
    bf16: x86::float::vec_dot_bf16,
};

/// The safe entries of a quantized kernel: one length check, then the call.
macro_rules! block_entry {
    ($($name:ident, $name_x2:ident: $w:ty, $a:ty;)*) => {$(
        #[doc = concat!("`", stringify!($name), "::vec_dot_ref(x, y)` on this table's instruction set.")]
        ///
        /// # Panics
        /// If the two rows do not hold the same number of blocks.
        #[inline]
        pub fn $name(&self, x: &[$w], y: &[$a]) -> f32 {
            assert_eq!(x.len(), y.len(), concat!(stringify!($name), " dot: weight and activation block counts differ"));
            // SAFETY: a table is only handed out for an instruction set the CPU supports
            // (`for_isa`); the kernels access memory only within `x` and `y`.
            unsafe { (self.blocks.$name)(x, [y])[0] }
        }

        #[doc = concat!("`[", stringify!($name), "::vec_dot_ref(x, y0), ", stringify!($name), "::vec_dot_ref(x, y1)]`,")]
        /// unpacking each weight block once.
        ///
        /// # Panics
        /// If the three rows do not hold the same number of blocks.
        #[inline]
        pub fn $name_x2(&self, x: &[$w], y0: &[$a], y1: &[$a]) -> [f32; 2] {
            assert!(
                x.len() == y0.len() && x.len() == y1.len(),
                concat!(stringify!($name), " dot: weight and activation block counts differ")
            );
            // SAFETY: as for the single row.
            unsafe { (self.blocks_x2.$name)(x, [y0, y1]) }
        }
    )*};
}

/// The safe entry of a float-weight kernel.
macro_rules! float_entry {
    ($($name:ident: $width:literal;)*) => {$(
        #[doc = concat!("The dot product of `", stringify!($name), "` weights (little-endian bytes) with f32 ")]
        /// activations, in `vec_dot_f32`'s lane order, on this table's instruction set.
        ///
        /// # Panics
        /// If `w` does not hold exactly `x.len()` weights.
        #[inline]
        pub fn $name(&self, w: &[u8], x: &[f32]) -> f32 {
            assert_eq!(w.len(), $width * x.len(), concat!(stringify!($name), " dot: weight bytes do not match the activations"));
            // SAFETY: as for the block kernels.
            unsafe { (self.$name)(w, x) }
        }
    )*};
}

impl DotKernels {
    /// The table of `isa`, or `None` if this CPU does not support it.
    pub fn for_isa(isa: Isa) -> Option<&'static DotKernels> {
        if !isa.is_supported() {
            return None;
        }
        match isa {
            Isa::Scalar => Some(&SCALAR),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Some(&AVX2),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Some(&AVX512),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }

    /// The instruction set of this table.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    block_entry! {
        q4_0, q4_0_x2: BlockQ4_0, BlockQ8_0;
        q4_1, q4_1_x2: BlockQ4_1, BlockQ8_1;
        q5_0, q5_0_x2: BlockQ5_0, BlockQ8_0;
        q5_1, q5_1_x2: BlockQ5_1, BlockQ8_1;
        q8_0, q8_0_x2: BlockQ8_0, BlockQ8_0;
        q4_k, q4_k_x2: BlockQ4K, BlockQ8K;
        q5_k, q5_k_x2: BlockQ5K, BlockQ8K;
        q6_k, q6_k_x2: BlockQ6K, BlockQ8K;
    }

    float_entry! {
        f32: 4;
        f16: 2;
        bf16: 2;
    }
}

/// Whether the environment variable `name` is set to something other than empty or `0`.
fn env_flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The kernels of the widest instruction set this CPU supports and the environment allows
/// (`MINFER_NO_AVX512`, `MINFER_NO_AVX2`), chosen on the first call.
pub fn kernels() -> &'static DotKernels {
    static CHOSEN: OnceLock<&'static DotKernels> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let isa = Isa::best_supported(env_flag("MINFER_NO_AVX512"), env_flag("MINFER_NO_AVX2"));
        DotKernels::for_isa(isa).unwrap_or(&SCALAR)
    })
}

/// The name of the instruction set [`kernels`] chose: `"avx512-vnni"`, `"avx2"` or `"scalar"`.
pub fn simd_level() -> &'static str {
    kernels().isa().name()
}
