//! What the codebook i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) share:
//! ggml's sign table and the reading of a grid point with its signs into signed levels.
//!
//! This module owns no block layout (each type's module reads its own) and no arithmetic beyond
//! the exact integer sums of eight levels.

use super::k_quants::QK_K;

/// ggml's `ksigns_iq2xs`: seven stored sign bits and an eighth that makes the count of set bits
/// even (the quantizers flip the least important weight to get there).
pub const KSIGNS: [u8; 128] = {
    let mut table = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        table[i] = i as u8 | (((i as u8).count_ones() & 1) << 7) as u8;
        i += 1;
    }
    table
};

/// The eight values of a grid point (one byte each from the low byte up), negated where `signs`
/// has a bit set (bit `j`: value `j`), as ggml's `grid[j] * (signs & kmask_iq2xs[j] ? -1 : 1)`.
#[inline]
pub fn signed8(point: u64, signs: u8) -> [i8; 8] {
    std::array::from_fn(|j| {
        let v = (point >> (8 * j)) as u8 as i8;
        if (signs >> j) & 1 == 1 {
            -v
        } else {
            v
        }
    })
}

/// Two grid points of four values (IQ3's) as eight, signed as by [`signed8`].
#[inline]
pub fn signed4x2(first: u32, second: u32, signs: u8) -> [i8; 8] {
    signed8(first as u64 | (second as u64) << 32, signs)
}

/// The 4-bit block scales `s` packed two per byte, low nibble first (IQ2_XS's, IQ2_S's and
/// IQ3_S's).
#[inline]
pub fn nibbles<const N: usize>(bytes: &[u8]) -> [u8; N] {
    std::array::from_fn(|i| (bytes[i / 2] >> (4 * (i % 2))) & 0xf)
}

/// The exact integer dot product of eight levels with eight activations.
#[inline]
pub fn dot8(levels: &[i8], q8: &[i8]) -> i32 {
    levels.iter().zip(q8).map(|(&l, &q)| l as i32 * q as i32).sum()
}

/// The exact integer sum of a super-block's levels times activations, each group of
/// `QK_K / scales.len()` weights weighted by its odd scale `2s + 1` (ggml's `bsum` of the IQ2 and
/// IQ3 dot products; integer, so the order of the sums is immaterial).
#[inline]
pub fn odd_scaled_sum(levels: &[i8; QK_K], q8: &[i8; QK_K], scales: &[u8]) -> i32 {
    let group = QK_K / scales.len();
    levels
        .chunks_exact(group)
        .zip(q8.chunks_exact(group))
        .zip(scales)
        .map(|((l, q), &s)| {
            (2 * s as i32 + 1)
                * l.chunks_exact(8)
                    .zip(q.chunks_exact(8))
                    .map(|(l, q)| dot8(l, q))
                    .sum::<i32>()
        })
        .sum()
}

/// A super-block's values: each group of `QK_K / scales.len()` levels times `db(s)` of its scale
/// (ggml's `db * grid[j] * sign`, where the sign's product is exact).
#[inline]
pub fn dequantize_scaled(levels: &[i8; QK_K], scales: &[u8], y: &mut [f32], db: impl Fn(u8) -> f32) {
    let group = QK_K / scales.len();
    for ((out, l), &s) in y.chunks_exact_mut(group).zip(levels.chunks_exact(group)).zip(scales) {
        let db = db(s);
        for (o, &v) in out.iter_mut().zip(l) {
            *o = db * v as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sign_table_is_ggmls_ksigns_iq2xs() {
        // The first and last rows of ggml's table, as printed in ggml-common.h.
        assert_eq!(KSIGNS[..8], [0, 129, 130, 3, 132, 5, 6, 135]);
        assert_eq!(KSIGNS[120..], [120, 249, 250, 123, 252, 125, 126, 255]);
        assert!(KSIGNS.iter().all(|s| s.count_ones() % 2 == 0));
    }

    #[test]
    fn signs_negate_the_values_of_their_bits() {
        let point = 0x0102_0304_0506_0708u64;
        assert_eq!(signed8(point, 0b1000_0001), [-8, 7, 6, 5, 4, 3, 2, -1]);
        assert_eq!(
            signed4x2(0x0403_0201, 0x0807_0605, 0b0001_0010),
            [1, -2, 3, 4, -5, 6, 7, 8]
        );
    }
}
