//! IEEE half (F16) and bfloat16 (BF16) conversions, bit-exact with ggml's reference ones.
//!
//! ggml rounds to nearest-even in both directions that lose precision, turns a NaN into a quiet
//! NaN, and widens exactly. Quantized blocks store their scales as F16, so these functions decide
//! byte-identity with llama-quantize's output: they must not be "improved".

/// Widen an F16 bit pattern to f32 exactly (subnormals, infinities and NaN included).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: value = mant * 2^-24, exactly representable as a normal f32.
            let value = mant as f32 * f32::from_bits(0x3380_0000); // 2^-24
            return if sign != 0 { -value } else { value };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, _) => sign | 0x7fc0_0000 | (mant << 13),
        _ => sign | ((exp + 112) << 23) | (mant << 13),
    };
    f32::from_bits(bits)
}

/// Narrow an f32 to F16 with round-to-nearest-even, as `ggml_compute_fp32_to_fp16` does:
/// overflow becomes infinity, NaN becomes the quiet NaN 0x7e00 (with the sign kept).
#[inline]
pub fn f32_to_f16(f: f32) -> u16 {
    // The classic branch-free formulation: scaling by 2^112 then 2^-110 lets the FPU do the
    // rounding of the mantissa (including into subnormals) in the current rounding mode.
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;

    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xff00_0000).max(0x7100_0000);

    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7c00;
    let mantissa_bits = bits & 0x0000_0fff;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16) | if shl1_w > 0xff00_0000 { 0x7e00 } else { nonsign }) as u16
}

/// Widen a row of F16 bit patterns, each exactly as [`f16_to_f32`] widens it: with F16C
/// (`vcvtph2ps`, eight at a time) where the CPU has it, with NEON's `fcvtl` (four at a time) on
/// aarch64, both exact too, and one by one otherwise. An f16 KV cache is read through this a head
/// at a time.
pub fn f16_to_f32_row(src: &[u16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: both features were just detected.
        unsafe { f16_to_f32_row_f16c(src, dst) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if super::simd::isa() != super::simd::Isa::Scalar {
        f16_to_f32_row_neon(src, dst);
        return;
    }
    f16_to_f32_row_scalar(src, dst);
}

#[cfg(target_arch = "aarch64")]
fn f16_to_f32_row_neon(src: &[u16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let body = n / 4 * 4;
    let bytes: &[u8] = bytemuck::cast_slice(&src[..body]);
    for (i, out) in dst[..body].chunks_exact_mut(4).enumerate() {
        // SAFETY: NEON is in every aarch64 CPU; `out` holds four f32 and `bytes` eight per group.
        unsafe {
            let v = super::simd::aarch64::float::f16x4(bytes, 8 * i);
            std::arch::aarch64::vst1q_f32(out.as_mut_ptr(), v);
        }
    }
    f16_to_f32_row_scalar(&src[body..n], &mut dst[body..n]);
}

/// [`f16_to_f32_row`] one value at a time: the reference the F16C path is tested against.
pub fn f16_to_f32_row_scalar(src: &[u16], dst: &mut [f32]) {
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(h);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn f16_to_f32_row_f16c(src: &[u16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = src.len().min(dst.len());
    let body = n / 8 * 8;
    let mut i = 0;
    while i < body {
        // SAFETY: i + 8 <= n, within both slices; unaligned loads and stores.
        let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    f16_to_f32_row_scalar(&src[body..n], &mut dst[body..n]);
}

/// Widen a BF16 bit pattern to f32 (exact: BF16 is the top half of an f32).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Narrow an f32 to BF16 with round-to-nearest-even; a NaN stays a NaN and is made quiet, as in
/// `ggml_compute_fp32_to_bf16`.
#[inline]
pub fn f32_to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_row_conversion_widens_every_f16_pattern_to_the_scalar_bits() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let (mut fast, mut reference) = (vec![0f32; all.len()], vec![0f32; all.len()]);
        // An odd length, so that the tail after the eight-wide body runs too.
        f16_to_f32_row(&all[..65_533], &mut fast[..65_533]);
        f16_to_f32_row_scalar(&all, &mut reference);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fast[..65_533]), bits(&reference[..65_533]));
    }

    #[test]
    fn every_finite_f16_survives_a_round_trip_through_f32() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f32_to_f16(f) & 0x7c00 == 0x7c00 && f32_to_f16(f) & 0x3ff != 0);
            } else {
                assert_eq!(f32_to_f16(f), h, "f16 bits {h:#06x} -> {f}");
            }
        }
    }

    #[test]
    fn f16_narrowing_rounds_halfway_cases_to_even() {
        // 1 + 2^-11 lies exactly between 1.0 (0x3c00) and the next f16 (0x3c01): ties to even.
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)), 0x3c00);
        // 1 + 3 * 2^-11 lies between 0x3c01 and 0x3c02: ties to the even 0x3c02.
        assert_eq!(f32_to_f16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00, "halfway past the max rounds to infinity");
        assert_eq!(f32_to_f16(1e-8), 0x0000);
        assert_eq!(f32_to_f16(f32::NAN), 0x7e00);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
    }

    #[test]
    fn bf16_narrowing_rounds_to_nearest_even_and_keeps_nan() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80, "tie to even (down)");
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82, "tie to even (up)");
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }
}
