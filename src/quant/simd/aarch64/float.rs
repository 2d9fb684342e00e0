//! Float weight rows (F32, F16, BF16) against f32 activations, in `vec_dot_f32`'s documented
//! order: eight running sums (lane `l` takes the products `i % 8 == l` of the leading multiple of
//! 8, each a separate multiply then add), here two NEON vectors of four; the lanes added in order
//! to 0.0; then the remaining products one by one.

use super::*;
use crate::quant::fp16::{bf16_to_f32, f16_to_f32};

/// Four F16 values (eight bytes at `at`) widened exactly to f32 (`fcvtl`, baseline ARMv8: a NaN
/// is made quiet with its payload kept, as `f16_to_f32` does).
#[inline(always)]
pub(in crate::quant) unsafe fn f16x4(bytes: &[u8], at: usize) -> float32x4_t {
    let half = vld1_u8(bytes[at..at + 8].as_ptr());
    let out: float32x4_t;
    // SAFETY: a register-only conversion every aarch64 CPU has.
    asm!(
        "fcvtl {out:v}.4s, {half:v}.4h",
        out = lateout(vreg) out,
        half = in(vreg) half,
        options(pure, nomem, nostack, preserves_flags),
    );
    out
}

/// Four BF16 values (eight bytes at `at`) widened to f32 (the top halves of their f32s).
#[inline(always)]
unsafe fn bf16x4(bytes: &[u8], at: usize) -> float32x4_t {
    let half = vld1_u16(bytes[at..at + 8].as_ptr().cast());
    vreinterpretq_f32_u32(vshll_n_u16::<16>(half))
}

/// Four F32 values (16 bytes at `at`).
#[inline(always)]
unsafe fn f32x4(bytes: &[u8], at: usize) -> float32x4_t {
    vreinterpretq_f32_u8(vld1q_u8(bytes[at..at + 16].as_ptr()))
}

/// The shared loop: `widen4(bytes, at)` widens four weights from byte `at`, `widen(bytes)` one
/// weight of the tail. Both widen exactly, as the reference does.
#[inline(always)]
unsafe fn lanes_dot<const W: usize>(
    w: &[u8],
    x: &[f32],
    widen4: impl Fn(&[u8], usize) -> float32x4_t,
    widen: impl Fn([u8; W]) -> f32,
) -> f32 {
    let n = (w.len() / W).min(x.len());
    let body = n / 8 * 8;
    let (mut lo, mut hi) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    for i in (0..body).step_by(8) {
        let xs = &x[i..i + 8];
        let (x0, x1) = (vld1q_f32(xs.as_ptr()), vld1q_f32(xs[4..].as_ptr()));
        lo = vaddq_f32(lo, vmulq_f32(widen4(w, W * i), x0));
        hi = vaddq_f32(hi, vmulq_f32(widen4(w, W * (i + 4)), x1));
    }
    let mut lanes = [0.0f32; 8];
    vst1q_f32(lanes.as_mut_ptr(), lo);
    vst1q_f32(lanes[4..].as_mut_ptr(), hi);
    let mut sum = 0.0f32;
    for lane in lanes {
        sum += lane;
    }
    for (wb, &xv) in w[W * body..W * n].chunks_exact(W).zip(&x[body..n]) {
        let mut bytes = [0u8; W];
        bytes.copy_from_slice(wb);
        sum += widen(bytes) * xv;
    }
    sum
}

/// F32 weights (little-endian bytes).
pub(in crate::quant) unsafe fn vec_dot_f32(w: &[u8], x: &[f32]) -> f32 {
    lanes_dot::<4>(w, x, |b, at| f32x4(b, at), f32::from_le_bytes)
}

/// F16 weights.
pub(in crate::quant) unsafe fn vec_dot_f16(w: &[u8], x: &[f32]) -> f32 {
    lanes_dot::<2>(w, x, |b, at| f16x4(b, at), |b| f16_to_f32(u16::from_le_bytes(b)))
}

/// BF16 weights.
pub(in crate::quant) unsafe fn vec_dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    lanes_dot::<2>(w, x, |b, at| bf16x4(b, at), |b| bf16_to_f32(u16::from_le_bytes(b)))
}
