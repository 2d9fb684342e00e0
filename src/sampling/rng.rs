//! The sampler's random number generator: xoshiro256** (Blackman and Vigna) seeded through
//! splitmix64.
//!
//! This module owns the bit-exact generator and nothing else. It must not know what a draw is
//! used for: the chain decides how many outputs it takes (one per draw, one per XTC roll, none
//! for a greedy pick), so that a seed names the same sequence of tokens on every platform.

/// xoshiro256** 1.0 (Blackman and Vigna), the generator behind every draw. Small, fast, and fully
/// specified, so a seed means the same sequence everywhere.
#[derive(Debug, Clone)]
pub(crate) struct Xoshiro256StarStar {
    pub(crate) s: [u64; 4],
}

impl Xoshiro256StarStar {
    /// Expands the seed with splitmix64, as the xoshiro authors recommend; splitmix64 never
    /// yields four zero words, the one state xoshiro cannot leave.
    pub(crate) fn from_seed(seed: u64) -> Self {
        let mut state = seed;
        Xoshiro256StarStar {
            s: [
                splitmix64(&mut state),
                splitmix64(&mut state),
                splitmix64(&mut state),
                splitmix64(&mut state),
            ],
        }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1): the top 53 bits, every value a multiple of 2^-53.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reproduces_the_published_outputs_for_seed_zero() {
        let mut state = 0;
        let got: Vec<u64> = (0..4).map(|_| splitmix64(&mut state)).collect();
        assert_eq!(
            got,
            [
                0xe220a8397b1dcdaf,
                0x6e789e6aa1b965f4,
                0x06c45d188009454f,
                0xf88bb8a8724c81ec
            ]
        );
    }

    #[test]
    fn xoshiro256_star_star_reproduces_the_reference_outputs_from_state_1_2_3_4() {
        let mut rng = Xoshiro256StarStar { s: [1, 2, 3, 4] };
        let got: Vec<u64> = (0..10).map(|_| rng.next_u64()).collect();
        assert_eq!(
            got,
            [
                11520,
                0,
                1509978240,
                1215971899390074240,
                1216172134540287360,
                607988272756665600,
                16172922978634559625,
                8476171486693032832,
                10595114339597558777,
                2904607092377533576,
            ]
        );
    }

    #[test]
    fn unit_draws_stay_in_the_half_open_interval() {
        let mut rng = Xoshiro256StarStar::from_seed(7);
        for _ in 0..10_000 {
            let u = rng.next_f64();
            assert!((0.0..1.0).contains(&u));
        }
        assert_eq!(
            (u64::MAX >> 11) as f64 * (1.0 / (1u64 << 53) as f64),
            1.0 - f64::EPSILON / 2.0
        );
    }
}
