//! A layer's KV cache region in its stored type (f32, f16 or Q8_0): values read as f32 a head
//! at a time (borrowed when stored as f32, converted into the caller's scratch otherwise) and
//! rows written from f32 with ggml's conversions (round-to-nearest-even f16,
//! `quantize_row_q8_0_ref`). Attention reads the stored type through this, so no f32 copy of
//! the whole cache is ever made.
//!
//! Owns the storage formats and their conversions; must not know how cells are chosen.

use super::{check_len, KernelError};
use crate::graph::DType;
#[cfg(test)]
use crate::quant::fp16::f16_to_f32;
use crate::quant::fp16::{f16_to_f32_row, f16_to_f32_row_scalar, f32_to_f16};
use crate::quant::q8_0::{self, BlockQ8_0, QK8_0};

/// Values a [`KvRows::values`] scratch must hold beyond the values asked for: a Q8_0 read that
/// does not start on a block converts the blocks around it.
pub const SCRATCH_SLACK: usize = 2 * QK8_0;

/// Read access to a region's values as f32.
pub trait KvRows: Copy {
    /// Values `start..start + n`: borrowed from the region, or converted into `scratch`
    /// (at least `n + SCRATCH_SLACK` long). The range must lie in the region.
    fn values<'s>(&'s self, start: usize, n: usize, scratch: &'s mut [f32]) -> &'s [f32];

    /// [`KvRows::values`], for a caller compiled for AVX-512 (attention's wide build), where
    /// f16 converts sixteen values an instruction. The same values.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and VL.
    #[inline(always)]
    unsafe fn values_wide<'s>(&'s self, start: usize, n: usize, scratch: &'s mut [f32]) -> &'s [f32] {
        self.values(start, n, scratch)
    }
}

impl KvRows for &[f32] {
    #[inline(always)]
    fn values<'s>(&'s self, start: usize, n: usize, _scratch: &'s mut [f32]) -> &'s [f32] {
        &self[start..][..n]
    }
}

/// A region stored as f16 bits.
#[derive(Clone, Copy)]
pub struct F16Rows<'a>(pub &'a [u16]);

impl KvRows for F16Rows<'_> {
    #[inline(always)]
    fn values<'s>(&'s self, start: usize, n: usize, scratch: &'s mut [f32]) -> &'s [f32] {
        // On aarch64 NEON's `fcvtl` (exact, as the scalar conversion is); on x86 the wide path
        // below is the vectorized one.
        #[cfg(target_arch = "aarch64")]
        f16_to_f32_row(&self.0[start..][..n], &mut scratch[..n]);
        #[cfg(not(target_arch = "aarch64"))]
        f16_to_f32_row_scalar(&self.0[start..][..n], &mut scratch[..n]);
        &scratch[..n]
    }

    #[inline(always)]
    unsafe fn values_wide<'s>(&'s self, start: usize, n: usize, scratch: &'s mut [f32]) -> &'s [f32] {
        // SAFETY: the caller guarantees AVX-512 F and VL.
        unsafe { f16_row_wide(&self.0[start..][..n], &mut scratch[..n]) };
        &scratch[..n]
    }
}

/// f16 to f32 sixteen at a time (`vcvtph2ps` on a 512-bit register: exact, as
/// [`f16_to_f32_row_scalar`] is), the tail one by one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2")]
#[inline]
unsafe fn f16_row_wide(src: &[u16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm512_cvtph_ps, _mm512_storeu_ps};
    let n = src.len().min(dst.len());
    let body = n / 16 * 16;
    let mut i = 0;
    while i < body {
        // SAFETY: i + 16 <= n, within both slices; unaligned loads and stores.
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i);
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        }
        i += 16;
    }
    f16_to_f32_row_scalar(&src[body..n], &mut dst[body..n]);
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn f16_row_wide(src: &[u16], dst: &mut [f32]) {
    f16_to_f32_row_scalar(src, dst)
}

/// A region stored as Q8_0 blocks (each row a whole number of blocks).
#[derive(Clone, Copy)]
pub struct Q8Rows<'a>(pub &'a [BlockQ8_0]);

impl KvRows for Q8Rows<'_> {
    #[inline(always)]
    fn values<'s>(&'s self, start: usize, n: usize, scratch: &'s mut [f32]) -> &'s [f32] {
        let (b0, b1) = (start / QK8_0, (start + n).div_ceil(QK8_0));
        q8_0::dequantize_row(&self.0[b0..b1], &mut scratch[..(b1 - b0) * QK8_0]);
        &scratch[start - b0 * QK8_0..][..n]
    }

    #[inline(always)]
    unsafe fn values_wide<'s>(&'s self, start: usize, n: usize, scratch: &'s mut [f32]) -> &'s [f32] {
        let (b0, b1) = (start / QK8_0, (start + n).div_ceil(QK8_0));
        // SAFETY: the caller guarantees AVX-512 F and VL.
        unsafe { q8_0_blocks_wide(&self.0[b0..b1], &mut scratch[..(b1 - b0) * QK8_0]) };
        &scratch[start - b0 * QK8_0..][..n]
    }
}

/// `q8_0::dequantize_row` sixteen values an instruction: each `q as f32 * d`, the same one
/// rounding as the scalar code.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2")]
#[inline]
unsafe fn q8_0_blocks_wide(blocks: &[BlockQ8_0], dst: &mut [f32]) {
    use std::arch::x86_64::{
        __m128i, _mm512_cvtepi32_ps, _mm512_cvtepi8_epi32, _mm512_mul_ps, _mm512_set1_ps, _mm512_storeu_ps,
        _mm_loadu_si128,
    };
    for (block, out) in blocks.iter().zip(dst.chunks_exact_mut(QK8_0)) {
        let d = _mm512_set1_ps(crate::quant::fp16::f16_to_f32(block.d));
        for half in 0..2 {
            // SAFETY: 16 bytes of the block's 32 and 16 values of the chunk's 32.
            unsafe {
                let q = _mm_loadu_si128(block.qs.as_ptr().add(16 * half) as *const __m128i);
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
                _mm512_storeu_ps(out.as_mut_ptr().add(16 * half), v);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn q8_0_blocks_wide(blocks: &[BlockQ8_0], dst: &mut [f32]) {
    q8_0::dequantize_row(blocks, dst)
}

/// A region for reading, in its stored type.
#[derive(Clone, Copy)]
pub enum KvRegion<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// f16 bits.
    F16(&'a [u16]),
    /// Q8_0 blocks.
    Q8_0(&'a [BlockQ8_0]),
}

/// Values `start..start + n` must lie in a region of `len` values.
fn check_range(kernel: &'static str, start: usize, n: usize, len: usize) -> Result<(), KernelError> {
    match start.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(KernelError::TooSmall {
            kernel,
            operand: "region",
            needed: start.saturating_add(n),
            got: len,
        }),
    }
}

/// Values a region of `bytes` bytes of `dtype` holds.
pub fn region_values(bytes: usize, dtype: DType) -> usize {
    match dtype {
        DType::F32 | DType::I32 => bytes / 4,
        DType::F16 => bytes / 2,
        DType::Q8_0 => bytes / 34 * QK8_0,
    }
}

impl<'a> KvRegion<'a> {
    /// The region held in `words` (a CPU buffer's f32 words) as `dtype`, of `n_values` values.
    pub fn of(words: &'a [f32], dtype: DType, n_values: usize) -> Option<Self> {
        match dtype {
            DType::F32 => words.get(..n_values).map(KvRegion::F32),
            DType::F16 => bytemuck::cast_slice::<f32, u16>(words)
                .get(..n_values)
                .map(KvRegion::F16),
            DType::Q8_0 => {
                let bytes: &[u8] = bytemuck::cast_slice(words);
                let blocks = bytes.get(..DType::Q8_0.bytes(n_values))?;
                bytemuck::try_cast_slice(blocks).ok().map(KvRegion::Q8_0)
            }
            DType::I32 => None,
        }
    }

    /// Values the region holds.
    pub fn len(&self) -> usize {
        match self {
            KvRegion::F32(x) => x.len(),
            KvRegion::F16(x) => x.len(),
            KvRegion::Q8_0(x) => x.len() * QK8_0,
        }
    }

    /// Whether the region holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values `start..start + n` into `out`, as f32.
    pub fn read(&self, start: usize, out: &mut [f32]) -> Result<(), KernelError> {
        let n = out.len();
        check_range("kv_read", start, n, self.len())?;
        let mut scratch = vec![0.0; n + SCRATCH_SLACK];
        match *self {
            KvRegion::F32(x) => out.copy_from_slice(&x[start..][..n]),
            KvRegion::F16(x) => f16_to_f32_row(&x[start..][..n], out),
            KvRegion::Q8_0(x) => out.copy_from_slice(Q8Rows(x).values(start, n, &mut scratch)),
        }
        Ok(())
    }
}

/// A region for writing, in its stored type.
pub enum KvRegionMut<'a> {
    /// f32 values.
    F32(&'a mut [f32]),
    /// f16 bits.
    F16(&'a mut [u16]),
    /// Q8_0 blocks.
    Q8_0(&'a mut [BlockQ8_0]),
}

impl<'a> KvRegionMut<'a> {
    /// The region held in `words` as `dtype`, of `n_values` values.
    pub fn of(words: &'a mut [f32], dtype: DType, n_values: usize) -> Option<Self> {
        match dtype {
            DType::F32 => words.get_mut(..n_values).map(KvRegionMut::F32),
            DType::F16 => bytemuck::cast_slice_mut::<f32, u16>(words)
                .get_mut(..n_values)
                .map(KvRegionMut::F16),
            DType::Q8_0 => {
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(words);
                let blocks = bytes.get_mut(..DType::Q8_0.bytes(n_values))?;
                bytemuck::try_cast_slice_mut(blocks).ok().map(KvRegionMut::Q8_0)
            }
            DType::I32 => None,
        }
    }

    /// Values the region holds.
    pub fn len(&self) -> usize {
        match self {
            KvRegionMut::F32(x) => x.len(),
            KvRegionMut::F16(x) => x.len(),
            KvRegionMut::Q8_0(x) => x.len() * QK8_0,
        }
    }

    /// Whether the region holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Write `src` at value `start`, converted to the stored type. For Q8_0, `start` and the
    /// length must be whole blocks.
    pub fn write(&mut self, start: usize, src: &[f32]) -> Result<(), KernelError> {
        const K: &str = "kv_write";
        let n = src.len();
        check_range(K, start, n, self.len())?;
        match self {
            KvRegionMut::F32(x) => x[start..start + n].copy_from_slice(src),
            KvRegionMut::F16(x) => {
                for (out, &v) in x[start..start + n].iter_mut().zip(src) {
                    *out = f32_to_f16(v);
                }
            }
            KvRegionMut::Q8_0(x) => {
                check_len(K, "start % 32", start % QK8_0, 0)?;
                check_len(K, "row % 32", n % QK8_0, 0)?;
                q8_0::quantize_row_ref(src, &mut x[start / QK8_0..(start + n) / QK8_0]);
            }
        }
        Ok(())
    }
}

/// Turn K rows of a region held in `words` (`bytes` bytes of `dtype`) by a context shift:
/// each row is read as f32, rotated with [`rope`](super::rope) by `shift.delta` positions and
/// written back in the stored type (llama.cpp's K-shift, which converts f16 and Q8_0 the same
/// way). `factors` are the values of `shift.rope.freq_factors`, resolved by the caller.
pub fn rope_shift(
    words: &mut [f32],
    bytes: usize,
    dtype: DType,
    shift: &crate::graph::KShift,
    factors: Option<&[f32]>,
) -> Result<(), KernelError> {
    const K: &str = "rope_shift";
    let r = &shift.rope;
    let row = super::size(K, "row", r.n_head, r.head_dim)?;
    let n_values = region_values(bytes, dtype);
    let start = super::size(K, "start", shift.first_row, row)?;
    let n = super::size(K, "rows", shift.n_rows, row)?;
    let mut rows = vec![0f32; n];
    // The words hold fewer bytes than the region's size says.
    let got = words.len() * 4;
    let layout = || KernelError::TooSmall {
        kernel: K,
        operand: "region",
        needed: bytes,
        got,
    };
    KvRegion::of(words, dtype, n_values)
        .ok_or_else(layout)?
        .read(start, &mut rows)?;
    let positions = vec![shift.delta; shift.n_rows];
    super::rope(&mut rows, &positions, shift.n_rows, r.n_head, r, factors)?;
    KvRegionMut::of(words, dtype, n_values)
        .ok_or_else(layout)?
        .write(start, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::XorShift;

    #[test]
    fn rows_written_and_read_back_are_ggmls_conversions_of_them() {
        let mut r = XorShift(3);
        let row = r.vec(64, 4.0);
        for dtype in [DType::F32, DType::F16, DType::Q8_0] {
            let mut words = vec![0.0f32; 4 * 64];
            let mut region = KvRegionMut::of(&mut words, dtype, 3 * 64).unwrap();
            region.write(64, &row).unwrap();
            let region = KvRegion::of(&words, dtype, 3 * 64).unwrap();
            let mut back = vec![0.0; 64];
            region.read(64, &mut back).unwrap();
            let expected: Vec<f32> = match dtype {
                DType::F32 => row.clone(),
                DType::F16 => row.iter().map(|&v| f16_to_f32(f32_to_f16(v))).collect(),
                _ => {
                    let mut blocks = [BlockQ8_0 { d: 0, qs: [0; 32] }; 2];
                    q8_0::quantize_row_ref(&row, &mut blocks);
                    let mut out = vec![0.0; 64];
                    q8_0::dequantize_row(&blocks, &mut out);
                    out
                }
            };
            assert_eq!(back, expected, "{dtype:?}");
            // A read inside a block gives the same values as the whole row.
            let mut part = vec![0.0; 20];
            region.read(64 + 10, &mut part).unwrap();
            assert_eq!(part, expected[10..30], "{dtype:?}");
        }
    }

    #[test]
    fn the_wide_reads_give_the_scalar_reads_bits() {
        if !super::super::math::is_wide() {
            return;
        }
        let mut r = XorShift(5);
        let row = r.vec(256, 30.0);
        for dtype in [DType::F16, DType::Q8_0] {
            let mut words = vec![0.0f32; 256];
            KvRegionMut::of(&mut words, dtype, 256).unwrap().write(0, &row).unwrap();
            let (mut a, mut b) = (vec![0.0; 256 + SCRATCH_SLACK], vec![0.0; 256 + SCRATCH_SLACK]);
            for (start, n) in [(0, 256), (64, 64), (10, 37)] {
                let (scalar, wide) = match KvRegion::of(&words, dtype, 256).unwrap() {
                    KvRegion::F16(x) => (
                        F16Rows(x).values(start, n, &mut a).to_vec(),
                        // SAFETY: is_wide checked AVX-512.
                        unsafe { F16Rows(x).values_wide(start, n, &mut b) }.to_vec(),
                    ),
                    KvRegion::Q8_0(x) => (
                        Q8Rows(x).values(start, n, &mut a).to_vec(),
                        // SAFETY: as above.
                        unsafe { Q8Rows(x).values_wide(start, n, &mut b) }.to_vec(),
                    ),
                    KvRegion::F32(_) => unreachable!(),
                };
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&scalar), bits(&wide), "{dtype:?} {start}..+{n}");
            }
        }
    }

    #[test]
    fn a_q8_0_row_that_is_not_whole_blocks_is_refused() {
        let mut words = vec![0.0f32; 64];
        let mut region = KvRegionMut::of(&mut words, DType::Q8_0, 64).unwrap();
        assert!(region.write(0, &[1.0; 16]).is_err());
        assert!(region.write(16, &[1.0; 32]).is_err());
    }
}
