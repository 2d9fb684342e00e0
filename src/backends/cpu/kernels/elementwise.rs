//! Element-wise f32 operations: sums and products (plain and broadcast over token rows), the
//! SiLU-family activations, GELU through ggml's f16 table, and scaling, with ggml's per-element
//! formulas. Owns nothing but those formulas;
//! must not reorder or fuse arithmetic in a way that changes a result bit (the fused `swiglu`
//! is bit-identical to `silu` then `mul` by construction).

use super::math::{exp_f32, wide};
use super::{check_len, KernelError};
use crate::quant::fp16::{f16_to_f32, f32_to_f16};

/// `out = a + b`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    zip_with("add", a, b, out, |x, y| x + y)
}

/// `out = a * b`.
pub fn mul(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    zip_with("mul", a, b, out, |x, y| x * y)
}

/// `a += b` (the residual connection).
pub fn add_inplace(a: &mut [f32], b: &[f32]) -> Result<(), KernelError> {
    update_with("add_inplace", a, b, |x, y| x + y)
}

/// `a *= b`.
pub fn mul_inplace(a: &mut [f32], b: &[f32]) -> Result<(), KernelError> {
    update_with("mul_inplace", a, b, |x, y| x * y)
}

/// `out = a + b` with `b` (length `d`, a bias) added to every row of `a` (`[d, n]`).
pub fn add_row_broadcast(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    broadcast_with("add_row_broadcast", a, b, out, |x, y| x + y)
}

/// `out = a * b` with `b` (length `d`, a norm weight) multiplied into every row of `a` (`[d, n]`).
pub fn mul_row_broadcast(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    broadcast_with("mul_row_broadcast", a, b, out, |x, y| x * y)
}

/// [`add_row_broadcast`] in place.
pub fn add_row_broadcast_inplace(a: &mut [f32], b: &[f32]) -> Result<(), KernelError> {
    broadcast_update_with("add_row_broadcast_inplace", a, b, |x, y| x + y)
}

/// [`mul_row_broadcast`] in place.
pub fn mul_row_broadcast_inplace(a: &mut [f32], b: &[f32]) -> Result<(), KernelError> {
    broadcast_update_with("mul_row_broadcast_inplace", a, b, |x, y| x * y)
}

/// `out = silu(x) = x / (1 + exp(-x))`, in f32 (`ggml_silu_f32`).
pub fn silu(x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    check_len("silu", "out", out.len(), x.len())?;
    wide(|| {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = silu_f32(v);
        }
    });
    Ok(())
}

/// [`silu`] in place.
pub fn silu_inplace(x: &mut [f32]) {
    wide(|| {
        for v in x {
            *v = silu_f32(*v);
        }
    })
}

/// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): `g = min(gate, limit)`, `u = clamp(up,
/// -limit, limit)`, `out = g / (1 + exp(alpha * -g)) * (u + 1)`, with ggml-cpu's comparisons (a
/// NaN passes through as in `std::min` and `std::clamp`) and its scalar `expf`.
pub fn swiglu_oai(gate: &[f32], up: &[f32], alpha: f32, limit: f32, out: &mut [f32]) -> Result<(), KernelError> {
    check_len("swiglu_oai", "up", up.len(), gate.len())?;
    check_len("swiglu_oai", "out", out.len(), gate.len())?;
    for ((o, &x), &y) in out.iter_mut().zip(gate).zip(up) {
        let x = if limit < x { limit } else { x };
        let y = if y < -limit {
            -limit
        } else if limit < y {
            limit
        } else {
            y
        };
        *o = x / (1.0 + (alpha * -x).exp()) * (y + 1.0);
    }
    Ok(())
}

/// `out = 1 / (1 + exp(-x))` element-wise (ggml's `sigmoid`).
pub fn sigmoid(x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    check_len("sigmoid", "out", out.len(), x.len())?;
    wide(|| {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = 1.0 / (1.0 + exp_f32(-v));
        }
    });
    Ok(())
}

/// [`sigmoid`] in place.
pub fn sigmoid_inplace(x: &mut [f32]) {
    wide(|| {
        for v in x {
            *v = 1.0 / (1.0 + exp_f32(-*v));
        }
    })
}

/// ggml's GELU table: the f16 result of the tanh-approximated GELU of every f16 value (its
/// `ggml_table_gelu_f16`, filled once as ggml fills it at init).
fn gelu_table() -> &'static [u16] {
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|h| {
                let x = f16_to_f32(h);
                const GELU_COEF_A: f32 = 0.044715;
                const SQRT_2_OVER_PI: f32 = 0.797_884_6;
                f32_to_f16(0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh()))
            })
            .collect()
    })
}

/// GELU of one value as ggml's CPU computes it (`ggml_vec_gelu_f32` with `GGML_GELU_FP16`):
/// 0 at or below -10, `x` at or above 10, else the table's f16 result for `x` rounded to f16.
#[inline]
pub fn gelu_f32(x: f32, table: &[u16]) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16_to_f32(table[f32_to_f16(x) as usize])
    }
}

/// `out = gelu(x)`, element by element ([`gelu_f32`]).
pub fn gelu(x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    check_len("gelu", "out", out.len(), x.len())?;
    let table = gelu_table();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = gelu_f32(v, table);
    }
    Ok(())
}

/// [`gelu`] in place.
pub fn gelu_inplace(x: &mut [f32]) {
    let table = gelu_table();
    for v in x {
        *v = gelu_f32(*v, table);
    }
}

/// `out = x * s`, element by element (`ggml_vec_scale_f32`: one f32 product each, whatever the
/// vector width).
pub fn scale(x: &[f32], s: f32, out: &mut [f32]) -> Result<(), KernelError> {
    check_len("scale", "out", out.len(), x.len())?;
    wide(|| {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v * s;
        }
    });
    Ok(())
}

/// [`scale`] in place.
pub fn scale_inplace(x: &mut [f32], s: f32) {
    wide(|| {
        for v in x {
            *v *= s;
        }
    })
}

/// `cap * tanh(x / cap)` of one value, as ggml's three ops give it: `x * (1 / cap)` rounded,
/// its tanh ([`tanh_f32`](super::math::tanh_f32), not libm's, whose last bit differs between
/// platforms), times `cap`.
#[inline]
fn softcap_f32(x: f32, inv: f32, cap: f32) -> f32 {
    super::math::tanh_f32(x * inv) * cap
}

/// `out = cap * tanh(x / cap)`, element by element (Gemma 2's final logit soft-cap).
pub fn softcap(x: &[f32], cap: f32, out: &mut [f32]) -> Result<(), KernelError> {
    check_len("softcap", "out", out.len(), x.len())?;
    let inv = 1.0 / cap;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = softcap_f32(v, inv, cap);
    }
    Ok(())
}

/// [`softcap`] in place.
pub fn softcap_inplace(x: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    for v in x {
        *v = softcap_f32(*v, inv, cap);
    }
}

/// `out = silu(gate) * up`, element by element (`ggml_vec_swiglu_f32`).
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    zip_with("swiglu", gate, up, out, |g, u| silu_f32(g) * u)
}

/// [`swiglu`] in place over `gate`.
pub fn swiglu_inplace(gate: &mut [f32], up: &[f32]) -> Result<(), KernelError> {
    update_with("swiglu_inplace", gate, up, |g, u| silu_f32(g) * u)
}

/// The one SiLU formula every entry point shares, so fused and unfused forms agree bit for bit.
/// The exponential is the vectorizable [`exp_f32`] (ggml's vector SiLU likewise uses its own
/// polynomial `expf`).
#[inline(always)]
fn silu_f32(x: f32) -> f32 {
    x / (1.0 + exp_f32(-x))
}

fn zip_with(
    kernel: &'static str,
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    f: impl Fn(f32, f32) -> f32,
) -> Result<(), KernelError> {
    check_len(kernel, "b", b.len(), a.len())?;
    check_len(kernel, "out", out.len(), a.len())?;
    wide(|| {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = f(x, y);
        }
    });
    Ok(())
}

fn update_with(kernel: &'static str, a: &mut [f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> Result<(), KernelError> {
    check_len(kernel, "b", b.len(), a.len())?;
    wide(|| {
        for (x, &y) in a.iter_mut().zip(b) {
            *x = f(*x, y);
        }
    });
    Ok(())
}

fn check_broadcast(kernel: &'static str, a: usize, d: usize) -> Result<(), KernelError> {
    // An empty `b` broadcasts only over an empty `a`.
    if (d == 0 && a != 0) || (d != 0 && !a.is_multiple_of(d)) {
        return Err(KernelError::NotMultiple {
            kernel,
            operand: "a",
            got: a,
            multiple_of: d,
        });
    }
    Ok(())
}

fn broadcast_with(
    kernel: &'static str,
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    f: impl Fn(f32, f32) -> f32,
) -> Result<(), KernelError> {
    check_broadcast(kernel, a.len(), b.len())?;
    check_len(kernel, "out", out.len(), a.len())?;
    if b.is_empty() {
        return Ok(());
    }
    for (or, ar) in out.chunks_exact_mut(b.len()).zip(a.chunks_exact(b.len())) {
        for ((o, &x), &y) in or.iter_mut().zip(ar).zip(b) {
            *o = f(x, y);
        }
    }
    Ok(())
}

fn broadcast_update_with(
    kernel: &'static str,
    a: &mut [f32],
    b: &[f32],
    f: impl Fn(f32, f32) -> f32,
) -> Result<(), KernelError> {
    check_broadcast(kernel, a.len(), b.len())?;
    if b.is_empty() {
        return Ok(());
    }
    for ar in a.chunks_exact_mut(b.len()) {
        for (x, &y) in ar.iter_mut().zip(b) {
            *x = f(*x, y);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn swiglu_oai_clamps_the_gate_above_and_up_both_ways_then_gates_with_a_steeper_sigmoid() {
        let gate = [10.0f32, 0.0, -1.0, 3.0, -30.0];
        let up = [-9.0f32, 5.0, 0.5, 8.0, 2.0];
        let mut out = [0.0f32; 5];
        swiglu_oai(&gate, &up, 1.702, 7.0, &mut out).unwrap();
        for (i, (&g, &u)) in gate.iter().zip(&up).enumerate() {
            let g = f64::from(g).min(7.0);
            let u = f64::from(u).clamp(-7.0, 7.0);
            let want = g / (1.0 + (-1.702 * g).exp()) * (u + 1.0);
            let have = f64::from(out[i]);
            assert!(
                (have - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "{i}: {have} vs {want}"
            );
        }
        // The clamps bite: a gate of 10 acts as 7, an up of -9 as -7.
        assert!((f64::from(out[0]) - 7.0 / (1.0 + (-1.702f64 * 7.0).exp()) * -6.0).abs() < 1e-4);
    }
    use super::*;

    #[test]
    fn softcap_is_cap_times_tanh_of_x_over_cap_and_in_place_gives_the_same_bits() {
        let cap = 30.0f32;
        let xs: Vec<f32> = (-4000..=4000).map(|i| i as f32 * 0.11).collect();
        let mut ys = vec![0.0; xs.len()];
        softcap(&xs, cap, &mut ys).unwrap();
        for (&x, &y) in xs.iter().zip(&ys) {
            let want = cap as f64 * (x as f64 / cap as f64).tanh();
            assert!((y as f64 - want).abs() <= 4e-6 * cap as f64, "{x}: {y} vs {want}");
            assert!(y.abs() <= cap);
        }
        let mut inplace = xs.clone();
        softcap_inplace(&mut inplace, cap);
        assert_eq!(
            inplace.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            ys.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn gelu_is_ggmls_table_of_f16_results_with_its_cutoffs_at_ten() {
        // The analytic tanh GELU, for the values ggml's table holds: x rounded to f16, the
        // result rounded to f16 (both within one f16 step of the exact value).
        let exact =
            |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
        let xs: Vec<f32> = (-1200..=1200)
            .map(|i| i as f32 / 100.0)
            .chain([0.0, -0.0, 1e-6, -1e-6])
            .collect();
        let mut ys = vec![0.0; xs.len()];
        gelu(&xs, &mut ys).unwrap();
        for (&x, &y) in xs.iter().zip(&ys) {
            if x <= -10.0 {
                assert_eq!(y, 0.0, "{x}");
            } else if x >= 10.0 {
                assert_eq!(y, x, "{x}");
            } else {
                let xh = f16_to_f32(f32_to_f16(x)) as f64;
                let want = exact(xh);
                assert!(
                    (y as f64 - want).abs() <= want.abs() * 1e-3 + 1e-7,
                    "{x}: {y} vs {want}"
                );
                assert_eq!(f16_to_f32(f32_to_f16(y)), y, "{x}: an f16 value");
            }
        }
        let mut inplace = xs.clone();
        gelu_inplace(&mut inplace);
        assert_eq!(inplace, ys);
    }
    use crate::test_util::XorShift;

    #[test]
    fn fused_swiglu_is_bit_identical_to_silu_then_mul() {
        let mut r = XorShift(41);
        let mut gate = r.vec(1000, 12.0);
        gate.extend([0.0, -0.0, 88.0, -88.0, 100.0, -100.0, f32::MIN_POSITIVE, -1e-30]);
        let up = r.vec(gate.len(), 3.0);
        let mut fused = vec![0.0; gate.len()];
        swiglu(&gate, &up, &mut fused).unwrap();
        let mut unfused = vec![0.0; gate.len()];
        silu(&gate, &mut unfused).unwrap();
        mul_inplace(&mut unfused, &up).unwrap();
        let mut in_place = gate.clone();
        swiglu_inplace(&mut in_place, &up).unwrap();
        for i in 0..gate.len() {
            assert_eq!(fused[i].to_bits(), unfused[i].to_bits(), "gate {}", gate[i]);
            assert_eq!(in_place[i].to_bits(), fused[i].to_bits());
        }
    }

    #[test]
    fn silu_follows_its_definition() {
        let mut r = XorShift(42);
        let x = r.vec(500, 20.0);
        let mut y = vec![0.0; x.len()];
        silu(&x, &mut y).unwrap();
        for (&v, &s) in x.iter().zip(&y) {
            let expected = v as f64 / (1.0 + (-(v as f64)).exp());
            assert!(
                (s as f64 - expected).abs() <= 1e-6 * expected.abs() + 1e-12,
                "silu({v}) = {s}"
            );
        }
        let mut z = x.clone();
        silu_inplace(&mut z);
        assert_eq!(y, z);
        assert_eq!(silu_f32(-100.0), -0.0, "exp overflow gives x / inf, not NaN");
    }

    #[test]
    fn row_broadcasts_apply_the_vector_to_every_row() {
        let a: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let b = [10.0, 20.0, 30.0];
        let mut sum = vec![0.0; 12];
        add_row_broadcast(&a, &b, &mut sum).unwrap();
        let mut prod = vec![0.0; 12];
        mul_row_broadcast(&a, &b, &mut prod).unwrap();
        for i in 0..12 {
            assert_eq!(sum[i], a[i] + b[i % 3]);
            assert_eq!(prod[i], a[i] * b[i % 3]);
        }
        let mut s = a.clone();
        add_row_broadcast_inplace(&mut s, &b).unwrap();
        assert_eq!(s, sum);
        let mut p = a.clone();
        mul_row_broadcast_inplace(&mut p, &b).unwrap();
        assert_eq!(p, prod);

        let mut out = vec![0.0; 12];
        add(&a, &sum, &mut out).unwrap();
        assert_eq!(out[5], 5.0 + 35.0);
        mul(&a, &sum, &mut out).unwrap();
        assert_eq!(out[5], 5.0 * 35.0);
        let mut acc = a.clone();
        add_inplace(&mut acc, &a).unwrap();
        assert_eq!(acc[11], 22.0);
    }

    #[test]
    fn bad_sizes_are_refused_naming_the_kernel_and_the_sizes() {
        let err = add(&[0.0; 4], &[0.0; 3], &mut [0.0; 4]).unwrap_err();
        assert_eq!(err.to_string(), "add: b has length 3, expected 4");
        let err = swiglu(&[0.0; 4], &[0.0; 4], &mut [0.0; 5]).unwrap_err();
        assert_eq!(err.to_string(), "swiglu: out has length 5, expected 4");
        let err = add_row_broadcast(&[0.0; 10], &[0.0; 4], &mut [0.0; 10]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "add_row_broadcast: a has length 10, not a multiple of 4"
        );
        let err = mul_row_broadcast_inplace(&mut [0.0; 3], &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "mul_row_broadcast_inplace: a has length 3, not a multiple of 0"
        );
        assert_eq!(mul_row_broadcast_inplace(&mut [], &[]), Ok(()));
    }
}
