//! RMS normalization of token rows, as ggml's `rms_norm` (optionally followed by `mul` with the
//! norm weight). Owns the per-row scale computation; must not fuse anything that would change
//! ggml's rounding points.

use super::{check_len, check_nonzero, KernelError};

/// `out = x * (1 / sqrt(mean(x²) + eps))` for each row of `d` values of `x`.
pub fn rms_norm(x: &[f32], d: usize, eps: f32, out: &mut [f32]) -> Result<(), KernelError> {
    const K: &str = "rms_norm";
    check_rows(K, x, d, out)?;
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let scale = rms_scale(xr, eps);
        for (o, &v) in or.iter_mut().zip(xr) {
            *o = v * scale;
        }
    }
    Ok(())
}

/// [`rms_norm`] then multiplication by the norm `weight` (length `d`), rounded as ggml's
/// `rms_norm` followed by `mul`: `out = (x * scale) * weight`.
pub fn rms_norm_mul(x: &[f32], weight: &[f32], d: usize, eps: f32, out: &mut [f32]) -> Result<(), KernelError> {
    const K: &str = "rms_norm_mul";
    check_rows(K, x, d, out)?;
    check_len(K, "weight", weight.len(), d)?;
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let scale = rms_scale(xr, eps);
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = (v * scale) * w;
        }
    }
    Ok(())
}

fn check_rows(kernel: &'static str, x: &[f32], d: usize, out: &[f32]) -> Result<(), KernelError> {
    check_nonzero(kernel, "d", d)?;
    if !x.len().is_multiple_of(d) {
        return Err(KernelError::NotMultiple {
            kernel,
            operand: "x",
            got: x.len(),
            multiple_of: d,
        });
    }
    check_len(kernel, "out", out.len(), x.len())
}

/// ggml squares in f32 and sums the squares in f64 (`ggml_float`): the f64 sum is what keeps the
/// scale stable for wide rows, and the f32 square is what makes it ggml's. The mean is narrowed
/// to f32 before `eps` is added.
fn rms_scale(row: &[f32], eps: f32) -> f32 {
    let mut sum = 0.0f64;
    for &v in row {
        sum += (v * v) as f64;
    }
    let mean = (sum / row.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::XorShift;

    #[test]
    fn each_row_is_scaled_to_unit_root_mean_square() {
        let mut r = XorShift(21);
        let (d, n) = (96, 3);
        let x = r.vec(d * n, 3.0);
        let mut out = vec![0.0; d * n];
        rms_norm(&x, d, 1e-6, &mut out).unwrap();
        for (xr, or) in x.chunks(d).zip(out.chunks(d)) {
            let ms: f64 = xr.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
            let scale = 1.0 / (ms + 1e-6).sqrt();
            for (&v, &o) in xr.iter().zip(or) {
                let expected = v as f64 * scale;
                assert!(
                    (o as f64 - expected).abs() <= 1e-6 * expected.abs() + 1e-7,
                    "{o} vs {expected}"
                );
            }
            let rms: f64 = (or.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64).sqrt();
            assert!((rms - 1.0).abs() < 1e-5, "{rms}");
        }
    }

    #[test]
    fn squares_are_summed_in_f64_as_ggml_does() {
        // 4096² = 2^24: an f32 running sum would absorb each following 1.0 and lose all 1000.
        let mut x = vec![1.0f32; 1001];
        x[0] = 4096.0;
        let mut out = vec![0.0; 1001];
        rms_norm(&x, 1001, 1e-5, &mut out).unwrap();
        let mean = ((16_777_216.0f64 + 1000.0) / 1001.0) as f32;
        let scale = 1.0f32 / (mean + 1e-5f32).sqrt();
        assert_eq!(out[1].to_bits(), scale.to_bits());
        assert_eq!(out[0].to_bits(), (4096.0 * scale).to_bits());
    }

    #[test]
    fn the_weighted_form_multiplies_after_scaling() {
        let mut r = XorShift(22);
        let (d, n) = (64, 2);
        let x = r.vec(d * n, 1.0);
        let w = r.vec(d, 2.0);
        let mut plain = vec![0.0; d * n];
        let mut fused = vec![0.0; d * n];
        rms_norm(&x, d, 1e-6, &mut plain).unwrap();
        rms_norm_mul(&x, &w, d, 1e-6, &mut fused).unwrap();
        for (i, (&p, &f)) in plain.iter().zip(&fused).enumerate() {
            assert_eq!(f.to_bits(), (p * w[i % d]).to_bits());
        }
    }

    #[test]
    fn bad_sizes_are_refused_naming_the_kernel_and_the_sizes() {
        let err = rms_norm(&[0.0; 10], 4, 1e-6, &mut [0.0; 10]).unwrap_err();
        assert_eq!(err.to_string(), "rms_norm: x has length 10, not a multiple of 4");
        let err = rms_norm(&[0.0; 8], 4, 1e-6, &mut [0.0; 4]).unwrap_err();
        assert_eq!(err.to_string(), "rms_norm: out has length 4, expected 8");
        let err = rms_norm_mul(&[0.0; 8], &[1.0; 3], 4, 1e-6, &mut [0.0; 8]).unwrap_err();
        assert_eq!(err.to_string(), "rms_norm_mul: weight has length 3, expected 4");
        let err = rms_norm(&[], 0, 1e-6, &mut []).unwrap_err();
        assert_eq!(err.to_string(), "rms_norm: d must not be zero");
    }
}
