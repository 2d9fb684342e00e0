//! Quantized weight formats: the ggml type table and, per type, the `#[repr(C)]` block layout
//! with its scalar reference quantizer, dequantizer and block dot product.
//!
//! This module owns the byte layout of weights and the arithmetic on one row of blocks, and
//! nothing else: it knows no file format, no tensor shapes and no scheduling. The scalar code
//! here is the specification every SIMD kernel is tested against: the quantizers reproduce
//! ggml's `quantize_row_*_ref` byte for byte, so a file we write is the file llama-quantize
//! writes, and the dot products reproduce ggml-cpu's generic `ggml_vec_dot_*` integer sums and
//! float accumulation order.
//!
//! [`simd`] holds the SIMD forms of the dot products, chosen at run time for the CPU and
//! bit-identical to the scalar ones; [`traits`] is the per-type table (ggml-cpu's
//! `type_traits_cpu`) through which everything above reaches a type's functions, and the entry
//! points here ([`quantize_row`], [`dequantize_row`], [`vec_dot`], ...) check sizes and read it.
//!
//! Adding a type costs its block module (the `#[repr(C)]` struct with the scalar
//! `quantize_row_ref`, `dequantize_row` and `vec_dot_ref`, and its test generator), its SIMD
//! kernels in `simd/x86` if it has any, and one row of the table in [`traits`]. (The GGUF
//! metadata of every ggml type, [`GgmlType`], is here already.)

pub mod choice;
pub mod float;
pub mod fp16;
pub mod gemm;
pub mod iq1_m;
pub mod iq1_s;
pub mod iq2_s;
pub mod iq2_xs;
pub mod iq2_xxs;
pub mod iq3_s;
pub mod iq3_xxs;
pub mod iq4_nl;
pub mod iq4_xs;
mod iq_common;
pub mod iq_grids;
pub mod k_quants;
pub mod mxfp4;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;
pub mod repack;
pub mod simd;
pub mod tq1_0;
pub mod tq2_0;
pub mod traits;

#[cfg(test)]
mod dot_tests;
#[cfg(test)]
pub(crate) mod testing;

use std::fmt;

pub use float::{vec_dot_bf16_ref, vec_dot_f16_ref, vec_dot_f32_ref};
pub use k_quants::QK_K;
pub use simd::simd_level;

/// Errors of the quantization routines: a type we cannot convert, or buffers whose sizes do not
/// describe whole blocks of the type.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    /// The operation has no implementation for the type (e.g. dequantizing IQ2_XXS, or
    /// `vec_dot` of a type with no `vec_dot_type`).
    #[error("{op} is not implemented for ggml type {ggml_type}")]
    UnsupportedType {
        /// The type asked for.
        ggml_type: GgmlType,
        /// The operation (`quantize`, `dequantize`, `vec_dot`, ...).
        op: &'static str,
    },
    /// The value count is not a multiple of the type's block size (32 or QK_K).
    #[error("{op} {ggml_type}: {n} values is not a multiple of the block size {block_size}")]
    PartialBlock {
        /// The type of the row.
        ggml_type: GgmlType,
        /// The operation.
        op: &'static str,
        /// The value count given.
        n: usize,
        /// Values per block of the type.
        block_size: usize,
    },
    /// An importance matrix row of another length than the row it weighs.
    #[error("quantize {ggml_type}: {n} values need {n} importance weights, the matrix has {got}")]
    ImatrixLength {
        /// The type quantized to.
        ggml_type: GgmlType,
        /// The values of the row.
        n: usize,
        /// The weights given.
        got: usize,
    },
    /// The byte buffer is not exactly `n / block_size * type_size` bytes.
    #[error("{op} {ggml_type}: {n} values need {expected} bytes, the buffer has {got}")]
    SizeMismatch {
        /// The type of the row.
        ggml_type: GgmlType,
        /// The operation.
        op: &'static str,
        /// The value count.
        n: usize,
        /// Bytes `n` values of the type occupy.
        expected: usize,
        /// Bytes the buffer has.
        got: usize,
    },
}

macro_rules! ggml_types {
    ($($(#[$doc:meta])* $variant:ident = $id:literal, $name:literal, $block:expr, $size:literal;)*) => {
        /// A ggml tensor type. Discriminants are the GGUF type ids.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u32)]
        pub enum GgmlType { $($(#[$doc])* $variant = $id,)* }

        impl GgmlType {
            /// Every type a GGUF file may name, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant,)*];

            /// The type with GGUF id `id`, or `None` for ids ggml does not define (or removed).
            pub fn from_id(id: u32) -> Option<Self> {
                match id { $($id => Some(GgmlType::$variant),)* _ => None }
            }

            /// The name ggml prints (`Q4_K`, `BF16`, ...).
            pub const fn name(self) -> &'static str {
                match self { $(GgmlType::$variant => $name,)* }
            }

            /// Values per block.
            pub const fn block_size(self) -> usize {
                match self { $(GgmlType::$variant => $block,)* }
            }

            /// Bytes per block.
            pub const fn type_size(self) -> usize {
                match self { $(GgmlType::$variant => $size,)* }
            }
        }
    };
}

// The byte sizes of the types minfer does not compute with are still needed to lay out the
// tensor table of any GGUF file, as ggml's `type_traits` does.
ggml_types! {
    /// 32-bit IEEE float.
    F32 = 0, "F32", 1, 4;
    /// 16-bit IEEE half float.
    F16 = 1, "F16", 1, 2;
    /// Blocks of 32 4-bit values with one f16 scale `d` (4.5 bpw).
    Q4_0 = 2, "Q4_0", 32, 18;
    /// Blocks of 32 4-bit values with an f16 scale `d` and min `m` (5 bpw).
    Q4_1 = 3, "Q4_1", 32, 20;
    /// Blocks of 32 5-bit values with one f16 scale `d` (5.5 bpw).
    Q5_0 = 6, "Q5_0", 32, 22;
    /// Blocks of 32 5-bit values with an f16 scale `d` and min `m` (6 bpw).
    Q5_1 = 7, "Q5_1", 32, 24;
    /// Blocks of 32 8-bit values with one f16 scale `d` (8.5 bpw); also the activation type of
    /// Q4_0, Q5_0, Q8_0, IQ4_NL and MXFP4.
    Q8_0 = 8, "Q8_0", 32, 34;
    /// Blocks of 32 8-bit values with an f16 scale `d` and `s = d * sum(qs)` (9 bpw): the
    /// activation type of Q4_1 and Q5_1.
    Q8_1 = 9, "Q8_1", 32, 36;
    /// k-quant: QK_K super-blocks of 2-bit values, 16 sub-blocks with 4-bit scales and mins (2.625 bpw).
    Q2_K = 10, "Q2_K", QK_K, 84;
    /// k-quant: QK_K super-blocks of 3-bit values, 16 sub-blocks with 6-bit scales (3.4375 bpw).
    Q3_K = 11, "Q3_K", QK_K, 110;
    /// k-quant: QK_K super-blocks of 4-bit values, 8 sub-blocks with 6-bit scales and mins (4.5 bpw).
    Q4_K = 12, "Q4_K", QK_K, 144;
    /// k-quant: QK_K super-blocks of 5-bit values, 8 sub-blocks with 6-bit scales and mins (5.5 bpw).
    Q5_K = 13, "Q5_K", QK_K, 176;
    /// k-quant: QK_K super-blocks of 6-bit values, 16 sub-blocks with 8-bit scales (6.5625 bpw).
    Q6_K = 14, "Q6_K", QK_K, 210;
    /// QK_K super-blocks of 8-bit values with an f32 scale and per-16 sums `bsums` (9.125 bpw):
    /// the activation type of the k-quants and i-quants.
    Q8_K = 15, "Q8_K", QK_K, 292;
    /// i-quant, 2.0625 bpw (E8-lattice codebook).
    IQ2_XXS = 16, "IQ2_XXS", QK_K, 66;
    /// i-quant, 2.3125 bpw.
    IQ2_XS = 17, "IQ2_XS", QK_K, 74;
    /// i-quant, 3.0625 bpw.
    IQ3_XXS = 18, "IQ3_XXS", QK_K, 98;
    /// i-quant, 1.5625 bpw.
    IQ1_S = 19, "IQ1_S", QK_K, 50;
    /// Blocks of 32 4-bit indices into a non-linear codebook with an f16 scale (4.5 bpw).
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    /// i-quant, 3.4375 bpw.
    IQ3_S = 21, "IQ3_S", QK_K, 110;
    /// i-quant, 2.5625 bpw.
    IQ2_S = 22, "IQ2_S", QK_K, 82;
    /// i-quant: IQ4_NL values in QK_K super-blocks with 6-bit sub-block scales (4.25 bpw).
    IQ4_XS = 23, "IQ4_XS", QK_K, 136;
    /// 8-bit signed integer.
    I8 = 24, "I8", 1, 1;
    /// 16-bit signed integer.
    I16 = 25, "I16", 1, 2;
    /// 32-bit signed integer.
    I32 = 26, "I32", 1, 4;
    /// 64-bit signed integer.
    I64 = 27, "I64", 1, 8;
    /// 64-bit IEEE float.
    F64 = 28, "F64", 1, 8;
    /// i-quant, 1.75 bpw.
    IQ1_M = 29, "IQ1_M", QK_K, 56;
    /// bfloat16: the top half of an f32.
    BF16 = 30, "BF16", 1, 2;
    /// Ternary quant of QK_K values, 1.6875 bpw.
    TQ1_0 = 34, "TQ1_0", QK_K, 54;
    /// Ternary quant of QK_K values, 2.0625 bpw.
    TQ2_0 = 35, "TQ2_0", QK_K, 66;
    /// Microscaling FP4: blocks of 32 E2M1 values with a shared E8M0 exponent (4.25 bpw).
    MXFP4 = 39, "MXFP4", 32, 17;
}

/// What ggml calls a tensor type id minfer cannot read, for the error that refuses it: the
/// types llama.cpp removed from GGUF files (the interleaved `Q4_0_4_4` family, which it now
/// repacks at load instead) and those it defines that minfer has no layout for. Empty for ids
/// ggml never defined.
pub fn unreadable_type_id(id: u32) -> &'static str {
    match id {
        4 => " (Q4_2, removed from ggml)",
        5 => " (Q4_3, removed from ggml)",
        31 => " (Q4_0_4_4, removed from GGUF files by llama.cpp: convert the model again)",
        32 => " (Q4_0_4_8, removed from GGUF files by llama.cpp: convert the model again)",
        33 => " (Q4_0_8_8, removed from GGUF files by llama.cpp: convert the model again)",
        36 => " (IQ4_NL_4_4, removed from GGUF files by llama.cpp: convert the model again)",
        37 => " (IQ4_NL_4_8, removed from GGUF files by llama.cpp: convert the model again)",
        38 => " (IQ4_NL_8_8, removed from GGUF files by llama.cpp: convert the model again)",
        40 => " (NVFP4, which minfer does not read yet)",
        41 => " (Q1_0, which minfer does not read yet)",
        42 => " (Q2_0, which minfer does not read yet)",
        _ => "",
    }
}

impl GgmlType {
    /// The types minfer can dequantize (and so load as weights): the rows of the type table
    /// ([`traits`]), in its order.
    pub const SUPPORTED: &'static [GgmlType] = traits::TYPES;

    /// Whether [`dequantize_row`] and [`quantize_row`] handle this type.
    pub fn is_supported(self) -> bool {
        Self::SUPPORTED.contains(&self)
    }

    /// The type named `name` as ggml spells it, case-insensitively (`q4_k` is `Q4_K`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// The type ggml quantizes activations to before dotting them with a weight row of this type
    /// (ggml-cpu's `vec_dot_type`). `None` for the float types F32, F16 and BF16, whose rows
    /// [`vec_dot_f32`] dots with f32 activations directly, and for the types that are never
    /// weights of a dot product (the integer types, F64, and the activation-only Q8_1 and Q8_K).
    /// Types with a ggml dot product that minfer does not implement still name their activation
    /// type; [`vec_dot`] refuses them.
    pub const fn vec_dot_type(self) -> Option<GgmlType> {
        use GgmlType::*;
        match self {
            Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 => Some(Q8_0),
            Q4_1 | Q5_1 => Some(Q8_1),
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S | IQ3_S | IQ2_S | IQ4_XS | IQ1_M
            | TQ1_0 | TQ2_0 => Some(Q8_K),
            F32 | F16 | BF16 | Q8_1 | Q8_K | I8 | I16 | I32 | I64 | F64 => None,
        }
    }

    /// Bytes of a row of `n` values, or `None` if `n` is not a whole number of blocks or the
    /// size overflows.
    pub fn row_size(self, n: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !n.is_multiple_of(block) {
            return None;
        }
        (n / block).checked_mul(self.type_size() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn check_sizes(ty: GgmlType, op: &'static str, n: usize, bytes: usize) -> Result<(), QuantError> {
    let block_size = ty.block_size();
    if !n.is_multiple_of(block_size) {
        return Err(QuantError::PartialBlock {
            ggml_type: ty,
            op,
            n,
            block_size,
        });
    }
    let expected = n / block_size * ty.type_size();
    if bytes != expected {
        return Err(QuantError::SizeMismatch {
            ggml_type: ty,
            op,
            n,
            expected,
            got: bytes,
        });
    }
    Ok(())
}

/// The row of `ty` in the type table, after checking that `bytes` hold exactly `n` values of it.
fn checked_row(
    ty: GgmlType,
    op: &'static str,
    n: usize,
    bytes: usize,
) -> Result<&'static traits::TypeTraits, QuantError> {
    check_sizes(ty, op, n, bytes)?;
    traits::get(ty).ok_or(QuantError::UnsupportedType { ggml_type: ty, op })
}

/// Quantize one row `src` of `ty` (a whole number of blocks) into `dst` with its importance
/// matrix `imatrix`, one weight per column (llama-quantize's `--imatrix`): ggml's
/// `quantize_*` given `quant_weights`, which for the types whose quantizer ignores the matrix
/// (Q8_0, MXFP4, the ternary and float types) is the reference. The weighted quantizers of the
/// 32-value types take the row's mean square, so `src` must be exactly one row.
pub fn quantize_row_imatrix(ty: GgmlType, src: &[f32], imatrix: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let row = writable_row(ty, src.len(), dst.len())?;
    if imatrix.len() != src.len() {
        return Err(QuantError::ImatrixLength {
            ggml_type: ty,
            n: src.len(),
            got: imatrix.len(),
        });
    }
    row.quantize_imatrix(src, imatrix, dst);
    Ok(())
}

/// Whether minfer writes `ty`: [`quantize_row`] quantizes to it. The types minfer only reads
/// (the i-quants llama.cpp quantizes only with an importance matrix, and those whose search is
/// not written yet) answer `false`.
pub fn can_quantize(ty: GgmlType) -> bool {
    traits::get(ty).is_some_and(|row| row.can_quantize())
}

/// The row of `ty` for quantizing `n` values into `bytes`: checked sizes, and a type minfer
/// writes.
fn writable_row(ty: GgmlType, n: usize, bytes: usize) -> Result<&'static traits::TypeTraits, QuantError> {
    Some(checked_row(ty, "quantize", n, bytes)?)
        .filter(|row| row.can_quantize())
        .ok_or(QuantError::UnsupportedType {
            ggml_type: ty,
            op: "quantize",
        })
}

/// [`quantize_row`] with the quantizer the type table chose for this CPU: the reference
/// compiled for AVX-512 where that was chosen, which vectorizes the activation quantizers'
/// loops. The bytes are `quantize_row`'s.
#[inline]
pub fn quantize_activation_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    writable_row(ty, src.len(), dst.len())?.quantize(src, dst);
    Ok(())
}

/// Convert `src` (a whole number of blocks of `ty`) to f32 values in `dst`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    checked_row(ty, "dequantize", dst.len(), src.len())?.dequantize(src, dst);
    Ok(())
}

/// Quantize the f32 values `src` (a whole number of blocks of `ty`) into `dst` with ggml's
/// reference quantizer for the type.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    writable_row(ty, src.len(), dst.len())?.quantize_ref(src, dst);
    Ok(())
}

/// Dot product of one weight row of `ty` (`w`, `n` values) with one activation row already
/// quantized to `ty.vec_dot_type()` (`a`, `n` values), with ggml's generic block arithmetic,
/// computed by the kernels of the type table ([`traits`], bit-identical to the scalar
/// references).
///
/// Block slices are viewed in place when aligned for their block type (rows of GGUF tensor data
/// always are) and copied otherwise.
pub fn vec_dot(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> Result<f32, QuantError> {
    let dots = traits::block_dots(ty)?;
    let aty = ty
        .vec_dot_type()
        .expect("a type with a dot product has an activation type");
    check_sizes(ty, "vec_dot weight", n, w.len())?;
    check_sizes(aty, "vec_dot activation", n, a.len())?;
    Ok(dots.dot(w, a))
}

/// Dot product of one weight row of a float type (F32, F16 or BF16; `w`, `x.len()` values,
/// little-endian) with f32 activations `x`. Each weight is widened to f32 exactly and the
/// products are accumulated in f32.
///
/// The accumulation order is part of the result: eight running sums, lane `l` taking the
/// products `i` with `i % 8 == l` of the leading multiple of 8; the lanes are then added in order
/// and the remaining products after them. Eight independent sums are what lets the compiler keep
/// them in one vector register. Computed by the kernels of the type table ([`traits`]).
pub fn vec_dot_f32(ty: GgmlType, w: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    const OP: &str = "vec_dot_f32";
    let dot = traits::float_dot(ty)?;
    check_sizes(ty, OP, x.len(), w.len())?;
    Ok(dot.dot(w, x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_ids_and_names_round_trip() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t as u32), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None, "Q4_2 was removed from ggml");
        assert_eq!(GgmlType::from_name("q4_k"), Some(GgmlType::Q4_K));
    }

    #[test]
    fn a_partial_block_is_refused_with_the_sizes() {
        let err = dequantize_row(GgmlType::Q4_0, &[0; 18], &mut [0.0; 31]).unwrap_err();
        assert_eq!(
            err,
            QuantError::PartialBlock {
                ggml_type: GgmlType::Q4_0,
                op: "dequantize",
                n: 31,
                block_size: 32
            }
        );
        let err = quantize_row(GgmlType::Q8_0, &[0.0; 32], &mut [0; 33]).unwrap_err();
        assert!(err.to_string().contains("need 34 bytes, the buffer has 33"), "{err}");
    }

    #[test]
    fn an_unsupported_type_names_itself() {
        let err = dequantize_row(GgmlType::I8, &[0; 1], &mut [0.0; 1]).unwrap_err();
        assert_eq!(err.to_string(), "dequantize is not implemented for ggml type I8");
        let err = quantize_row(GgmlType::IQ2_XXS, &[0.0; 256], &mut [0; 66]).unwrap_err();
        assert_eq!(err.to_string(), "quantize is not implemented for ggml type IQ2_XXS");
    }

    #[test]
    fn q8_k_quantizes_the_largest_magnitude_to_minus_127_and_sums_groups() {
        // Analytic check: x = 0.5 * (j - 128); the largest magnitude is x[0] = -64, so
        // iscale = -127 / -64 and q[j] = round(127 * (j - 128) / 128).
        let x: Vec<f32> = (0..256).map(|j| 0.5 * (j as f32 - 128.0)).collect();
        let mut block = [q8_k::BlockQ8K {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16],
        }];
        q8_k::quantize_row_ref(&x, &mut block);
        let b = &block[0];
        assert_eq!(b.d, 1.0 / (127.0 / 64.0));
        for j in 0..256 {
            let expected = (127.0f64 * (j as f64 - 128.0) / 128.0).round() as i8;
            assert_eq!(b.qs[j], expected, "q[{j}]");
        }
        for g in 0..16 {
            let sum: i16 = b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum();
            assert_eq!(b.bsums[g], sum);
        }
    }
}
