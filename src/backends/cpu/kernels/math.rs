//! Elementary functions written so that the compiler vectorizes them: branch-free arithmetic
//! on f32 with no library calls, giving the same bits in a vector lane as in a scalar register
//! (separate IEEE multiplies and adds; Rust never fuses them). Owns the accuracy of those
//! functions; must not know where they are used.
//!
//! [`exp_f32`] replaces libm's `expf` in the softmax and SiLU: a call per value cannot be
//! vectorized, and the two were 13 % of a 512-token prefill. It is within 2 ulp of the exact value (a test sweeps it
//! against f64).
//!
//! [`tanh_f32`] replaces libm's `tanhf` (Gemma 2's soft-caps): glibc's differs between x86-64
//! and aarch64 in the last bit of some values, and the logits must not.

/// Runs `f` compiled for AVX-512 (F, VL) where the CPU has it and the dot-product choice allows
/// it (`MINFER_NO_AVX512`), so that the loops it inlines are vectorized 16 lanes wide; otherwise
/// runs it as it is. The arithmetic, and so every bit of the result, is the same either way.
#[inline(always)]
pub fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if is_wide() {
        #[target_feature(enable = "avx512f,avx512vl,avx2")]
        unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: `is_wide` checked AVX-512 F and VL (and AVX2).
        return unsafe { run(f) };
    }
    f()
}

/// Whether [`wide`] compiles for AVX-512 F and VL: the CPU has them and `MINFER_NO_AVX512`
/// does not turn them off.
pub fn is_wide() -> bool {
    cfg!(target_arch = "x86_64") && crate::quant::simd::isa() == crate::quant::simd::Isa::Avx512
}

/// 1.5 · 2^23: adding and subtracting it rounds an f32 of magnitude below 2^22 to the nearest
/// integer (ties to even) in the default rounding mode.
const ROUND: f32 = 12_582_912.0;

/// `e^x`, branch-free: `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2` (Cody and Waite's two-part ln 2,
/// whose high part times any `n` here is exact), `e^r` by its Taylor polynomial to degree 7
/// (truncation below 2^-27 relative), and `2^n` built in the exponent bits. Below -87 the result
/// is 0 (the true value is under 1.7e-38, near the subnormals); above 88.72, where the true
/// value overflows f32, it is infinity; in between it stays at e^88.3 (2^n must stay normal);
/// NaN stays NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4; // 355 / 512: 9 significant bits
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = x.clamp(-87.0, 88.3);
    let shifted = xc * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // n is in -126..=127 after the clamp: a normal power of two. `shifted` and ROUND share
    // their exponent, so n is also the difference of their bits: integer arithmetic that
    // vectorizes, where `n as i32` (saturating, NaN to 0) became a scalar conversion per lane.
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let two_n = f32::from_bits(n_bits.wrapping_add(127) << 23);
    let y = p * two_n;
    if x < -87.0 {
        0.0
    } else if x > 88.72 {
        f32::INFINITY
    } else {
        y
    }
}

/// `tanh(x)` rounded to f32 from an f64 computation of IEEE adds, multiplies and divides only
/// (no library call, so every platform gives the same bits): `expm1(2|x|)` by its Taylor series
/// below 0.5 (to degree 16: truncation under 1e-17 relative) and by `e^t - 1` above (`e^t`
/// from `t = k·ln 2 + r`, `|r| ≤ ln 2 / 2`, Taylor to degree 14, `2^k` in the exponent bits),
/// then `tanh = m / (m + 2)` with the sign put back. From |x| = 9.1 it is ±1 (as f32's nearest
/// value is); NaN stays NaN.
pub fn tanh_f32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = f64::from(x.abs());
    if a >= 9.1 {
        return 1f32.copysign(x);
    }
    let t = 2.0 * a;
    let m = if t < 0.5 {
        // expm1(t) = t + t^2/2! + ... + t^16/16!, Horner from the top.
        let mut p = 0.0f64;
        for n in (1..=16).rev() {
            p = (p + 1.0) * t / f64::from(n);
        }
        p
    } else {
        // fdlibm's two-part ln 2: the high part has 32 significant bits, so k · LN2_HI is exact.
        const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
        const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
        let k = (t * std::f64::consts::LOG2_E + 0.5).floor();
        let r = (t - k * LN2_HI) - k * LN2_LO;
        let mut p = 0.0f64;
        for n in (1..=14).rev() {
            p = (p + 1.0) * r / f64::from(n);
        }
        let e = (p + 1.0) * f64::from_bits(((1023 + k as i64) as u64) << 52);
        e - 1.0
    };
    ((m / (m + 2.0)) as f32).copysign(x)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tanh_is_within_one_ulp_of_f64s_over_the_whole_range_and_odd() {
        let mut worst = 0u32;
        for i in -200_000..=200_000 {
            let x = i as f32 * 5e-5; // -10 ..= 10, through the 0.25 switch and the ±9.1 cut
            let got = super::tanh_f32(x);
            let want = (x as f64).tanh() as f32;
            worst = worst.max(got.to_bits().abs_diff(want.to_bits()));
            assert_eq!(super::tanh_f32(-x).to_bits(), (-got).to_bits(), "odd at {x}");
        }
        assert!(worst <= 1, "{worst} ulp");
        for x in [1e-30f32, 1e-8, 0.0] {
            assert_eq!(super::tanh_f32(x), x, "tanh of tiny {x} is itself");
        }
        assert_eq!(super::tanh_f32(50.0), 1.0);
        assert!(super::tanh_f32(f32::NAN).is_nan());
    }

    use super::*;

    /// Distance in units in the last place between two positive finite f32.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_exact_value_over_the_softmax_range() {
        let mut worst = (0, 0.0f32);
        let mut x = -87.0f32;
        while x <= 88.3 {
            let exact = (x as f64).exp() as f32;
            let u = ulps(exp_f32(x), exact);
            if u > worst.0 {
                worst = (u, x);
            }
            x += 0.000_731;
        }
        assert!(worst.0 <= 2, "{} ulp at x = {}", worst.0, worst.1);
    }

    #[test]
    fn exp_keeps_the_special_values() {
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-1000.0), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert_eq!(exp_f32(88.7), exp_f32(88.3));
        assert_eq!(exp_f32(1.0), std::f32::consts::E);
    }
}
