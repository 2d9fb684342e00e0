//! Test support for the block layouts: what a random block of a type looks like when it is to
//! stress a kernel (zero scales, the extreme levels the quantizers never produce, all-equal
//! bytes), and the one float term of a dot product the dequantized values do not show. Every
//! block module implements [`TestBlock`] beside its layout, and each row of the type table
//! carries the type's [`TestHooks`], so that the kernel tests run over the table's rows and a new
//! type is tested by adding its row. Compiled only for tests.

use super::fp16::f32_to_f16;
use crate::test_util::XorShift;
use bytemuck::Pod;

/// What a generated block stresses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    /// Random levels and scales.
    Random,
    /// Scales (and for Q8_K the activation scale) of zero.
    ZeroScale,
    /// Every level at one end of its range, scales at their largest magnitude.
    Extreme,
    /// Every level byte the same random value.
    AllEqual,
}

impl Mode {
    /// The mode of a block's minimum: a zero-scale block keeps a random minimum, which is all
    /// that is left of its values.
    pub(crate) fn for_min(self) -> Mode {
        if self == Mode::ZeroScale {
            Mode::Random
        } else {
            self
        }
    }
}

impl XorShift {
    /// A mode, ordinary blocks half the time.
    pub(crate) fn mode(&mut self) -> Mode {
        match self.below(6) {
            0 => Mode::ZeroScale,
            1 => Mode::Extreme,
            2 => Mode::AllEqual,
            _ => Mode::Random,
        }
    }

    /// An F16 scale of magnitude up to `max_abs` (exactly `max_abs` in extreme mode, 0 in
    /// zero-scale mode).
    pub(crate) fn scale(&mut self, mode: Mode, max_abs: f32) -> u16 {
        match mode {
            Mode::ZeroScale => 0,
            Mode::Extreme => f32_to_f16(if self.below(2) == 0 { max_abs } else { -max_abs }),
            Mode::Random | Mode::AllEqual => f32_to_f16(self.signed_unit() * max_abs),
        }
    }

    /// An f32 scale of magnitude up to `max_abs` (`-max_abs` in extreme mode, 0 in zero-scale
    /// mode).
    pub(crate) fn scale_f32(&mut self, mode: Mode, max_abs: f32) -> f32 {
        match mode {
            Mode::ZeroScale => 0.0,
            Mode::Extreme => -max_abs,
            Mode::Random | Mode::AllEqual => self.signed_unit() * max_abs,
        }
    }

    /// Level bytes: random, all one byte at an end of the unsigned or of the signed range (0x00,
    /// 0xff; 0x7f, 0x80: the activations' 127 and -128), or all one random byte.
    pub(crate) fn levels(&mut self, mode: Mode, bytes: &mut [u8]) {
        match mode {
            Mode::Extreme => bytes.fill([0x00, 0xff, 0x7f, 0x80][self.below(4) as usize]),
            Mode::AllEqual => bytes.fill(self.next() as u8),
            Mode::Random | Mode::ZeroScale => self.fill(bytes),
        }
    }

    /// A float weight: of order 1, an F16 subnormal, of any magnitude from 2^-20 to 2^20, or 0.
    pub(crate) fn float_weight(&mut self, mode: Mode) -> f32 {
        match mode {
            Mode::Random => self.signed_unit(),
            Mode::AllEqual => self.signed_unit() * 6e-5,
            Mode::Extreme => self.signed_unit() * 2f32.powi(self.below(40) as i32 - 20),
            Mode::ZeroScale => 0.0,
        }
    }
}

/// A block layout's test knowledge, implemented in its module. A random block is made of level
/// bytes stressing a [`Mode`] (the float fields' bytes included), on which the block sets its
/// float fields.
pub(crate) trait TestBlock: Pod {
    /// Sets the float fields (scales, minimums) to finite values stressing `mode`, and the fields
    /// derived from the levels (stored sums) to agree with them.
    fn set_floats(&mut self, r: &mut XorShift, mode: Mode);

    /// The minimum `m` a weight block adds as `m * s` with an activation block's stored sum `s`
    /// (Q4_1, Q5_1); 0 for the blocks without one.
    fn stored_sum_factor(&self) -> f32 {
        0.0
    }

    /// The sum `s` an activation block stores beside its values (Q8_1), which the dot products
    /// use in place of the sum of its dequantized values; 0 for the blocks without one.
    fn stored_sum(&self) -> f32 {
        0.0
    }
}

/// A quantized row's test knowledge on bytes, as the type table carries it (the float rows'
/// weights are drawn as values, [`XorShift::float_weight`], and narrowed by the row).
#[derive(Clone, Copy)]
pub(crate) struct TestHooks {
    /// Writes one random block (one value for the float types) stressing the mode.
    pub random: fn(&mut XorShift, Mode, &mut [u8]),
    /// [`TestBlock::stored_sum_factor`] of one block.
    pub stored_sum_factor: fn(&[u8]) -> f32,
    /// [`TestBlock::stored_sum`] of one block.
    pub stored_sum: fn(&[u8]) -> f32,
}

impl TestHooks {
    /// The hooks of the block type `B`.
    pub(crate) const fn block<B: TestBlock>() -> Self {
        TestHooks {
            random: |r, mode, out| {
                let mut b = B::zeroed();
                r.levels(mode, bytemuck::bytes_of_mut(&mut b));
                b.set_floats(r, mode);
                out.copy_from_slice(bytemuck::bytes_of(&b));
            },
            stored_sum_factor: |b| bytemuck::pod_read_unaligned::<B>(b).stored_sum_factor(),
            stored_sum: |b| bytemuck::pod_read_unaligned::<B>(b).stored_sum(),
        }
    }

    /// A row of `n` random blocks of `type_size` bytes, each stressing a mode of its own.
    pub(crate) fn random_row(&self, r: &mut XorShift, n: usize, type_size: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; n * type_size];
        for block in bytes.chunks_exact_mut(type_size) {
            let mode = r.mode();
            (self.random)(r, mode, block);
        }
        bytes
    }
}
