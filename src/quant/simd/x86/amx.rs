//! AMX tile products for the prompt's matrix products: the run-time check that the CPU and the
//! OS allow them, and the one tile operation the panel kernels need.
//!
//! A tile product here is `TDPBSUD` on a zeroed accumulator: 16 token rows of signed activation
//! bytes (`K` = 32 or 16 of them per row, read in place with the token rows' stride) against
//! the matching `K / 4` rows of a panel's unsigned weight levels (the panels of `super::gemm`
//! and `super::gemm_k` already hold them as `TDPBSUD` wants its second operand: four levels of
//! each of 16 weight rows side by side, 64 bytes per group of four values), giving each token's
//! exact integer sums for 16 weight rows in one row of 16 `i32`. The kernels then scale those
//! sums with AVX-512 exactly as the VNNI kernels scale theirs, so the two paths give the same
//! bits.
//!
//! Linux hands a process the tile state only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM)`):
//! [`hardware_available`] asks once, after checking CPUID and that the OS saves the state
//! (XCR0). [`EmulatedTiles`] computes the same products with scalar code, so that the kernels'
//! layout and scaling are tested on every CPU; where AMX is present the tests also hold the
//! hardware to the emulation.
//!
//! This file must not decide when a product uses tiles (`crate::quant::gemm` does) and knows
//! no weight type.

use std::arch::asm;
use std::sync::OnceLock;

/// Token rows (and output rows) of a tile product, and the weight rows of a panel.
pub(crate) const ROWS: usize = 16;

/// What a tile product writes: `out[t * ROWS + r]` for token `t` and weight row `r`.
pub(crate) type TileSums = [i32; ROWS * ROWS];

/// A unit that runs tile products.
pub(crate) trait TileUnit {
    /// `out[t * 16 + r] = Σ_{k < K} a[t * a_stride + k] * b[(k / 4) * 64 + 4 * r + k % 4]`, the
    /// `a` bytes signed and the `b` bytes unsigned, for `K` = `k` (32 or 16).
    ///
    /// # Safety
    /// `a` is readable for `15 * a_stride + k` bytes and `b` for `k * 16` bytes.
    unsafe fn product(&mut self, k: usize, a: *const u8, a_stride: usize, b: *const u8, out: &mut TileSums);
}

/// The CPU's tiles: configured for the two product shapes when made, released when dropped.
/// Only one may be alive per thread at a time (the configuration is the thread's).
pub(crate) struct HardwareTiles {
    _not_send: std::marker::PhantomData<*const ()>,
}

/// The tile configuration (palette 1): tiles 0-2 for products of 32 values per token (the
/// tokens 16 × 32 bytes, the levels 8 × 64, the sums 16 × 64), tiles 3 and 4 for products of 16
/// (16 × 16 and 4 × 64), sums in tile 2 as well.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    const fn new() -> TileConfig {
        // (rows, bytes per row) of tiles 0..5.
        let shapes: [(u8, u16); 5] = [(16, 32), (8, 64), (16, 64), (16, 16), (4, 64)];
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        let mut i = 0;
        while i < shapes.len() {
            let (rows, colsb) = shapes[i];
            bytes[16 + 2 * i] = colsb as u8;
            bytes[16 + 2 * i + 1] = (colsb >> 8) as u8;
            bytes[48 + i] = rows;
            i += 1;
        }
        TileConfig(bytes)
    }
}

static CONFIG: TileConfig = TileConfig::new();

impl HardwareTiles {
    /// Loads the configuration.
    ///
    /// # Safety
    /// [`hardware_available`] returned `true`; no other `HardwareTiles` is alive on this thread.
    pub(crate) unsafe fn new() -> HardwareTiles {
        asm!("ldtilecfg [{cfg}]", cfg = in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
        HardwareTiles {
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for HardwareTiles {
    fn drop(&mut self) {
        // SAFETY: made by `new`, so the CPU has AMX and the tile state is this thread's.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

impl TileUnit for HardwareTiles {
    #[inline]
    unsafe fn product(&mut self, k: usize, a: *const u8, a_stride: usize, b: *const u8, out: &mut TileSums) {
        // The levels' rows and the sums' rows are both 64 bytes (16 words).
        let out_stride = ROWS * 4;
        if k == 32 {
            asm!(
                "tileloadd tmm0, [{a} + {a_stride}*1]",
                "tileloadd tmm1, [{b} + {b_stride}*1]",
                "tilezero tmm2",
                "tdpbsud tmm2, tmm0, tmm1",
                "tilestored [{out} + {out_stride}*1], tmm2",
                a = in(reg) a,
                a_stride = in(reg) a_stride,
                b = in(reg) b,
                b_stride = in(reg) out_stride,
                out = in(reg) out.as_mut_ptr(),
                out_stride = in(reg) out_stride,
                options(nostack),
            );
        } else {
            debug_assert_eq!(k, 16);
            asm!(
                "tileloadd tmm3, [{a} + {a_stride}*1]",
                "tileloadd tmm4, [{b} + {b_stride}*1]",
                "tilezero tmm2",
                "tdpbsud tmm2, tmm3, tmm4",
                "tilestored [{out} + {out_stride}*1], tmm2",
                a = in(reg) a,
                a_stride = in(reg) a_stride,
                b = in(reg) b,
                b_stride = in(reg) out_stride,
                out = in(reg) out.as_mut_ptr(),
                out_stride = in(reg) out_stride,
                options(nostack),
            );
        }
    }
}

/// The tile unit a product runs on: the CPU's, or in tests their emulation.
pub(crate) enum Tiles {
    Hardware(HardwareTiles),
    #[cfg(test)]
    Emulated(EmulatedTiles),
}

impl TileUnit for Tiles {
    #[inline]
    unsafe fn product(&mut self, k: usize, a: *const u8, a_stride: usize, b: *const u8, out: &mut TileSums) {
        match self {
            Tiles::Hardware(tiles) => tiles.product(k, a, a_stride, b, out),
            #[cfg(test)]
            Tiles::Emulated(tiles) => tiles.product(k, a, a_stride, b, out),
        }
    }
}

/// Tile products in scalar code, as the instruction set reference defines `TDPBSUD`.
#[cfg(test)]
pub(crate) struct EmulatedTiles;

#[cfg(test)]
impl TileUnit for EmulatedTiles {
    unsafe fn product(&mut self, k: usize, a: *const u8, a_stride: usize, b: *const u8, out: &mut TileSums) {
        assert!(k == 32 || k == 16, "tile products take 32 or 16 values, not {k}");
        let a = std::slice::from_raw_parts(a, (ROWS - 1) * a_stride + k);
        let b = std::slice::from_raw_parts(b, k * ROWS);
        for t in 0..ROWS {
            for r in 0..ROWS {
                let mut sum = 0i32;
                for kk in 0..k {
                    let product = (a[t * a_stride + kk] as i8 as i32) * (b[(kk / 4) * 64 + 4 * r + kk % 4] as i32);
                    sum = sum.wrapping_add(product);
                }
                out[t * ROWS + r] = sum;
            }
        }
    }
}

/// Whether this CPU has AMX-TILE and AMX-INT8, the OS saves the tile state, and (on Linux) the
/// process was granted it; checked, and asked, once.
pub(crate) fn hardware_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(detect)
}

fn detect() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // SAFETY: CPUID exists on every x86-64 CPU (the function is safe from Rust 1.94 on; the
    // crate supports 1.89).
    #[allow(unused_unsafe)]
    let (leaf7, leaf1) = unsafe { (__cpuid_count(7, 0), __cpuid_count(1, 0)) };
    let (tile, int8) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 25 & 1 == 1);
    let osxsave = leaf1.ecx >> 27 & 1 == 1;
    if !(tile && int8 && osxsave) {
        return false;
    }
    // XTILECFG and XTILEDATA (bits 17 and 18 of XCR0): the OS saves the tiles on a switch.
    // SAFETY: OSXSAVE is set, so XGETBV is enabled.
    let xcr0 = unsafe { xgetbv0() };
    if xcr0 & (3 << 17) != 3 << 17 {
        return false;
    }
    request_tile_data()
}

/// XCR0.
///
/// # Safety
/// CPUID reports OSXSAVE.
#[target_feature(enable = "xsave")]
unsafe fn xgetbv0() -> u64 {
    std::arch::x86_64::_xgetbv(0)
}

/// Asks Linux for the tile data state (`ARCH_REQ_XCOMP_PERM`, `XFEATURE_XTILEDATA`): without it
/// the first tile instruction faults.
#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a system call with integer arguments that changes only this process's permissions.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

/// Other systems: not asked, so not used.
#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::XorShift;

    fn random_bytes(r: &mut XorShift, n: usize) -> Vec<u8> {
        (0..n).map(|_| r.next() as u8).collect()
    }

    #[test]
    fn the_tile_configuration_has_palette_1_and_the_five_shapes() {
        let c = &CONFIG.0;
        assert_eq!(c[0], 1);
        let colsb = |i: usize| u16::from_le_bytes([c[16 + 2 * i], c[17 + 2 * i]]);
        let shapes: Vec<(u8, u16)> = (0..8).map(|i| (c[48 + i], colsb(i))).collect();
        assert_eq!(&shapes[..5], &[(16, 32), (8, 64), (16, 64), (16, 16), (4, 64)]);
        assert!(shapes[5..].iter().all(|&s| s == (0, 0)));
        // Start row and the reserved bytes are zero (the CPU faults on a reserved bit set).
        assert!(c[1..16].iter().chain(&c[32..48]).chain(&c[56..]).all(|&b| b == 0));
        // TDPBSUD's rule: A's bytes per row / 4 = B's rows, A's rows = C's rows, B's bytes = C's.
        for (a, b) in [(0, 1), (3, 4)] {
            assert_eq!(shapes[a].1 as usize / 4, shapes[b].0 as usize);
            assert_eq!((shapes[a].0, shapes[b].1), shapes[2]);
        }
    }

    #[test]
    fn the_emulated_product_sums_signed_tokens_times_unsigned_levels_per_row() {
        let mut r = XorShift(0x2545_f491_4f6c_dd1d);
        for k in [32, 16] {
            let stride = 50;
            let a = random_bytes(&mut r, 15 * stride + k);
            let b = random_bytes(&mut r, k * 16);
            let mut out = [0; 256];
            unsafe { EmulatedTiles.product(k, a.as_ptr(), stride, b.as_ptr(), &mut out) };
            // Row r's levels are the bytes of its words (4 values per 64-byte row of `b`).
            for t in 0..16 {
                for row in 0..16 {
                    let levels = (0..k).map(|i| b[i / 4 * 64 + row * 4 + i % 4] as i32);
                    let tokens = a[t * stride..t * stride + k].iter().map(|&q| q as i8 as i32);
                    assert_eq!(out[t * 16 + row], levels.zip(tokens).map(|(l, q)| l * q).sum::<i32>());
                }
            }
        }
        // The extremes: 255 × -128 over 32 values.
        let (a, b) = (vec![0x80u8; 15 * 32 + 32], vec![0xffu8; 512]);
        let mut out = [0; 256];
        unsafe { EmulatedTiles.product(32, a.as_ptr(), 32, b.as_ptr(), &mut out) };
        assert!(out.iter().all(|&s| s == 32 * 255 * -128));
    }

    #[test]
    fn the_hardware_tile_product_equals_the_emulated_one_where_the_cpu_has_amx() {
        if !hardware_available() {
            // A check meant for an AMX machine must not pass by skipping (the GPU machine's
            // check script sets this).
            let required = std::env::var_os("MINFER_REQUIRE_AMX").is_some_and(|v| !v.is_empty() && v != "0");
            assert!(
                !required,
                "MINFER_REQUIRE_AMX is set, but this CPU or OS gives no AMX tiles"
            );
            eprintln!("amx: not available on this CPU or OS; the emulated tiles stand in");
            return;
        }
        let mut r = XorShift(0x9e37_79b9_7f4a_7c15);
        // SAFETY: AMX is available, and this is the thread's only set of tiles.
        let mut tiles = unsafe { HardwareTiles::new() };
        for k in [32, 16, 32] {
            for stride in [k, 34, 292] {
                let a = random_bytes(&mut r, 15 * stride + k);
                let b = random_bytes(&mut r, k * 16);
                let (mut hw, mut emulated) = ([0; 256], [0; 256]);
                unsafe {
                    tiles.product(k, a.as_ptr(), stride, b.as_ptr(), &mut hw);
                    EmulatedTiles.product(k, a.as_ptr(), stride, b.as_ptr(), &mut emulated);
                }
                assert_eq!(hw, emulated, "k={k} stride={stride}");
            }
        }
    }
}
