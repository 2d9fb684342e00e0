//! The mixture-of-experts router and combiner: a row softmax, the top-k indices of a row, the
//! chosen experts' weights and the weighted sum of their outputs — the small ops around
//! llama.cpp's `build_moe_ffn` that are not matrix products (those are `MatMulId`, run by the
//! backend over [`super::matmul_rows`]).
//!
//! Each follows ggml-cpu's arithmetic (the softmax's sum in f64 and one reciprocal; the sum of
//! the weights in f64; products rounded before the adds, added in slot order), so the only
//! distance from llama.cpp is its vector `expf`. Selection must not depend on anything but the
//! values: ties go to the lower index, whatever the instruction set or thread count.

use super::math::exp_f32;
use super::{check_len, check_nonzero, KernelError};

/// Softmax of each row of `d` values of `x` into `out` (ggml's `soft_max` without a mask):
/// `exp(x - max)` in f32, their sum in f64, each scaled by the f32 reciprocal of the sum.
pub fn softmax_rows(x: &[f32], d: usize, out: &mut [f32]) -> Result<(), KernelError> {
    const K: &str = "softmax_rows";
    check_nonzero(K, "d", d)?;
    check_len(K, "out", out.len(), x.len())?;
    if !x.len().is_multiple_of(d) {
        return Err(KernelError::NotMultiple {
            kernel: K,
            operand: "x",
            got: x.len(),
            multiple_of: d,
        });
    }
    for (xr, yr) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let max = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f64;
        for (y, &v) in yr.iter_mut().zip(xr) {
            *y = exp_f32(v - max);
            sum += f64::from(*y);
        }
        let inv = (1.0 / sum) as f32;
        for y in yr.iter_mut() {
            *y *= inv;
        }
    }
    Ok(())
}

/// The indices of the `k` largest of each row of `d` values of `x`, largest first, into `ids`
/// (`k` a row). Equal values keep index order; a NaN sorts below every number.
pub fn top_k(x: &[f32], d: usize, k: usize, ids: &mut [i32]) -> Result<(), KernelError> {
    const K: &str = "top_k";
    check_nonzero(K, "d", d)?;
    check_nonzero(K, "k", k)?;
    if k > d {
        return Err(KernelError::TooSmall {
            kernel: K,
            operand: "d",
            needed: k,
            got: d,
        });
    }
    let rows = x.len() / d;
    check_len(K, "x", x.len(), rows * d)?;
    check_len(K, "ids", ids.len(), rows * k)?;
    for (xr, out) in x.chunks_exact(d).zip(ids.chunks_exact_mut(k)) {
        // Insertion into a sorted prefix of k: stable, and k is small (a router's 2 to 8).
        let mut n = 0usize;
        // `w` sorts at or above `v`: a NaN only at or above another NaN.
        let at_or_above = |w: f32, v: f32| v.is_nan() || (!w.is_nan() && w >= v);
        for (i, &v) in xr.iter().enumerate() {
            // After every kept value at or above v: those have lower indices, so ties keep order.
            let mut pos = n;
            while pos > 0 && !at_or_above(xr[out[pos - 1] as usize], v) {
                pos -= 1;
            }
            if pos >= k {
                continue;
            }
            out.copy_within(pos..n.min(k - 1), pos + 1);
            out[pos] = i as i32;
            n = (n + 1).min(k);
        }
    }
    Ok(())
}

/// The experts' weights: for each of the rows of `ids` (`k` indices), the values of the same row
/// of `probs` (`n_expert` a row) at those indices; with `norm`, divided by their sum (in f64,
/// rounded, clamped below at 2^-14 as llama.cpp clamps it); then times `scale` unless it is 1.
pub fn moe_weights(
    probs: &[f32],
    n_expert: usize,
    ids: &[i32],
    k: usize,
    norm: bool,
    scale: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    const K: &str = "moe_weights";
    check_nonzero(K, "n_expert", n_expert)?;
    check_nonzero(K, "k", k)?;
    let rows = ids.len() / k;
    check_len(K, "ids", ids.len(), rows * k)?;
    check_len(K, "probs", probs.len(), rows * n_expert)?;
    check_len(K, "out", out.len(), ids.len())?;
    for (index, &id) in ids.iter().enumerate() {
        if id < 0 || id as usize >= n_expert {
            return Err(KernelError::RowIdOutOfRange {
                kernel: K,
                index,
                id,
                n_rows: n_expert,
            });
        }
    }
    for ((pr, ir), wr) in probs
        .chunks_exact(n_expert)
        .zip(ids.chunks_exact(k))
        .zip(out.chunks_exact_mut(k))
    {
        for (w, &id) in wr.iter_mut().zip(ir) {
            *w = pr[id as usize];
        }
        if norm {
            let sum = wr.iter().map(|&w| f64::from(w)).sum::<f64>() as f32;
            let sum = sum.max(6.103_515_6e-5);
            for w in wr.iter_mut() {
                *w /= sum;
            }
        }
        if scale != 1.0 {
            for w in wr.iter_mut() {
                *w *= scale;
            }
        }
    }
    Ok(())
}

/// `out[t] = e(0, t) * w(0, t) + e(1, t) * w(1, t) + ...` for rows of `d` values: `experts` holds
/// `k` rows a token, `weights` `k` values a token. Each product is rounded to f32, then the
/// products are added in slot order (ggml's `mul` and its chain of `add`s).
pub fn moe_sum(experts: &[f32], weights: &[f32], d: usize, k: usize, out: &mut [f32]) -> Result<(), KernelError> {
    const K: &str = "moe_sum";
    check_nonzero(K, "d", d)?;
    check_nonzero(K, "k", k)?;
    let nt = out.len() / d;
    check_len(K, "out", out.len(), nt * d)?;
    check_len(K, "weights", weights.len(), nt * k)?;
    check_len(K, "experts", experts.len(), nt * k * d)?;
    for ((er, wr), yr) in experts
        .chunks_exact(k * d)
        .zip(weights.chunks_exact(k))
        .zip(out.chunks_exact_mut(d))
    {
        for (i, y) in yr.iter_mut().enumerate() {
            let mut acc = er[i] * wr[0];
            for s in 1..k {
                let p = er[s * d + i] * wr[s];
                acc += p;
            }
            *y = acc;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_takes_the_largest_first_and_breaks_ties_by_lower_index() {
        let x = [0.1, 0.5, 0.3, 0.5, -1.0, 0.9];
        let mut ids = [0i32; 4];
        top_k(&x, 6, 4, &mut ids).unwrap();
        assert_eq!(ids, [5, 1, 3, 2]);
        // Two rows, k = 1; a NaN never wins over a number.
        let x = [f32::NAN, -3.0, 2.0, 2.0];
        let mut ids = [0i32; 2];
        top_k(&x, 2, 1, &mut ids).unwrap();
        assert_eq!(ids, [1, 0]);
    }

    #[test]
    fn top_k_agrees_with_a_stable_sort_on_many_rows() {
        let mut state = 0x2545_f491_u32;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            // Few distinct values, so that ties are common.
            (state % 7) as f32 - 3.0
        };
        let (d, k) = (16, 5);
        let x: Vec<f32> = (0..d * 50).map(|_| next()).collect();
        let mut ids = vec![0i32; 50 * k];
        top_k(&x, d, k, &mut ids).unwrap();
        for (xr, ir) in x.chunks(d).zip(ids.chunks(k)) {
            let mut order: Vec<i32> = (0..d as i32).collect();
            order.sort_by(|&a, &b| xr[b as usize].total_cmp(&xr[a as usize]));
            assert_eq!(ir, &order[..k], "{xr:?}");
        }
    }

    #[test]
    fn softmax_rows_sum_to_one_and_keep_the_order() {
        let x = [1.0, 2.0, 3.0, -1.0, 100.0, 100.0];
        let mut p = [0.0; 6];
        softmax_rows(&x, 3, &mut p).unwrap();
        for row in p.chunks(3) {
            let s: f32 = row.iter().sum();
            assert!((s - 1.0).abs() < 1e-6, "{row:?}");
        }
        let e = [(-2.0f64).exp(), (-1.0f64).exp(), 1.0];
        let total: f64 = e.iter().sum();
        for (got, want) in p[..3].iter().zip(e.iter().map(|v| v / total)) {
            assert!((f64::from(*got) - want).abs() < 1e-6, "{got} vs {want}");
        }
        assert_eq!(p[4], p[5]);
    }

    #[test]
    fn moe_weights_gather_normalize_and_scale() {
        let probs = [0.1, 0.2, 0.3, 0.4, 0.7, 0.1, 0.1, 0.1];
        let ids = [3, 1, 0, 2];
        let mut w = [0.0; 4];
        moe_weights(&probs, 4, &ids, 2, false, 1.0, &mut w).unwrap();
        assert_eq!(w, [0.4, 0.2, 0.7, 0.1]);
        moe_weights(&probs, 4, &ids, 2, true, 2.0, &mut w).unwrap();
        assert_eq!(
            w,
            [0.4f32 / 0.6 * 2.0, 0.2f32 / 0.6 * 2.0, 0.7 / 0.8 * 2.0, 0.1 / 0.8 * 2.0]
        );
        let bad = [0, 4];
        assert!(matches!(
            moe_weights(&probs[..4], 4, &bad, 2, false, 1.0, &mut w[..2]),
            Err(KernelError::RowIdOutOfRange { id: 4, .. })
        ));
    }

    #[test]
    fn moe_sum_adds_the_rounded_products_in_slot_order() {
        let experts = [1.0, 2.0, 10.0, 20.0, 3.0, 4.0, 5.0, 6.0];
        let weights = [0.5, 0.25, 2.0, 1.0];
        let mut out = [0.0; 4];
        moe_sum(&experts, &weights, 2, 2, &mut out).unwrap();
        assert_eq!(out, [0.5 + 2.5, 1.0 + 5.0, 6.0 + 5.0, 8.0 + 6.0]);
    }
}
