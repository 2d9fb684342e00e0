//! Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit
//! min, themselves scaled by the F16 `d` and `dmin` (`block_q4_K`).
//!
//! ```text
//! byte 0..2     d          f16 super-scale of the sub-block scales
//! byte 2..4     dmin       f16 super-scale of the sub-block mins
//! byte 4..16    scales[12] 8 × (6-bit scale, 6-bit min), see get_scale_min_k4
//! byte 16..144  qs[128]    4 chunks of 64 weights: qs[32c + l] low nibble = weight 64c + l,
//!                          high nibble = weight 64c + 32 + l
//! weight = d * scale_j * q - dmin * min_j
//! ```

use super::k_quants::{
    add_scale_min_superblock, dequantize_scale_min_superblock, quantize_scale_min_superblock,
    quantize_scale_min_superblock_imatrix, Qkx2Search, QK_K,
};
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_q4_K`: QK_K weights in 144 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale of the quantized scales (f16 bits).
    pub d: u16,
    /// Super-block scale of the quantized mins (f16 bits).
    pub dmin: u16,
    /// Eight 6-bit sub-block scales and eight 6-bit mins, packed (see `get_scale_min_k4`).
    pub scales: [u8; 12],
    /// 4-bit values: `qs[32c + l]` holds weight `64c + l` (low nibble) and `64c + 32 + l` (high).
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// `quantize_row_q4_K_ref`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ4K]) {
    let search = Qkx2Search {
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        store(yb, quantize_scale_min_superblock(xb, 15, &search));
    }
}

/// A super-block's scales, minimums and levels into its block.
fn store(yb: &mut BlockQ4K, (d, dmin, scales, levels): (u16, u16, [u8; 12], [u8; QK_K])) {
    yb.d = d;
    yb.dmin = dmin;
    yb.scales = scales;
    for (chunk, q) in levels.chunks_exact(64).zip(yb.qs.chunks_exact_mut(32)) {
        for l in 0..32 {
            q[l] = chunk[l] | (chunk[l + 32] << 4);
        }
    }
}

/// `quantize_row_q4_K_impl`: one row with its importance matrix `qw` (one weight per column).
pub fn quantize_row_imatrix(x: &[f32], qw: &[f32], y: &mut [BlockQ4K]) {
    for ((xb, qw), yb) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(y.iter_mut()) {
        store(yb, quantize_scale_min_superblock_imatrix(xb, qw, 15, false));
    }
}

/// `dequantize_row_q4_K`: every super-block of `x` into QK_K f32 values of `y`.
pub fn dequantize_row(x: &[BlockQ4K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        dequantize_scale_min_superblock(&levels(xb), &xb.scales, xb.d, xb.dmin, yb);
    }
}

/// The 256 levels (0..=15) of a super-block, in weight order.
pub fn levels(b: &BlockQ4K) -> [u8; QK_K] {
    let mut out = [0u8; QK_K];
    for (q, chunk) in b.qs.chunks_exact(32).zip(out.chunks_exact_mut(64)) {
        for (l, &byte) in q.iter().enumerate() {
            chunk[l] = byte & 0x0f;
            chunk[l + 32] = byte >> 4;
        }
    }
    out
}

/// The dot product of Q4_K weights with Q8_K activations: [`add_scale_min_superblock`] over
/// the super-blocks, in order.
pub fn vec_dot_ref(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    x.iter().zip(y).fold(0.0, |sumf, (xb, yb)| {
        add_scale_min_superblock(sumf, &levels(xb), &xb.scales, xb.d, xb.dmin, yb)
    })
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockQ4K {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.02);
        self.dmin = r.scale(mode.for_min(), 0.02);
    }
}
