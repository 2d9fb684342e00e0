//! Q5_K: like Q4_K with a fifth bit per weight (`block_q5_K`).
//!
//! ```text
//! byte 0..2     d          f16 super-scale of the sub-block scales
//! byte 2..4     dmin       f16 super-scale of the sub-block mins
//! byte 4..16    scales[12] 8 × (6-bit scale, 6-bit min), see get_scale_min_k4
//! byte 16..48   qh[32]     bit 2c of qh[l] = bit 4 of weight 64c + l,
//!                          bit 2c+1 = bit 4 of weight 64c + 32 + l
//! byte 48..176  qs[128]    low 4 bits, laid out as in Q4_K
//! weight = d * scale_j * q - dmin * min_j
//! ```

use super::k_quants::{
    add_scale_min_superblock, dequantize_scale_min_superblock, quantize_scale_min_superblock,
    quantize_scale_min_superblock_imatrix, Qkx2Search, QK_K,
};
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_q5_K`: QK_K weights in 176 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale of the quantized scales (f16 bits).
    pub d: u16,
    /// Super-block scale of the quantized mins (f16 bits).
    pub dmin: u16,
    /// Eight 6-bit sub-block scales and eight 6-bit mins, packed as in Q4_K.
    pub scales: [u8; 12],
    /// Fifth bits: bit `2c` of `qh[l]` is bit 4 of weight `64c + l`, bit `2c + 1` of weight `64c + 32 + l`.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits, laid out as Q4_K's `qs`.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

/// `quantize_row_q5_K_ref`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ5K]) {
    let search = Qkx2Search {
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        store(yb, quantize_scale_min_superblock(xb, 31, &search));
    }
}

/// A super-block's scales, minimums and levels into its block.
fn store(yb: &mut BlockQ5K, (d, dmin, scales, levels): (u16, u16, [u8; 12], [u8; QK_K])) {
    yb.d = d;
    yb.dmin = dmin;
    yb.scales = scales;
    yb.qh = [0; QK_K / 8];
    let (mut m1, mut m2) = (1u8, 2u8);
    for (chunk, ql) in levels.chunks_exact(64).zip(yb.qs.chunks_exact_mut(32)) {
        for j in 0..32 {
            let mut l1 = chunk[j];
            if l1 > 15 {
                l1 -= 16;
                yb.qh[j] |= m1;
            }
            let mut l2 = chunk[j + 32];
            if l2 > 15 {
                l2 -= 16;
                yb.qh[j] |= m2;
            }
            ql[j] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
}

/// `quantize_row_q5_K_impl`: one row with its importance matrix `qw` (one weight per column).
pub fn quantize_row_imatrix(x: &[f32], qw: &[f32], y: &mut [BlockQ5K]) {
    for ((xb, qw), yb) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(y.iter_mut()) {
        store(yb, quantize_scale_min_superblock_imatrix(xb, qw, 31, true));
    }
}

/// `dequantize_row_q5_K`: every super-block of `x` into QK_K f32 values of `y`.
pub fn dequantize_row(x: &[BlockQ5K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        dequantize_scale_min_superblock(&levels(xb), &xb.scales, xb.d, xb.dmin, yb);
    }
}

/// The 256 levels (0..=31) of a super-block, in weight order: Q4_K's nibbles with the fifth
/// bits of `qh` on top.
pub fn levels(b: &BlockQ5K) -> [u8; QK_K] {
    let mut out = [0u8; QK_K];
    for (c, (q, chunk)) in b.qs.chunks_exact(32).zip(out.chunks_exact_mut(64)).enumerate() {
        for (l, (&byte, &h)) in q.iter().zip(&b.qh).enumerate() {
            chunk[l] = (byte & 0x0f) | ((h >> (2 * c)) & 1) << 4;
            chunk[l + 32] = (byte >> 4) | ((h >> (2 * c + 1)) & 1) << 4;
        }
    }
    out
}

/// The dot product of Q5_K weights with Q8_K activations: as Q4_K's, on five-bit levels.
pub fn vec_dot_ref(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    x.iter().zip(y).fold(0.0, |sumf, (xb, yb)| {
        add_scale_min_superblock(sumf, &levels(xb), &xb.scales, xb.d, xb.dmin, yb)
    })
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockQ5K {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.01);
        self.dmin = r.scale(mode.for_min(), 0.02);
    }
}
