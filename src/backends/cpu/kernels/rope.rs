//! Rotary position embedding, in place, as ggml's `rope_ext`: linear position scaling
//! (`freq_scale`), YaRN's blend of scaled and unscaled angles (`ext_factor` over the correction
//! dimensions), per-pair frequency factors (Llama 3.1's `rope_freqs`, Phi-3's LongRoPE factors)
//! and the magnitude factor `attn_factor`. Owns the rotation angles and the pairing of
//! dimensions; must not know which model wants which style.

use super::{check_len, size, KernelError};
use crate::graph::RopeMeta;
pub use crate::graph::RopeStyle;

/// Rotate the first `r.n_rot` dimensions of every one of the `n_head` heads of `x`
/// (`[head_dim * n_head, n_tokens]`) by the angles of token `t`'s position `positions[t]`;
/// dimensions from `n_rot` on are left unchanged. `factors` holds the values of the weight
/// `r.freq_factors` names (n_rot / 2 of them), resolved by the caller.
///
/// Pair `i` turns by `freq_scale * (theta_i / factor_i)` (with YaRN, blended with
/// `theta_i / factor_i` by [`crate::graph::YarnMeta::angle`]) with `theta_i = p *
/// freq_base^(-2i / n_rot)`, computed as ggml's rope cache does: `theta_scale = powf(freq_base, -2 / n_rot)`,
/// `theta_0 = p` and `theta_{i+1} = theta_i * theta_scale`, all in f32, so the angles carry
/// ggml's rounding rather than the exact powers.
pub fn rope(
    x: &mut [f32],
    positions: &[i32],
    n_tokens: usize,
    n_head: usize,
    r: &RopeMeta,
    factors: Option<&[f32]>,
) -> Result<(), KernelError> {
    const K: &str = "rope";
    let (head_dim, n_rot) = (r.head_dim, r.n_rot);
    if !n_rot.is_multiple_of(2) || n_rot > head_dim {
        return Err(KernelError::RotaryDims {
            kernel: K,
            n_rot,
            head_dim,
        });
    }
    let row = size(K, "x", head_dim, n_head)?;
    check_len(K, "x", x.len(), size(K, "x", row, n_tokens)?)?;
    check_len(K, "positions", positions.len(), n_tokens)?;
    if let Some(f) = factors {
        check_len(K, "freq_factors", f.len(), n_rot / 2)?;
    }
    if row == 0 || n_rot == 0 {
        return Ok(());
    }
    let theta_scale = r.theta_scale();
    let (stride, offset) = match r.style {
        RopeStyle::Normal => (2, 1),
        RopeStyle::Neox => (1, n_rot / 2),
    };
    for (xt, &p) in x.chunks_exact_mut(row).zip(positions) {
        // One angle at a time across all heads: the cos/sin are shared by every head, as ggml's
        // per-token cache is, without a buffer to hold them.
        let mut theta = p as f32;
        for i in 0..n_rot / 2 {
            let angle = r.angle(i, theta, factors.map_or(1.0, |f| f[i]));
            // ggml scales cos and sin themselves (by 1: unchanged).
            let (sin_theta, cos_theta) = (angle.sin() * r.attn_factor, angle.cos() * r.attn_factor);
            let i0 = i * stride;
            for head in xt.chunks_exact_mut(head_dim) {
                let x0 = head[i0];
                let x1 = head[i0 + offset];
                head[i0] = x0 * cos_theta - x1 * sin_theta;
                head[i0 + offset] = x0 * sin_theta + x1 * cos_theta;
            }
            theta *= theta_scale;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::XorShift;

    fn meta(head_dim: usize, n_rot: usize, freq_base: f32, style: RopeStyle) -> RopeMeta {
        RopeMeta {
            style,
            n_head: 0,
            head_dim,
            n_rot,
            freq_base,
            freq_scale: 1.0,
            freq_factors: None,
            attn_factor: 1.0,
            yarn: None,
        }
    }

    /// RoPE without scaling, its geometry spelled out.
    #[allow(clippy::too_many_arguments)]
    fn plain(
        x: &mut [f32],
        positions: &[i32],
        n_tokens: usize,
        n_head: usize,
        head_dim: usize,
        n_rot: usize,
        base: f32,
        style: RopeStyle,
    ) -> Result<(), KernelError> {
        rope(
            x,
            positions,
            n_tokens,
            n_head,
            &meta(head_dim, n_rot, base, style),
            None,
        )
    }

    /// The pairs of dimensions `style` rotates together, pair `i` first.
    fn pairs(style: RopeStyle, n_rot: usize) -> Vec<(usize, usize)> {
        (0..n_rot / 2)
            .map(|i| match style {
                RopeStyle::Normal => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + n_rot / 2),
            })
            .collect()
    }

    #[test]
    fn heads_turn_by_the_analytic_angles_in_both_styles() {
        let mut r = XorShift(31);
        let (n_head, head_dim, n_rot, base) = (3, 64, 48, 1_000_000.0f32);
        let positions = [0, 1, 7, 100, 4000];
        let n_tokens = positions.len();
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let x = r.vec(n_head * head_dim * n_tokens, 1.0);
            let mut y = x.clone();
            plain(&mut y, &positions, n_tokens, n_head, head_dim, n_rot, base, style).unwrap();
            for (t, &p) in positions.iter().enumerate() {
                for h in 0..n_head {
                    let at = |i: usize| t * n_head * head_dim + h * head_dim + i;
                    for (i, (a, b)) in pairs(style, n_rot).into_iter().enumerate() {
                        let theta = p as f64 * (base as f64).powf(-2.0 * i as f64 / n_rot as f64);
                        let (x0, x1) = (x[at(a)] as f64, x[at(b)] as f64);
                        let e0 = x0 * theta.cos() - x1 * theta.sin();
                        let e1 = x0 * theta.sin() + x1 * theta.cos();
                        // The f32 angle is p times i + 1 rounded factors: its error grows with
                        // the angle itself (ggml's rope cache has the same error).
                        let angle_err = theta * (2 * i + 2) as f64 * f32::EPSILON as f64;
                        let tol = (1e-5 + angle_err) * x0.hypot(x1) + 1e-6;
                        assert!((y[at(a)] as f64 - e0).abs() <= tol, "{style:?} p={p} pair {i}");
                        assert!((y[at(b)] as f64 - e1).abs() <= tol, "{style:?} p={p} pair {i}");
                    }
                    for i in n_rot..head_dim {
                        assert_eq!(y[at(i)].to_bits(), x[at(i)].to_bits(), "dimension {i} is not rotated");
                    }
                }
            }
        }
    }

    #[test]
    fn angles_follow_ggmls_iterated_f32_theta() {
        // Rotating the unit vector of each pair exposes (cos theta, sin theta) as computed.
        let (head_dim, n_rot, base, p) = (16, 16, 10_000.0f32, 37);
        let mut x = vec![0.0f32; head_dim];
        for (a, _) in pairs(RopeStyle::Neox, n_rot) {
            x[a] = 1.0;
        }
        plain(&mut x, &[p], 1, 1, head_dim, n_rot, base, RopeStyle::Neox).unwrap();
        let theta_scale = base.powf(-2.0 / n_rot as f32);
        let mut theta = p as f32;
        for (a, b) in pairs(RopeStyle::Neox, n_rot) {
            assert_eq!(x[a].to_bits(), (theta.cos() - 0.0 * theta.sin()).to_bits());
            assert_eq!(x[b].to_bits(), (theta.sin() + 0.0 * theta.cos()).to_bits());
            theta *= theta_scale;
        }
    }

    #[test]
    fn frequency_factors_linear_scaling_and_attn_factor_turn_and_scale_each_pair_as_ggml() {
        // Llama 3.1's factors: 1 for the fast pairs, 8 for the slow ones, smooth in between.
        let (head_dim, n_rot, base) = (16, 16, 500_000.0f32);
        let factors: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + i as f32).collect();
        for (freq_scale, p, attn_factor) in [(1.0f32, 123, 1.0f32), (0.25, 4097, 1.19)] {
            let r = RopeMeta {
                freq_scale,
                freq_factors: Some("rope_freqs.weight".into()),
                attn_factor,
                ..meta(head_dim, n_rot, base, RopeStyle::Normal)
            };
            let mut x = vec![0.0f32; head_dim];
            for i in 0..n_rot / 2 {
                x[2 * i] = 1.0;
            }
            rope(&mut x, &[p], 1, 1, &r, Some(&factors)).unwrap();
            for (i, f) in factors.iter().enumerate() {
                let theta =
                    freq_scale as f64 * p as f64 * (base as f64).powf(-2.0 * i as f64 / n_rot as f64) / *f as f64;
                let tol = 1e-5 + theta * (2 * i + 4) as f64 * f32::EPSILON as f64;
                assert!(
                    (x[2 * i] as f64 - attn_factor as f64 * theta.cos()).abs() <= tol,
                    "scale {freq_scale} pair {i}"
                );
                assert!(
                    (x[2 * i + 1] as f64 - attn_factor as f64 * theta.sin()).abs() <= tol,
                    "scale {freq_scale} pair {i}"
                );
            }
        }
        let mut x = vec![0.0; head_dim];
        let err = rope(
            &mut x,
            &[1],
            1,
            1,
            &meta(head_dim, n_rot, base, RopeStyle::Normal),
            Some(&[1.0; 3]),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "rope: freq_factors has length 3, expected 8");
    }

    #[test]
    fn position_zero_is_the_identity() {
        let mut r = XorShift(32);
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let x = r.vec(2 * 32, 5.0);
            let mut y = x.clone();
            plain(&mut y, &[0], 1, 2, 32, 32, 10_000.0, style).unwrap();
            assert_eq!(x, y, "{style:?}");
        }
    }

    #[test]
    fn bad_sizes_are_refused_naming_the_kernel_and_the_sizes() {
        let mut x = vec![0.0; 64];
        let err = plain(&mut x, &[0], 1, 2, 32, 33, 1e4, RopeStyle::Neox).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rope: n_rot = 33 must be even and at most head_dim = 32"
        );
        let err = plain(&mut x, &[0], 1, 2, 32, 34, 1e4, RopeStyle::Neox).unwrap_err();
        assert!(matches!(err, KernelError::RotaryDims { n_rot: 34, .. }));
        let err = plain(&mut x, &[0, 1], 2, 2, 32, 32, 1e4, RopeStyle::Normal).unwrap_err();
        assert_eq!(err.to_string(), "rope: x has length 64, expected 128");
        let err = plain(&mut x, &[0, 1], 1, 2, 32, 32, 1e4, RopeStyle::Normal).unwrap_err();
        assert_eq!(err.to_string(), "rope: positions has length 2, expected 1");
    }

    #[test]
    fn yarn_blends_scaled_and_unscaled_angles_along_ggmls_ramp() {
        // gpt-oss's rotation: base 150000, factor 32 over an original context of 4096, betas
        // 32 and 1, 64-wide heads.
        let (head_dim, n_rot, base, freq_scale) = (64, 64, 150_000.0f32, 1.0f32 / 32.0);
        let corr_dims = crate::graph::YarnMeta::corr_dims(n_rot, 4096, base, 32.0, 1.0);
        let r = RopeMeta {
            freq_scale,
            attn_factor: 1.25,
            yarn: Some(crate::graph::YarnMeta {
                ext_factor: 1.0,
                corr_dims,
            }),
            ..meta(head_dim, n_rot, base, RopeStyle::Normal)
        };
        // The correction dimensions in f64: pairs below low keep the unscaled angle, above high
        // the scaled one.
        let dim =
            |beta: f64| n_rot as f64 * (4096.0 / (beta * 2.0 * std::f64::consts::PI)).ln() / (2.0 * (base as f64).ln());
        assert_eq!(corr_dims, [dim(32.0).floor() as f32, dim(1.0).ceil() as f32]);
        let (low, high) = (corr_dims[0] as f64, corr_dims[1] as f64);
        assert!(0.0 < low && low < high && high < (n_rot / 2) as f64, "{corr_dims:?}");
        let p = 1000;
        let mut x = vec![0f32; head_dim];
        for i in 0..head_dim / 2 {
            x[2 * i] = 1.0;
        }
        rope(&mut x, &[p], 1, 1, &r, None).unwrap();
        for i in 0..n_rot / 2 {
            let extrap = p as f64 * (base as f64).powf(-2.0 * i as f64 / n_rot as f64);
            let ramp = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let theta = extrap * freq_scale as f64 * (1.0 - ramp) + extrap * ramp;
            // f32 angles built by 31 roundings of up to 1000 radians: within a few 1e-3.
            let tol = 1e-2;
            assert!((x[2 * i] as f64 - 1.25 * theta.cos()).abs() <= tol, "pair {i}");
            assert!((x[2 * i + 1] as f64 - 1.25 * theta.sin()).abs() <= tol, "pair {i}");
        }
    }
}
