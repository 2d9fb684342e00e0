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
//! bit-identical to the scalar ones.
//!
//! Adding a type touches one block module and one row of [`GgmlType`]'s tables.

pub mod fp16;
pub mod gemm;
pub mod k_quants;
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
pub mod simd;

#[cfg(test)]
mod dot_tests;

use bytemuck::Pod;
use std::fmt;

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
            pub fn name(self) -> &'static str {
                match self { $(GgmlType::$variant => $name,)* }
            }

            /// Values per block.
            pub fn block_size(self) -> usize {
                match self { $(GgmlType::$variant => $block,)* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> usize {
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

impl GgmlType {
    /// The types minfer can dequantize (and so load as weights).
    pub const SUPPORTED: &'static [GgmlType] = &[
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
    ];

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
    pub fn vec_dot_type(self) -> Option<GgmlType> {
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

/// View `bytes` as blocks; copies only when the bytes are not aligned for the block type
/// (tensor data in a GGUF file always is; arbitrary slices may not be).
fn with_blocks<B: Pod, R>(bytes: &[u8], f: impl FnOnce(&[B]) -> R) -> R {
    match bytemuck::try_cast_slice::<u8, B>(bytes) {
        Ok(blocks) => f(blocks),
        Err(_) => {
            let copied: Vec<B> = bytes
                .chunks_exact(std::mem::size_of::<B>())
                .map(bytemuck::pod_read_unaligned)
                .collect();
            f(&copied)
        }
    }
}

/// Quantize into a block vector, then copy out: the destination may be unaligned.
fn into_blocks<B: Pod>(dst: &mut [u8], f: impl FnOnce(&mut [B])) {
    match bytemuck::try_cast_slice_mut::<u8, B>(dst) {
        Ok(blocks) => f(blocks),
        Err(_) => {
            let mut blocks = vec![B::zeroed(); dst.len() / std::mem::size_of::<B>()];
            f(&mut blocks);
            dst.copy_from_slice(bytemuck::cast_slice(&blocks));
        }
    }
}

/// [`quantize_row`] for the activation types Q8_0, Q8_1 and Q8_K (any other type goes to
/// `quantize_row`), inlined into its caller with the quantizer, so that a caller compiled for
/// wider vectors vectorizes the quantizer too. The bytes are `quantize_row`'s.
#[inline(always)]
pub fn quantize_activation_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8_K => check_sizes(ty, "quantize", src.len(), dst.len())?,
        _ => return quantize_row(ty, src, dst),
    }
    // Direct calls on blocks viewed in place (no closure for the compiler to leave out of line);
    // an unaligned destination takes `quantize_row`'s copying path.
    match ty {
        GgmlType::Q8_0 => match bytemuck::try_cast_slice_mut(dst) {
            Ok(blocks) => q8_0::quantize_row_ref(src, blocks),
            Err(_) => return quantize_row(ty, src, dst),
        },
        GgmlType::Q8_1 => match bytemuck::try_cast_slice_mut(dst) {
            Ok(blocks) => q8_1::quantize_row_ref(src, blocks),
            Err(_) => return quantize_row(ty, src, dst),
        },
        _ => match bytemuck::try_cast_slice_mut(dst) {
            Ok(blocks) => q8_k::quantize_row_ref(src, blocks),
            Err(_) => return quantize_row(ty, src, dst),
        },
    }
    Ok(())
}

/// Convert `src` (a whole number of blocks of `ty`) to f32 values in `dst`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    const OP: &str = "dequantize";
    check_sizes(ty, OP, dst.len(), src.len())?;
    match ty {
        GgmlType::F32 => {
            for (out, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *out = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (out, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *out = fp16::f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlType::BF16 => {
            for (out, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *out = fp16::bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlType::Q4_0 => with_blocks(src, |b| q4_0::dequantize_row(b, dst)),
        GgmlType::Q4_1 => with_blocks(src, |b| q4_1::dequantize_row(b, dst)),
        GgmlType::Q5_0 => with_blocks(src, |b| q5_0::dequantize_row(b, dst)),
        GgmlType::Q5_1 => with_blocks(src, |b| q5_1::dequantize_row(b, dst)),
        GgmlType::Q8_0 => with_blocks(src, |b| q8_0::dequantize_row(b, dst)),
        GgmlType::Q8_1 => with_blocks(src, |b| q8_1::dequantize_row(b, dst)),
        GgmlType::Q4_K => with_blocks(src, |b| q4_k::dequantize_row(b, dst)),
        GgmlType::Q5_K => with_blocks(src, |b| q5_k::dequantize_row(b, dst)),
        GgmlType::Q6_K => with_blocks(src, |b| q6_k::dequantize_row(b, dst)),
        GgmlType::Q8_K => with_blocks(src, |b| q8_k::dequantize_row(b, dst)),
        _ => return Err(QuantError::UnsupportedType { ggml_type: ty, op: OP }),
    }
    Ok(())
}

/// Quantize the f32 values `src` (a whole number of blocks of `ty`) into `dst` with ggml's
/// reference quantizer for the type.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    const OP: &str = "quantize";
    check_sizes(ty, OP, src.len(), dst.len())?;
    match ty {
        GgmlType::F32 => {
            for (b, v) in dst.chunks_exact_mut(4).zip(src) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (b, &v) in dst.chunks_exact_mut(2).zip(src) {
                b.copy_from_slice(&fp16::f32_to_f16(v).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (b, &v) in dst.chunks_exact_mut(2).zip(src) {
                b.copy_from_slice(&fp16::f32_to_bf16(v).to_le_bytes());
            }
        }
        GgmlType::Q4_0 => into_blocks(dst, |b| q4_0::quantize_row_ref(src, b)),
        GgmlType::Q4_1 => into_blocks(dst, |b| q4_1::quantize_row_ref(src, b)),
        GgmlType::Q5_0 => into_blocks(dst, |b| q5_0::quantize_row_ref(src, b)),
        GgmlType::Q5_1 => into_blocks(dst, |b| q5_1::quantize_row_ref(src, b)),
        GgmlType::Q8_0 => into_blocks(dst, |b| q8_0::quantize_row_ref(src, b)),
        GgmlType::Q8_1 => into_blocks(dst, |b| q8_1::quantize_row_ref(src, b)),
        GgmlType::Q4_K => into_blocks(dst, |b| q4_k::quantize_row_ref(src, b)),
        GgmlType::Q5_K => into_blocks(dst, |b| q5_k::quantize_row_ref(src, b)),
        GgmlType::Q6_K => into_blocks(dst, |b| q6_k::quantize_row_ref(src, b)),
        GgmlType::Q8_K => into_blocks(dst, |b| q8_k::quantize_row_ref(src, b)),
        _ => return Err(QuantError::UnsupportedType { ggml_type: ty, op: OP }),
    }
    Ok(())
}

/// Dot product of one weight row of `ty` (`w`, `n` values) with one activation row already
/// quantized to `ty.vec_dot_type()` (`a`, `n` values), with ggml's generic block arithmetic,
/// computed by the kernels of [`simd::kernels`] (bit-identical to the scalar references).
///
/// Block slices are viewed in place when aligned for their block type (rows of GGUF tensor data
/// always are) and copied otherwise.
pub fn vec_dot(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> Result<f32, QuantError> {
    const OP: &str = "vec_dot";
    let unsupported = QuantError::UnsupportedType { ggml_type: ty, op: OP };
    let Some(aty) = ty.vec_dot_type() else {
        return Err(unsupported);
    };
    check_sizes(ty, "vec_dot weight", n, w.len())?;
    check_sizes(aty, "vec_dot activation", n, a.len())?;
    let k = simd::kernels();
    let dot = match ty {
        GgmlType::Q4_0 => dot_blocks(w, a, |x, y| k.q4_0(x, y)),
        GgmlType::Q4_1 => dot_blocks(w, a, |x, y| k.q4_1(x, y)),
        GgmlType::Q5_0 => dot_blocks(w, a, |x, y| k.q5_0(x, y)),
        GgmlType::Q5_1 => dot_blocks(w, a, |x, y| k.q5_1(x, y)),
        GgmlType::Q8_0 => dot_blocks(w, a, |x, y| k.q8_0(x, y)),
        GgmlType::Q4_K => dot_blocks(w, a, |x, y| k.q4_k(x, y)),
        GgmlType::Q5_K => dot_blocks(w, a, |x, y| k.q5_k(x, y)),
        GgmlType::Q6_K => dot_blocks(w, a, |x, y| k.q6_k(x, y)),
        _ => return Err(unsupported),
    };
    Ok(dot)
}

fn dot_blocks<W: Pod, A: Pod>(w: &[u8], a: &[u8], dot: impl FnOnce(&[W], &[A]) -> f32) -> f32 {
    with_blocks(w, |x| with_blocks(a, |y| dot(x, y)))
}

/// Dot product of one weight row of a float type (F32, F16 or BF16; `w`, `x.len()` values,
/// little-endian) with f32 activations `x`. Each weight is widened to f32 exactly and the
/// products are accumulated in f32.
///
/// The accumulation order is part of the result: eight running sums, lane `l` taking the
/// products `i` with `i % 8 == l` of the leading multiple of 8; the lanes are then added in order
/// and the remaining products after them. Eight independent sums are what lets the compiler keep
/// them in one vector register. Computed by the kernels of [`simd::kernels`].
pub fn vec_dot_f32(ty: GgmlType, w: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    const OP: &str = "vec_dot_f32";
    if !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return Err(QuantError::UnsupportedType { ggml_type: ty, op: OP });
    }
    check_sizes(ty, OP, x.len(), w.len())?;
    let k = simd::kernels();
    Ok(match ty {
        GgmlType::F32 => k.f32(w, x),
        GgmlType::F16 => k.f16(w, x),
        _ => k.bf16(w, x),
    })
}

/// The scalar reference of [`vec_dot_f32`] for F32 weights (`w` holds `4 * x.len()` bytes).
pub fn vec_dot_f32_ref(w: &[u8], x: &[f32]) -> f32 {
    dot_widened(w, x, f32::from_le_bytes)
}

/// The scalar reference of [`vec_dot_f32`] for F16 weights (`w` holds `2 * x.len()` bytes).
pub fn vec_dot_f16_ref(w: &[u8], x: &[f32]) -> f32 {
    dot_widened(w, x, |b| fp16::f16_to_f32(u16::from_le_bytes(b)))
}

/// The scalar reference of [`vec_dot_f32`] for BF16 weights (`w` holds `2 * x.len()` bytes).
pub fn vec_dot_bf16_ref(w: &[u8], x: &[f32]) -> f32 {
    dot_widened(w, x, |b| fp16::bf16_to_f32(u16::from_le_bytes(b)))
}

/// The lane accumulation of [`vec_dot_f32`] for weights of `W` bytes each; generic so that the
/// widening is inlined into the loop.
fn dot_widened<const W: usize>(w: &[u8], x: &[f32], widen: impl Fn([u8; W]) -> f32) -> f32 {
    let widen_at = |b: &[u8]| {
        let mut bytes = [0u8; W];
        bytes.copy_from_slice(b);
        widen(bytes)
    };
    let mut lanes = [0.0f32; 8];
    let w_chunks = w.chunks_exact(8 * W);
    let x_chunks = x.chunks_exact(8);
    let (w_tail, x_tail) = (w_chunks.remainder(), x_chunks.remainder());
    for (wc, xc) in w_chunks.zip(x_chunks) {
        for ((lane, wv), &xv) in lanes.iter_mut().zip(wc.chunks_exact(W)).zip(xc) {
            *lane += widen_at(wv) * xv;
        }
    }
    let mut sum = 0.0f32;
    for lane in lanes {
        sum += lane;
    }
    for (wv, &xv) in w_tail.chunks_exact(W).zip(x_tail) {
        sum += widen_at(wv) * xv;
    }
    sum
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
    fn block_sizes_match_the_repr_c_blocks() {
        use std::mem::size_of;
        assert_eq!(GgmlType::Q4_0.type_size(), size_of::<q4_0::BlockQ4_0>());
        assert_eq!(GgmlType::Q4_1.type_size(), size_of::<q4_1::BlockQ4_1>());
        assert_eq!(GgmlType::Q5_0.type_size(), size_of::<q5_0::BlockQ5_0>());
        assert_eq!(GgmlType::Q5_1.type_size(), size_of::<q5_1::BlockQ5_1>());
        assert_eq!(GgmlType::Q8_0.type_size(), size_of::<q8_0::BlockQ8_0>());
        assert_eq!(GgmlType::Q8_1.type_size(), size_of::<q8_1::BlockQ8_1>());
        assert_eq!(GgmlType::Q4_K.type_size(), size_of::<q4_k::BlockQ4K>());
        assert_eq!(GgmlType::Q5_K.type_size(), size_of::<q5_k::BlockQ5K>());
        assert_eq!(GgmlType::Q6_K.type_size(), size_of::<q6_k::BlockQ6K>());
        assert_eq!(GgmlType::Q8_K.type_size(), size_of::<q8_k::BlockQ8K>());
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
        let err = dequantize_row(GgmlType::IQ2_XXS, &[0; 66], &mut [0.0; 256]).unwrap_err();
        assert_eq!(err.to_string(), "dequantize is not implemented for ggml type IQ2_XXS");
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
