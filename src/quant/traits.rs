//! The per-type table, as ggml-cpu's `type_traits_cpu[]`: one row per type minfer computes
//! with, holding all the rest of the crate needs of the type — its block and type sizes, its
//! activation type (`vec_dot_type`), its reference quantizer and its dequantizer — and the
//! kernels of one instruction set: the dot product with one activation row and with two, of four
//! weight rows with one (decoding) or of two with two (`i8mm`'s prompt tiles) where there is
//! one, the quantizer that prepares activations, and the prefill panel kernel where there is one.
//!
//! The rows are written once, in the `type_table!` at the bottom of this file, and built at
//! compile time into one static table per instruction set; [`table`] builds the one minfer
//! computes with at start-up: the rows of the widest instruction set allowed ([`simd::isa`]),
//! each quantized type's dot products from the table of the kernel measured fastest for it on
//! this CPU (`super::choice`). A kernel is one indirect call through its row, no more than the
//! per-type dispatch before the table cost. Nothing outside this file switches on a type to
//! find a kernel: `quant`'s entry points, the matmul, `gemm` and the tests read rows.
//!
//! This module owns which function serves which type, and must hold no arithmetic: that is the
//! block modules' (the scalar references), `simd`'s and `gemm`'s. Adding a type costs its block
//! module, its SIMD kernels (if any) in `simd/x86` and `simd/aarch64`, and one row here.

use super::gemm::PanelKernel;
use super::simd::{self, Isa};
use super::{float, GgmlType, QuantError};
use super::{
    iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs, iq4_nl, iq4_xs, mxfp4, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0,
    q5_1, q5_k, q6_k, q8_0, q8_1, q8_k, tq1_0, tq2_0,
};
use bytemuck::Pod;
use std::sync::OnceLock;

#[cfg(target_arch = "aarch64")]
use super::simd::aarch64::{float as simd_float, k_quants, legacy};
#[cfg(target_arch = "x86_64")]
use super::simd::x86::{self, float as simd_float, iq_quants, k_quants, legacy};

#[cfg(test)]
use super::testing::TestHooks;

/// A dot product of one weight row with `N` activation rows, on their bytes (the SIMD kernels
/// and the scalar references have this signature).
///
/// # Safety
/// The CPU runs the instruction set of the table holding the kernel. Rows that are not aligned
/// whole blocks of one count make a kernel panic, never read out of bounds.
type BlockKernel<const N: usize> = unsafe fn(&[u8], [&[u8]; N]) -> [f32; N];

/// A dot product of `R` weight rows with one activation row, on their bytes.
///
/// # Safety
/// As for [`BlockKernel`].
type RowsKernel<const R: usize> = unsafe fn([&[u8]; R], &[u8]) -> [f32; R];

/// A dot product of two weight rows with two activation rows, on their bytes: `[row][token]`.
///
/// # Safety
/// As for [`BlockKernel`].
type PairKernel = unsafe fn([&[u8]; 2], [&[u8]; 2]) -> [[f32; 2]; 2];

/// The weight rows of a [`BlockDots::dot_rows`] call.
pub const DOT_ROWS: usize = 4;

/// A dot product of one float weight row with f32 activations.
///
/// # Safety
/// As for [`BlockKernel`].
type FloatKernel = unsafe fn(&[u8], &[f32]) -> f32;

/// A quantizer of f32 values into a row of blocks.
///
/// # Safety
/// As for [`BlockKernel`].
type Quantizer = unsafe fn(&[f32], &mut [u8]);

/// A reference quantizer of f32 values into a row of blocks (safe: portable code).
type RefQuantizer = fn(&[f32], &mut [u8]);

/// A quantizer of one row of f32 values with its importance matrix (one weight per column) into
/// blocks: ggml's `quantize_*` given `quant_weights`.
type ImatrixQuantizer = fn(&[f32], &[f32], &mut [u8]);

/// How a row of the type is dotted with activations.
#[derive(Clone, Copy)]
enum Dot {
    /// Never: an activation-only type (Q8_1, Q8_K).
    None,
    /// Float weights against f32 activations.
    Float(FloatKernel),
    /// Quantized weights against activations quantized to the row's `vec_dot_type`.
    Blocks {
        one: BlockKernel<1>,
        two: Option<BlockKernel<2>>,
        rows: Option<RowsKernel<DOT_ROWS>>,
        pair: Option<PairKernel>,
        /// Bytes of an activation block.
        a_size: usize,
        /// The alignments of the weight and the activation blocks.
        align: (usize, usize),
    },
}

/// One type's row of the table: its sizes and activation type, its conversions, and its
/// kernels on the table's instruction set.
#[derive(Clone)]
pub struct TypeTraits {
    /// The type of the row.
    pub ty: GgmlType,
    /// Values per block.
    pub block_size: usize,
    /// Bytes per block.
    pub type_size: usize,
    /// The type the dot product takes activations in (ggml's `vec_dot_type`): `None` for the
    /// float types, which take f32, and for the activation-only Q8_1 and Q8_K.
    pub vec_dot_type: Option<GgmlType>,
    to_float: fn(&[u8], &mut [f32]),
    /// The reference quantizer and its compiled form; `None` for the types minfer reads but does
    /// not write (the i-quants llama.cpp quantizes only with an importance matrix).
    from_float_ref: Option<RefQuantizer>,
    from_float: Option<Quantizer>,
    /// The quantizer that weighs an importance matrix; `None` where ggml's ignores it (the
    /// reference serves) or the type is not written.
    from_float_imatrix: Option<ImatrixQuantizer>,
    dot: Dot,
    panel: Option<PanelKernel>,
    /// What the tests need to know of the layout; `None` for the float types.
    #[cfg(test)]
    pub(crate) test: Option<TestHooks>,
}

impl TypeTraits {
    /// Whether the type is a matmul weight: it has a dot product.
    pub fn is_weight(&self) -> bool {
        !matches!(self.dot, Dot::None)
    }

    /// The dot products of a quantized weight type.
    #[inline]
    pub fn block_dots(&self) -> Option<BlockDots> {
        match self.dot {
            Dot::Blocks {
                one,
                two,
                rows,
                pair,
                a_size,
                align,
            } => Some(BlockDots {
                one,
                two,
                rows,
                pair,
                w_size: self.type_size,
                a_size,
                align,
            }),
            Dot::None | Dot::Float(_) => None,
        }
    }

    /// The dot product of a float weight type with f32 activations.
    #[inline]
    pub fn float_dot(&self) -> Option<FloatDot> {
        match self.dot {
            Dot::Float(kernel) => Some(FloatDot {
                kernel,
                width: self.type_size,
            }),
            Dot::None | Dot::Blocks { .. } => None,
        }
    }

    /// The prefill matrix-matrix kernel, in the AVX-512 table only (`gemm::kernel` also wants
    /// AVX-512 BW).
    pub fn panel(&self) -> Option<PanelKernel> {
        self.panel
    }

    /// The dequantizer: `src` whole blocks, `dst` their values (sizes checked by the caller).
    pub(crate) fn dequantize(&self, src: &[u8], dst: &mut [f32]) {
        (self.to_float)(src, dst)
    }

    /// Quantizes one row `src` with its importance matrix `imatrix` (one weight per column):
    /// the type's weighted quantizer, or the reference where ggml ignores the matrix.
    ///
    /// # Panics
    /// For a type without a quantizer ([`Self::can_quantize`]).
    pub(crate) fn quantize_imatrix(&self, src: &[f32], imatrix: &[f32], dst: &mut [u8]) {
        match self.from_float_imatrix {
            Some(quantize) => quantize(src, imatrix, dst),
            None => self.quantize_ref(src, dst),
        }
    }

    /// Whether minfer writes the type: it has a reference quantizer.
    pub fn can_quantize(&self) -> bool {
        self.from_float_ref.is_some()
    }

    /// The reference quantizer (ggml's `quantize_row_*_ref`): `src` whole blocks of values,
    /// `dst` their bytes (sizes checked by the caller).
    ///
    /// # Panics
    /// For a type without a quantizer ([`Self::can_quantize`]).
    pub(crate) fn quantize_ref(&self, src: &[f32], dst: &mut [u8]) {
        (self.from_float_ref.expect("a quantizer checked with can_quantize"))(src, dst)
    }

    /// The reference quantizer compiled for the table's instruction set (where its loops
    /// vectorize): the same operations, so the same bytes as [`Self::quantize_ref`].
    ///
    /// # Panics
    /// For a type without a quantizer ([`Self::can_quantize`]).
    pub(crate) fn quantize(&self, src: &[f32], dst: &mut [u8]) {
        let quantize = self.from_float.expect("a quantizer checked with can_quantize");
        // SAFETY: a table is handed out only for an instruction set the CPU runs (`for_isa`).
        unsafe { quantize(src, dst) }
    }
}

/// The dot products of a quantized weight type on its table's instruction set: safe entries
/// that check the rows once and make one call.
#[derive(Clone, Copy)]
pub struct BlockDots {
    one: BlockKernel<1>,
    two: Option<BlockKernel<2>>,
    rows: Option<RowsKernel<DOT_ROWS>>,
    pair: Option<PairKernel>,
    w_size: usize,
    a_size: usize,
    /// The alignments of the weight and the activation blocks.
    align: (usize, usize),
}

impl BlockDots {
    /// The dot product of the weight row `w` with the activation row `a` (whole blocks of the
    /// weight type and of its `vec_dot_type`). Rows not aligned for their blocks are copied
    /// (correct, slow; GGUF tensor data and quantized activations always are).
    ///
    /// # Panics
    /// If the rows do not hold the same number of blocks.
    // Always inlined: in the matmul's row loop the kernel's indirect call is then the only one,
    // as it was before the table (a call layer here cost 1-2 % of a decode step).
    #[inline(always)]
    pub fn dot(&self, w: &[u8], a: &[u8]) -> f32 {
        self.check(w, a);
        if !self.aligned(w, a) {
            return self.copied(w, [a], |w, ys| [self.dot(w, ys[0])])[0];
        }
        // SAFETY: the table holding the kernel runs on this CPU (`for_isa`); the rows are
        // aligned and of one block count.
        unsafe { (self.one)(w, [a])[0] }
    }

    /// `[self.dot(w, a0), self.dot(w, a1)]`, unpacking each weight block once where the type
    /// has a two-row kernel.
    ///
    /// # Panics
    /// If the rows do not hold the same number of blocks.
    #[inline(always)]
    pub fn dot_x2(&self, w: &[u8], a0: &[u8], a1: &[u8]) -> [f32; 2] {
        let Some(two) = self.two else {
            return [self.dot(w, a0), self.dot(w, a1)];
        };
        self.check(w, a0);
        assert_eq!(
            a0.len(),
            a1.len(),
            "dot product: the activation rows' block counts differ"
        );
        if !self.aligned(w, a0) || a1.as_ptr() as usize & (self.align.1 - 1) != 0 {
            return self.copied(w, [a0, a1], |w, ys| self.dot_x2(w, ys[0], ys[1]));
        }
        // SAFETY: as for `dot`.
        unsafe { two(w, [a0, a1]) }
    }

    /// `[self.dot(ws[0], a), ...]`: [`DOT_ROWS`] weight rows against one activation row, reading
    /// each activation block once for all of them (decoding's matrix-vector product).
    ///
    /// # Panics
    /// If the rows do not hold the same number of blocks.
    #[inline(always)]
    pub fn dot_rows(&self, ws: [&[u8]; DOT_ROWS], a: &[u8]) -> [f32; DOT_ROWS] {
        let Some(rows) = self.rows else {
            return ws.map(|w| self.dot(w, a));
        };
        for w in ws {
            self.check(w, a);
        }
        if ws.iter().any(|w| !self.aligned(w, a)) {
            return ws.map(|w| self.dot(w, a));
        }
        // SAFETY: as for `dot`.
        unsafe { rows(ws, a) }
    }

    /// Whether [`Self::dot_2x2`] has a kernel of its own (SMMLA's): then a prompt's product is
    /// best taken two weight rows by two tokens.
    #[inline(always)]
    pub fn has_2x2(&self) -> bool {
        self.pair.is_some()
    }

    /// `[[self.dot(w0, a0), self.dot(w0, a1)], [self.dot(w1, a0), self.dot(w1, a1)]]`: two
    /// weight rows with two activation rows, in one kernel where the type has one
    /// ([`Self::has_2x2`]).
    ///
    /// # Panics
    /// If the rows do not hold the same number of blocks.
    #[inline(always)]
    pub fn dot_2x2(&self, ws: [&[u8]; 2], a: [&[u8]; 2]) -> [[f32; 2]; 2] {
        let Some(pair) = self.pair else {
            return ws.map(|w| self.dot_x2(w, a[0], a[1]));
        };
        for w in ws {
            for a in a {
                self.check(w, a);
            }
        }
        if ws.iter().any(|w| a.iter().any(|a| !self.aligned(w, a))) {
            return ws.map(|w| self.dot_x2(w, a[0], a[1]));
        }
        // SAFETY: as for `dot`.
        unsafe { pair(ws, a) }
    }

    /// Decoding's matrix-vector product: `y[i] = self.dot(w_i, a)` for the weight rows `w_i` of
    /// `w` (`y.len()` rows of `w_row` bytes each), [`DOT_ROWS`] rows at a time (the kernels read
    /// each activation block once for them), then the rows left over.
    ///
    /// # Panics
    /// If `w` is not `y.len()` rows of `w_row` bytes, or a row and `a` differ in block count.
    pub fn matvec(&self, w: &[u8], w_row: usize, a: &[u8], y: &mut [f32]) {
        assert_eq!(w.len(), y.len() * w_row, "matvec: the weight is not one row per output");
        let mut quads = w.chunks_exact(DOT_ROWS * w_row);
        let mut outs = y.chunks_exact_mut(DOT_ROWS);
        for (ws, out) in (&mut quads).zip(&mut outs) {
            let ws: [&[u8]; DOT_ROWS] = std::array::from_fn(|k| &ws[k * w_row..(k + 1) * w_row]);
            out.copy_from_slice(&self.dot_rows(ws, a));
        }
        for (wr, out) in quads.remainder().chunks_exact(w_row).zip(outs.into_remainder()) {
            *out = self.dot(wr, a);
        }
    }

    #[inline(always)]
    fn check(&self, w: &[u8], a: &[u8]) {
        assert!(
            w.len() * self.a_size == a.len() * self.w_size,
            "dot product: weight and activation block counts differ ({} and {} bytes)",
            w.len(),
            a.len()
        );
    }

    #[inline(always)]
    fn aligned(&self, w: &[u8], a: &[u8]) -> bool {
        let (w_align, a_align) = self.align;
        (w.as_ptr() as usize & (w_align - 1)) | (a.as_ptr() as usize & (a_align - 1)) == 0
    }

    /// `f` on aligned copies of the rows.
    #[cold]
    #[inline(never)]
    fn copied<const N: usize>(&self, w: &[u8], ys: [&[u8]; N], f: impl Fn(&[u8], [&[u8]; N]) -> [f32; N]) -> [f32; N] {
        // u64 words are aligned for every block type.
        let words = |b: &[u8]| {
            let mut v = vec![0u64; b.len().div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..b.len()].copy_from_slice(b);
            v
        };
        let w_copy = words(w);
        let y_copies = ys.map(words);
        let mut y_bytes: [&[u8]; N] = [&[]; N];
        for ((c, y), copy) in y_bytes.iter_mut().zip(ys).zip(&y_copies) {
            *c = &bytemuck::cast_slice(copy)[..y.len()];
        }
        f(&bytemuck::cast_slice(&w_copy)[..w.len()], y_bytes)
    }
}

/// The dot product of a float weight type with f32 activations on its table's instruction set.
#[derive(Clone, Copy)]
pub struct FloatDot {
    kernel: FloatKernel,
    width: usize,
}

impl FloatDot {
    /// The dot product of the weights `w` (little-endian bytes) with `x`, in
    /// [`super::vec_dot_f32`]'s lane order.
    ///
    /// # Panics
    /// If `w` does not hold exactly `x.len()` weights.
    #[inline(always)]
    pub fn dot(&self, w: &[u8], x: &[f32]) -> f32 {
        assert_eq!(
            w.len(),
            self.width * x.len(),
            "float dot product: weight bytes do not match the activations"
        );
        // SAFETY: the table holding the kernel runs on this CPU (`for_isa`).
        unsafe { (self.kernel)(w, x) }
    }
}

/// The table minfer computes with, built on the first call: the rows of the widest instruction
/// set allowed ([`simd::isa`]: its quantizers and prefill panel kernels), each quantized weight
/// type's dot products taken from the table of the kernel chosen for it
/// ([`super::choice`]: by measurement on this CPU, unless forced).
pub fn table() -> &'static [TypeTraits] {
    static CHOSEN: OnceLock<&'static [TypeTraits]> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let widest: &'static [TypeTraits] = for_isa(simd::isa()).unwrap_or(&SCALAR);
        let choices = super::choice::choices();
        let rows: Vec<TypeTraits> = widest
            .iter()
            .map(|row| {
                let mut row = row.clone();
                let chosen = choices.get(row.ty).and_then(|c| for_isa(c.kernel.isa()));
                if let Some(from) = chosen.and_then(|rows| row_in(rows, row.ty)) {
                    row.dot = from.dot;
                }
                row
            })
            .collect();
        Box::leak(rows.into_boxed_slice())
    })
}

/// The table of `isa`, or `None` if this CPU does not run it. Every table has the same types
/// in the same order.
pub fn for_isa(isa: Isa) -> Option<&'static [TypeTraits]> {
    if !isa.is_supported() {
        return None;
    }
    match isa {
        Isa::Scalar => Some(&SCALAR),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(&AVX2),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => Some(&AVX512),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => Some(&NEON),
        #[cfg(target_arch = "aarch64")]
        Isa::Dotprod => Some(&DOTPROD),
        #[cfg(target_arch = "aarch64")]
        Isa::I8mm => Some(&I8MM),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// The row of `ty` in [`table`], or `None` for a type minfer does not compute with.
#[inline]
pub fn get(ty: GgmlType) -> Option<&'static TypeTraits> {
    row_in(table(), ty)
}

/// The row of `ty` in `rows` (one of the tables).
#[inline]
pub fn row_in(rows: &'static [TypeTraits], ty: GgmlType) -> Option<&'static TypeTraits> {
    rows.get(INDEX[ty as usize] as usize)
}

/// The rows of the types a matmul takes as weights (those with a dot product), in table order.
pub fn computable() -> impl Iterator<Item = &'static TypeTraits> {
    table().iter().filter(|row| row.is_weight())
}

/// The dot products of `ty` weights, or the error [`super::vec_dot`] reports.
pub fn block_dots(ty: GgmlType) -> Result<BlockDots, QuantError> {
    kernel_of(ty, "vec_dot", TypeTraits::block_dots)
}

/// The dot product of `ty` float weights, or the error [`super::vec_dot_f32`] reports.
pub fn float_dot(ty: GgmlType) -> Result<FloatDot, QuantError> {
    kernel_of(ty, "vec_dot_f32", TypeTraits::float_dot)
}

/// What `pick` finds in the row of `ty`, or the error naming `op` and the type.
fn kernel_of<K>(ty: GgmlType, op: &'static str, pick: fn(&TypeTraits) -> Option<K>) -> Result<K, QuantError> {
    get(ty)
        .and_then(pick)
        .ok_or(QuantError::UnsupportedType { ggml_type: ty, op })
}

/// One more than the largest GGUF type id.
const ID_LIMIT: usize = {
    let mut limit = 0;
    let mut i = 0;
    while i < GgmlType::ALL.len() {
        let id = GgmlType::ALL[i] as usize;
        if id >= limit {
            limit = id + 1;
        }
        i += 1;
    }
    limit
};

/// The row of each type id in every table, `u8::MAX` for the types not in it.
const INDEX: [u8; ID_LIMIT] = {
    let mut index = [u8::MAX; ID_LIMIT];
    let mut i = 0;
    while i < TYPES.len() {
        index[TYPES[i] as usize] = i as u8;
        i += 1;
    }
    index
};

/// View `bytes` as blocks; copies only when the bytes are not aligned for the block type
/// (tensor data in a GGUF file always is; arbitrary slices may not be).
#[inline(always)]
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

/// Quantize in place, or into a block vector copied out when the destination is not aligned
/// for the block type.
#[inline(always)]
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

/// The tables of the instruction sets from one list of rows: `$kind!` builds a row of each for
/// `scalar`, and `avx2` and `avx512` on x86-64 or `neon`, `dotprod` and `i8mm` on aarch64.
macro_rules! type_table {
    ($($ty:ident: $kind:ident($($row:tt)*);)*) => {
        /// Every type of the table, in row order.
        pub(crate) const TYPES: &[GgmlType] = &[$(GgmlType::$ty),*];

        static SCALAR: [TypeTraits; TYPES.len()] = [$($kind!(scalar, $ty, $($row)*)),*];
        #[cfg(target_arch = "x86_64")]
        static AVX2: [TypeTraits; TYPES.len()] = [$($kind!(avx2, $ty, $($row)*)),*];
        #[cfg(target_arch = "x86_64")]
        static AVX512: [TypeTraits; TYPES.len()] = [$($kind!(avx512, $ty, $($row)*)),*];
        #[cfg(target_arch = "aarch64")]
        static NEON: [TypeTraits; TYPES.len()] = [$($kind!(neon, $ty, $($row)*)),*];
        #[cfg(target_arch = "aarch64")]
        static DOTPROD: [TypeTraits; TYPES.len()] = [$($kind!(dotprod, $ty, $($row)*)),*];
        #[cfg(target_arch = "aarch64")]
        static I8MM: [TypeTraits; TYPES.len()] = [$($kind!(i8mm, $ty, $($row)*)),*];
    };
}

/// A float type's row: its weight's widening and narrowing and its reference dot product (in
/// `float`), and its SIMD kernel (in `simd::x86::float` and `simd::aarch64::float`).
macro_rules! float {
    ($isa:ident, $ty:ident, $widen:ident, $narrow:ident, $reference:ident, simd $kernel:ident) => {
        TypeTraits {
            ty: GgmlType::$ty,
            block_size: GgmlType::$ty.block_size(),
            type_size: GgmlType::$ty.type_size(),
            vec_dot_type: None,
            to_float: |src, dst| float::widen_row(src, dst, float::$widen),
            from_float_ref: Some(|src, dst| float::narrow_row(src, dst, float::$narrow)),
            from_float: Some(|src, dst| float::narrow_row(src, dst, float::$narrow)),
            from_float_imatrix: None,
            dot: Dot::Float(float_kernel!($isa, $reference, $kernel)),
            panel: None,
            #[cfg(test)]
            test: None,
        }
    };
}

macro_rules! float_kernel {
    (scalar, $reference:ident, $kernel:ident) => {
        float::$reference
    };
    ($isa:ident, $reference:ident, $kernel:ident) => {
        simd_float::$kernel
    };
}

/// A quantized type's row: its block module and block, the activation block its dot product
/// takes (`none` for an activation-only type), its SIMD kernel, named alike in `simd::x86` and
/// `simd::aarch64` (`none` where the scalar reference serves every instruction set,
/// `x86::file::kernel` for a kernel of x86-64 alone; the `i8mm` table adds the same name's two-by-two kernel from the file's `i8mm` module), its
/// four-row decoding kernel and its panel kernel (`none`, or `block32(KIND)` /
/// `k(KIND)` of `simd::x86::gemm` / `gemm_k`), and `read only` for a type without a quantizer or
/// `imatrix` for one whose module has a `quantize_row_imatrix` (ggml's quantizer given
/// `quant_weights`).
macro_rules! quant {
    ($isa:ident, $ty:ident, $m:ident::$block:ident, dot $($dot:ident)::+, simd $($x86:ident)::+, rows $($rows:ident)::+, panel $pk:ident $(($pa:ident))?) => {
        quant!($isa, $ty, $m::$block, dot $($dot)::+, simd $($x86)::+, rows $($rows)::+, panel $pk $(($pa))?, Some(|src, dst| into_blocks(dst, |b| $m::quantize_row_ref(src, b))), Some(quantizer!($isa, $m)), None)
    };
    ($isa:ident, $ty:ident, $m:ident::$block:ident, dot $($dot:ident)::+, simd $($x86:ident)::+, rows $($rows:ident)::+, panel $pk:ident $(($pa:ident))?, imatrix) => {
        quant!($isa, $ty, $m::$block, dot $($dot)::+, simd $($x86)::+, rows $($rows)::+, panel $pk $(($pa))?, Some(|src, dst| into_blocks(dst, |b| $m::quantize_row_ref(src, b))), Some(quantizer!($isa, $m)), Some(|src, qw, dst| into_blocks(dst, |b| $m::quantize_row_imatrix(src, qw, b))))
    };
    ($isa:ident, $ty:ident, $m:ident::$block:ident, dot $($dot:ident)::+, simd $($x86:ident)::+, rows $($rows:ident)::+, panel $pk:ident $(($pa:ident))?, read only) => {
        quant!($isa, $ty, $m::$block, dot $($dot)::+, simd $($x86)::+, rows $($rows)::+, panel $pk $(($pa))?, None, None, None)
    };
    ($isa:ident, $ty:ident, $m:ident::$block:ident, dot $($dot:ident)::+, simd $($x86:ident)::+, rows $($rows:ident)::+, panel $pk:ident $(($pa:ident))?, $from_float_ref:expr, $from_float:expr, $from_float_imatrix:expr) => {{
        const {
            assert!(std::mem::size_of::<$m::$block>() == GgmlType::$ty.type_size());
            activation_checks!($ty, $($dot)::+);
        };
        TypeTraits {
            ty: GgmlType::$ty,
            block_size: GgmlType::$ty.block_size(),
            type_size: GgmlType::$ty.type_size(),
            vec_dot_type: GgmlType::$ty.vec_dot_type(),
            to_float: |src, dst| with_blocks(src, |b| $m::dequantize_row(b, dst)),
            from_float_ref: $from_float_ref,
            from_float: $from_float,
            from_float_imatrix: $from_float_imatrix,
            dot: block_dot!($isa, $m::$block, $($dot)::+, ($($x86)::+), ($($rows)::+)),
            panel: panel!($isa, $ty, $pk $(($pa))?),
            #[cfg(test)]
            test: Some(TestHooks::block::<$m::$block>()),
        }
    }};
}

/// The activation type the row names agrees with ggml's `vec_dot_type` of the type, in size
/// and block length.
macro_rules! activation_checks {
    ($ty:ident, none) => {
        assert!(GgmlType::$ty.vec_dot_type().is_none())
    };
    ($ty:ident, $am:ident::$ablock:ident) => {
        match GgmlType::$ty.vec_dot_type() {
            Some(a) => assert!(
                a.type_size() == std::mem::size_of::<$am::$ablock>() && a.block_size() == GgmlType::$ty.block_size()
            ),
            None => panic!("a weight type names its activation type"),
        }
    };
}

macro_rules! block_dot {
    ($isa:ident, $m:ident::$block:ident, none, $x86:tt, $rows:tt) => {
        Dot::None
    };
    ($isa:ident, $m:ident::$block:ident, $am:ident::$ablock:ident, ($($x86:tt)*), ($($rows:tt)*)) => {
        Dot::Blocks {
            one: block_kernel!($isa, 1, $m, $($x86)*),
            two: Some(block_kernel!($isa, 2, $m, $($x86)*)),
            rows: rows_kernel!($isa, $($rows)*),
            pair: pair_kernel!($isa, $($x86)*),
            a_size: std::mem::size_of::<$am::$ablock>(),
            align: (std::mem::align_of::<$m::$block>(), std::mem::align_of::<$am::$ablock>()),
        }
    };
}

macro_rules! block_kernel {
    (scalar, $n:literal, $m:ident, $($x86:tt)*) => {
        |x, ys| simd::reference_rows::<_, _, $n>(x, ys, $m::vec_dot_ref)
    };
    ($isa:ident, $n:literal, $m:ident, none) => {
        block_kernel!(scalar, $n, $m, none)
    };
    // A kernel written for x86-64 only: the aarch64 tables take the scalar reference.
    (avx2, $n:literal, $m:ident, x86::$file:ident::$kernel:ident) => {
        block_kernel!(avx2, $n, $m, $file::$kernel)
    };
    (avx512, $n:literal, $m:ident, x86::$file:ident::$kernel:ident) => {
        block_kernel!(avx512, $n, $m, $file::$kernel)
    };
    ($isa:ident, $n:literal, $m:ident, x86::$file:ident::$kernel:ident) => {
        block_kernel!(scalar, $n, $m, none)
    };
    (avx2, $n:literal, $m:ident, $file:ident::$kernel:ident) => {
        $file::$kernel::<false, $n>
    };
    (avx512, $n:literal, $m:ident, $file:ident::$kernel:ident) => {
        $file::$kernel::<true, $n>
    };
    (neon, $n:literal, $m:ident, $file:ident::$kernel:ident) => {
        $file::$kernel::<false, $n>
    };
    (dotprod, $n:literal, $m:ident, $file:ident::$kernel:ident) => {
        $file::$kernel::<true, $n>
    };
    (i8mm, $n:literal, $m:ident, $file:ident::$kernel:ident) => {
        $file::$kernel::<true, $n>
    };
}

/// The [`PairKernel`] of a row: SMMLA's, in the `i8mm` table only (the other tables' prompts
/// take one weight row against two tokens).
macro_rules! pair_kernel {
    (i8mm, $file:ident::$kernel:ident) => {
        Some($file::i8mm::$kernel)
    };
    ($isa:ident, $($kernel:tt)*) => {
        None
    };
}

/// The [`RowsKernel`] of a row: its SIMD kernel, if it has one (otherwise [`BlockDots::dot_rows`]
/// takes the rows one by one).
macro_rules! rows_kernel {
    ($isa:ident, none) => {
        None
    };
    (avx2, x86::$file:ident::$kernel:ident) => {
        rows_kernel!(avx2, $file::$kernel)
    };
    (avx512, x86::$file:ident::$kernel:ident) => {
        rows_kernel!(avx512, $file::$kernel)
    };
    ($isa:ident, x86::$file:ident::$kernel:ident) => {
        None
    };
    (scalar, $file:ident::$kernel:ident) => {
        None
    };
    (avx2, $file:ident::$kernel:ident) => {
        Some($file::$kernel::<false>)
    };
    (avx512, $file:ident::$kernel:ident) => {
        Some($file::$kernel::<true>)
    };
    (neon, $file:ident::$kernel:ident) => {
        Some($file::$kernel::<false>)
    };
    (dotprod, $file:ident::$kernel:ident) => {
        Some($file::$kernel::<true>)
    };
    (i8mm, $file:ident::$kernel:ident) => {
        Some($file::$kernel::<true>)
    };
}

/// The quantizer of a row: the reference, compiled for AVX-512 F and VL in the AVX-512 table,
/// where the activation quantizers' loops (absolute maximum, scaling, rounding) vectorize 16
/// lanes wide; the same operations, so the same bytes.
macro_rules! quantizer {
    (avx512, $m:ident) => {{
        #[target_feature(enable = "avx512f,avx512vl,avx2")]
        unsafe fn wide(src: &[f32], dst: &mut [u8]) {
            into_blocks(dst, |b| $m::quantize_row_ref(src, b))
        }
        wide
    }};
    ($isa:ident, $m:ident) => {
        |src, dst| into_blocks(dst, |b| $m::quantize_row_ref(src, b))
    };
}

macro_rules! panel {
    ($isa:ident, $ty:ident, none) => {
        None
    };
    (avx512, $ty:ident, block32($kind:ident)) => {
        panel_checked!($ty, PanelKernel::block32::<{ x86::gemm::$kind }>())
    };
    (avx512, $ty:ident, k($kind:ident)) => {
        panel_checked!($ty, PanelKernel::k::<{ x86::gemm_k::$kind }>())
    };
    // The panel kernels need AVX-512.
    ($isa:ident, $ty:ident, $($panel:tt)+) => {
        None
    };
}

/// `Some(kernel)`, checked to read the activation type of `$ty`.
#[cfg(target_arch = "x86_64")]
macro_rules! panel_checked {
    ($ty:ident, $kernel:expr) => {{
        const {
            let act = $kernel.activation_type() as u32;
            assert!(matches!(GgmlType::$ty.vec_dot_type(), Some(a) if a as u32 == act));
        };
        Some($kernel)
    }};
}

// One row per type, in the order of `GgmlType::SUPPORTED`. A float row names its widening,
// narrowing and reference dot product in `float` and its kernel in `simd::{x86,aarch64}::float`;
// a quantized row names its block, the activation block of its dot product, its kernel in
// `simd::x86` and `simd::aarch64`, its four-row kernel and its prefill panel kernel.
type_table! {
    F32: float(f32_from_le, f32_to_le, vec_dot_f32_ref, simd vec_dot_f32);
    F16: float(f16_from_le, f16_to_le, vec_dot_f16_ref, simd vec_dot_f16);
    BF16: float(bf16_from_le, bf16_to_le, vec_dot_bf16_ref, simd vec_dot_bf16);
    Q4_0: quant(q4_0::BlockQ4_0, dot q8_0::BlockQ8_0, simd legacy::vec_dot_q4_0, rows legacy::rows_q4_0, panel block32(Q4_0), imatrix);
    Q4_1: quant(q4_1::BlockQ4_1, dot q8_1::BlockQ8_1, simd legacy::vec_dot_q4_1, rows legacy::rows_q4_1, panel block32(Q4_1), imatrix);
    Q5_0: quant(q5_0::BlockQ5_0, dot q8_0::BlockQ8_0, simd legacy::vec_dot_q5_0, rows legacy::rows_q5_0, panel block32(Q5_0), imatrix);
    Q5_1: quant(q5_1::BlockQ5_1, dot q8_1::BlockQ8_1, simd legacy::vec_dot_q5_1, rows legacy::rows_q5_1, panel block32(Q5_1), imatrix);
    Q8_0: quant(q8_0::BlockQ8_0, dot q8_0::BlockQ8_0, simd legacy::vec_dot_q8_0, rows legacy::rows_q8_0, panel block32(Q8_0));
    Q8_1: quant(q8_1::BlockQ8_1, dot none, simd none, rows none, panel none);
    Q2_K: quant(q2_k::BlockQ2K, dot q8_k::BlockQ8K, simd x86::k_quants::vec_dot_q2_k, rows none, panel k(Q2_K), imatrix);
    Q3_K: quant(q3_k::BlockQ3K, dot q8_k::BlockQ8K, simd x86::k_quants::vec_dot_q3_k, rows none, panel k(Q3_K), imatrix);
    Q4_K: quant(q4_k::BlockQ4K, dot q8_k::BlockQ8K, simd k_quants::vec_dot_q4_k, rows none, panel k(Q4_K), imatrix);
    Q5_K: quant(q5_k::BlockQ5K, dot q8_k::BlockQ8K, simd k_quants::vec_dot_q5_k, rows none, panel k(Q5_K), imatrix);
    Q6_K: quant(q6_k::BlockQ6K, dot q8_k::BlockQ8K, simd k_quants::vec_dot_q6_k, rows none, panel k(Q6_K), imatrix);
    Q8_K: quant(q8_k::BlockQ8K, dot none, simd none, rows none, panel none);
    IQ2_XXS: quant(iq2_xxs::BlockIq2Xxs, dot q8_k::BlockQ8K, simd none, rows none, panel none, read only);
    IQ2_XS: quant(iq2_xs::BlockIq2Xs, dot q8_k::BlockQ8K, simd x86::iq_quants::vec_dot_iq2_xs, rows none, panel k(IQ2_XS), read only);
    IQ3_XXS: quant(iq3_xxs::BlockIq3Xxs, dot q8_k::BlockQ8K, simd x86::iq_quants::vec_dot_iq3_xxs, rows none, panel k(IQ3_XXS), read only);
    IQ1_S: quant(iq1_s::BlockIq1S, dot q8_k::BlockQ8K, simd none, rows none, panel none, read only);
    IQ4_NL: quant(iq4_nl::BlockIq4Nl, dot q8_0::BlockQ8_0, simd x86::legacy::vec_dot_iq4_nl, rows x86::legacy::rows_iq4_nl, panel block32(IQ4_NL), imatrix);
    IQ3_S: quant(iq3_s::BlockIq3S, dot q8_k::BlockQ8K, simd none, rows none, panel none, read only);
    IQ2_S: quant(iq2_s::BlockIq2S, dot q8_k::BlockQ8K, simd none, rows none, panel none, read only);
    IQ4_XS: quant(iq4_xs::BlockIq4Xs, dot q8_k::BlockQ8K, simd x86::k_quants::vec_dot_iq4_xs, rows x86::k_quants::rows_iq4_xs, panel k(IQ4_XS), imatrix);
    IQ1_M: quant(iq1_m::BlockIq1M, dot q8_k::BlockQ8K, simd none, rows none, panel none, read only);
    TQ1_0: quant(tq1_0::BlockTq1_0, dot q8_k::BlockQ8K, simd none, rows none, panel none);
    TQ2_0: quant(tq2_0::BlockTq2_0, dot q8_k::BlockQ8K, simd none, rows none, panel none);
    MXFP4: quant(mxfp4::BlockMxfp4, dot q8_0::BlockQ8_0, simd x86::legacy::vec_dot_mxfp4, rows x86::legacy::rows_mxfp4, panel block32(MXFP4));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_holds_the_supported_types_in_one_order_with_their_ggml_sizes() {
        assert_eq!(GgmlType::SUPPORTED, TYPES);
        for isa in Isa::ALL {
            let Some(rows) = for_isa(isa) else { continue };
            let types: Vec<GgmlType> = rows.iter().map(|row| row.ty).collect();
            assert_eq!(types, TYPES, "{isa:?}");
            for row in rows {
                assert_eq!(row.block_size, row.ty.block_size(), "{}", row.ty);
                assert_eq!(row.type_size, row.ty.type_size(), "{}", row.ty);
                assert_eq!(row.vec_dot_type, row.ty.vec_dot_type(), "{}", row.ty);
                assert!(std::ptr::eq(row_in(rows, row.ty).unwrap(), row));
            }
        }
    }

    /// The address of a row's one-row dot product (the kernel it calls).
    fn one_row_kernel(row: &TypeTraits) -> Option<usize> {
        match row.dot {
            Dot::Blocks { one, .. } => Some(one as usize),
            Dot::Float(kernel) => Some(kernel as usize),
            Dot::None => None,
        }
    }

    #[test]
    fn the_table_takes_each_quantized_types_dot_products_from_its_chosen_kernel_and_the_rest_from_the_widest() {
        let widest = for_isa(simd::isa()).unwrap();
        for (row, wide) in table().iter().zip(widest) {
            assert_eq!(row.ty, wide.ty);
            assert_eq!(row.panel.is_some(), wide.panel.is_some(), "{}", row.ty);
            let from = match super::super::choice::kernel_of(row.ty) {
                Some(kernel) => row_in(for_isa(kernel.isa()).unwrap(), row.ty).unwrap(),
                None => wide,
            };
            assert_eq!(one_row_kernel(row), one_row_kernel(from), "{}", row.ty);
        }
    }

    #[test]
    fn a_type_outside_the_table_has_no_row_and_no_dot_product() {
        for &ty in GgmlType::ALL {
            assert_eq!(get(ty).is_some(), ty.is_supported(), "{ty}");
        }
        assert!(get(GgmlType::I32).is_none());
        let err = block_dots(GgmlType::I32).err().unwrap();
        assert_eq!(err.to_string(), "vec_dot is not implemented for ggml type I32");
        let err = float_dot(GgmlType::Q8_0).err().unwrap();
        assert_eq!(err.to_string(), "vec_dot_f32 is not implemented for ggml type Q8_0");
    }

    #[test]
    fn every_weight_types_activations_have_a_row_with_no_dot_product_of_a_float_type() {
        // What the matmul relies on: a quantized weight's activations can be quantized, and the
        // float weights take f32.
        for row in computable() {
            match row.vec_dot_type {
                Some(aty) => {
                    assert!(row.block_dots().is_some() && row.float_dot().is_none(), "{}", row.ty);
                    let act = get(aty).unwrap();
                    assert_eq!(act.block_size, row.block_size, "{}", row.ty);
                }
                None => assert!(row.float_dot().is_some() && row.block_dots().is_none(), "{}", row.ty),
            }
        }
        let activation_only: Vec<GgmlType> = table().iter().filter(|r| !r.is_weight()).map(|r| r.ty).collect();
        assert_eq!(activation_only, [GgmlType::Q8_1, GgmlType::Q8_K]);
    }

    #[test]
    fn rows_of_aligned_matrices_take_the_kernels_in_place() {
        // A weight's rows start at multiples of the row size from aligned tensor data, and the
        // quantized activations' likewise: every such row must be seen as aligned, or each dot
        // product would copy its operands.
        let base = vec![0u64; 4096];
        let bytes: &[u8] = bytemuck::cast_slice(&base);
        for row in computable() {
            let Some(dots) = row.block_dots() else { continue };
            let act = get(row.vec_dot_type.unwrap()).unwrap();
            for nb in 1..=5 {
                for o in 0..4 {
                    let w = &bytes[o * nb * row.type_size..][..nb * row.type_size];
                    let a = &bytes[o * nb * act.type_size..][..nb * act.type_size];
                    assert!(dots.aligned(w, a), "{} nb={nb} row {o}", row.ty);
                }
            }
        }
    }
}
