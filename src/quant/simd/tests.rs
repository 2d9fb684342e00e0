//! Every kernel of every instruction set this CPU supports against the scalar references, over
//! the rows of the type table (so a new type is tested by adding its row), compared bit for bit
//! (`to_bits`): the quantized dot products on random rows of 1 to 64 blocks that mix ordinary
//! blocks with zero scales, extreme levels and activations (-128 included) and all-equal values;
//! the float dot products on rows of 0 to 600 values of every magnitude; and each table's
//! quantizers against the reference quantizers.

use super::*;
use crate::quant::testing::Mode;
use crate::quant::traits::{self, TypeTraits};
use crate::quant::GgmlType;
use crate::test_util::XorShift;

/// Row lengths in blocks: 1 to 64, around every multiple of the 8-block chunks.
const BLOCK_COUNTS: &[usize] = &[1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 40, 47, 63, 64];

/// Trials per length; each draws fresh rows.
const TRIALS: usize = 6;

/// The scalar table: the references.
fn scalar() -> &'static [TypeTraits] {
    traits::for_isa(Isa::Scalar).expect("every CPU runs the scalar references")
}

/// The rows of `isa`'s table, each beside its scalar row; none when this CPU does not run `isa`.
fn rows_and_references(isa: Isa) -> Vec<(&'static TypeTraits, &'static TypeTraits)> {
    let Some(rows) = traits::for_isa(isa) else {
        // `MINFER_REQUIRE_ISA=neon,neon-dotprod` (scripts/test-aarch64.sh) turns the skip into a
        // failure, so that a run meant to check a kernel cannot pass without it.
        let required = std::env::var("MINFER_REQUIRE_ISA").unwrap_or_default();
        assert!(
            !required.split(',').any(|name| name.trim() == isa.name()),
            "MINFER_REQUIRE_ISA names {}, which this CPU lacks",
            isa.name()
        );
        eprintln!("this CPU has no {}, skipped", isa.name());
        return Vec::new();
    };
    let pairs: Vec<_> = rows.iter().zip(scalar()).collect();
    assert!(pairs.iter().all(|(row, reference)| row.ty == reference.ty));
    pairs
}

/// Every form of every quantized dot product of `isa` (one weight row with one or two activation
/// rows, four weight rows with one, two with two) against the scalar references.
fn check_block_dots(isa: Isa, seed: u64) {
    let (mut types, mut cases, mut cases_2x2) = (Vec::new(), 0, 0);
    for (row, reference) in rows_and_references(isa) {
        let (Some(dots), Some(expected_dots)) = (row.block_dots(), reference.block_dots()) else {
            continue;
        };
        let act = traits::row_in(scalar(), row.vec_dot_type.unwrap()).unwrap();
        let (w_hooks, a_hooks) = (reference.test.unwrap(), act.test.unwrap());
        types.push(row.ty.to_string());
        let mut r = XorShift(seed ^ (row.ty as u64) << 32);
        for &n in BLOCK_COUNTS {
            for trial in 0..TRIALS {
                let w = w_hooks.random_row(&mut r, n, row.type_size);
                let a = a_hooks.random_row(&mut r, n, act.type_size);
                let b = a_hooks.random_row(&mut r, n, act.type_size);
                let expected = [expected_dots.dot(&w, &a), expected_dots.dot(&w, &b)];
                let got = dots.dot(&w, &a);
                let got_x2 = dots.dot_x2(&w, &a, &b);
                let context = || format!("{} on {}: {n} blocks, trial {trial}", row.ty, isa.name());
                assert_eq!(
                    got.to_bits(),
                    expected[0].to_bits(),
                    "{}: {got} vs {}",
                    context(),
                    expected[0]
                );
                for (i, (g, e)) in got_x2.iter().zip(expected).enumerate() {
                    assert_eq!(g.to_bits(), e.to_bits(), "{}, two rows, row {i}: {g} vs {e}", context());
                }
                // Four weight rows (`w` among them) against one activation row.
                let ws: [Vec<u8>; traits::DOT_ROWS] = std::array::from_fn(|k| {
                    if k == 1 {
                        w.clone()
                    } else {
                        w_hooks.random_row(&mut r, n, row.type_size)
                    }
                });
                cases += 1;
                let got_rows = dots.dot_rows(std::array::from_fn(|k| &ws[k][..]), &a);
                for (k, (g, w)) in got_rows.iter().zip(&ws).enumerate() {
                    let e = expected_dots.dot(w, &a);
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "{}, four weight rows, row {k}: {g} vs {e}",
                        context()
                    );
                }
                // Two weight rows (`w` and another) against two activation rows, where the table
                // has a kernel for it (`i8mm`'s).
                if dots.has_2x2() {
                    cases_2x2 += 1;
                    let got = dots.dot_2x2([&w, &ws[0]], [&a, &b]);
                    let expected = [expected, [expected_dots.dot(&ws[0], &a), expected_dots.dot(&ws[0], &b)]];
                    for (r, (g, e)) in got.iter().flatten().zip(expected.iter().flatten()).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{}, two by two, row {} token {}: {g} vs {e}",
                            context(),
                            r / 2,
                            r % 2
                        );
                    }
                }
            }
        }
    }
    if !types.is_empty() {
        let tiles = if cases_2x2 > 0 {
            format!(" ({cases_2x2} of them also two weight rows by two tokens)")
        } else {
            String::new()
        };
        eprintln!(
            "{} dot products checked bit for bit against the scalar references: {} cases{tiles} of {}",
            isa.name(),
            cases,
            types.join(" ")
        );
    }
}

/// Every float dot product of `isa` against the scalar references on rows of 0 to 600 values:
/// random values, zeros, subnormal F16 weights, and large and tiny magnitudes that round
/// differently in every lane.
fn check_float_dots(isa: Isa, seed: u64) {
    for (row, reference) in rows_and_references(isa) {
        let (Some(dot), Some(expected_dot)) = (row.float_dot(), reference.float_dot()) else {
            continue;
        };
        let mut r = XorShift(seed ^ (row.ty as u64) << 32);
        for n in (0..=40).chain([63, 64, 65, 100, 255, 256, 257, 511, 600]) {
            for trial in 0..TRIALS {
                let mode = r.mode();
                let wf: Vec<f32> = (0..n).map(|_| r.float_weight(mode)).collect();
                let x: Vec<f32> = (0..n)
                    .map(|_| r.signed_unit() * 2f32.powi(r.below(20) as i32 - 10))
                    .collect();
                let mut w = vec![0u8; n * row.type_size];
                reference.quantize_ref(&wf, &mut w);
                let expected = expected_dot.dot(&w, &x);
                let got = dot.dot(&w, &x);
                assert_eq!(
                    got.to_bits(),
                    expected.to_bits(),
                    "{} on {}: {n} values ({mode:?}), trial {trial}: {got} vs the reference's {expected}",
                    row.ty,
                    isa.name()
                );
            }
        }
    }
}

/// Every quantizer of `isa`'s table (compiled for it) gives the reference quantizer's bytes.
fn check_quantizers(isa: Isa, seed: u64) {
    for (row, reference) in rows_and_references(isa) {
        if !row.can_quantize() {
            continue;
        }
        let mut r = XorShift(seed ^ (row.ty as u64) << 32);
        for blocks in [1, 2, 5] {
            for trial in 0..TRIALS {
                let n = blocks * row.block_size;
                let mode = r.mode();
                let scale = 2f32.powi(r.below(40) as i32 - 20);
                let x: Vec<f32> = (0..n)
                    .map(|_| match mode {
                        Mode::ZeroScale => 0.0,
                        Mode::AllEqual => scale,
                        _ => r.signed_unit() * scale,
                    })
                    .collect();
                let (mut got, mut expected) = (vec![0u8; blocks * row.type_size], vec![0u8; blocks * row.type_size]);
                row.quantize(&x, &mut got);
                reference.quantize_ref(&x, &mut expected);
                assert_eq!(
                    got,
                    expected,
                    "{} on {}: {blocks} blocks, trial {trial}",
                    row.ty,
                    isa.name()
                );
            }
        }
    }
}

/// One test per instruction set and kind of kernel.
macro_rules! isa_tests {
    ($($name:ident: $check:ident($isa:expr, $seed:literal);)*) => {$(
        #[test]
        fn $name() {
            $check($isa, $seed);
        }
    )*};
}

isa_tests! {
    the_scalar_two_row_dot_products_are_the_one_row_form_twice: check_block_dots(Isa::Scalar, 1);
    the_avx2_dot_products_match_the_scalar_references: check_block_dots(Isa::Avx2, 2);
    the_avx512_dot_products_match_the_scalar_references: check_block_dots(Isa::Avx512, 3);
    the_avx2_float_dot_products_match_the_scalar_references: check_float_dots(Isa::Avx2, 32);
    the_avx512_float_dot_products_match_the_scalar_references: check_float_dots(Isa::Avx512, 33);
    the_neon_dot_products_match_the_scalar_references: check_block_dots(Isa::Neon, 4);
    the_neon_dotprod_dot_products_match_the_scalar_references: check_block_dots(Isa::Dotprod, 5);
    the_neon_float_dot_products_match_the_scalar_references: check_float_dots(Isa::Neon, 34);
    the_neon_dotprod_float_dot_products_match_the_scalar_references: check_float_dots(Isa::Dotprod, 35);
    the_neon_i8mm_dot_products_match_the_scalar_references: check_block_dots(Isa::I8mm, 6);
    the_neon_i8mm_float_dot_products_match_the_scalar_references: check_float_dots(Isa::I8mm, 36);
}

#[test]
fn every_tables_quantizers_give_the_reference_bytes() {
    for (isa, seed) in Isa::ALL.into_iter().zip(41..) {
        check_quantizers(isa, seed);
    }
}

#[test]
fn the_environment_switches_force_the_narrower_paths() {
    for no_matrix in [false, true] {
        assert_eq!(Isa::best_supported(no_matrix, false, true), Isa::Scalar);
        assert_eq!(Isa::best_supported(no_matrix, true, true), Isa::Scalar);
        let no_wide = Isa::best_supported(no_matrix, true, false);
        assert!(!matches!(no_wide, Isa::Avx512 | Isa::Dotprod | Isa::I8mm));
        assert_eq!(no_wide == Isa::Avx2, Isa::Avx2.is_supported());
        assert_eq!(no_wide == Isa::Neon, Isa::Neon.is_supported());
    }
    // `MINFER_NO_I8MM` stops at the SDOT kernels and changes nothing on x86.
    let no_matrix = Isa::best_supported(true, false, false);
    assert_ne!(no_matrix, Isa::I8mm);
    assert_eq!(no_matrix == Isa::Dotprod, Isa::Dotprod.is_supported());
    assert_eq!(no_matrix == Isa::Avx512, Isa::Avx512.is_supported());
    let best = Isa::best_supported(false, false, false);
    assert!(best.is_supported());
    assert!(Isa::ALL.iter().all(|&isa| isa <= best || !isa.is_supported()));
}

#[test]
fn the_chosen_table_runs_on_this_cpu_and_names_its_instruction_set() {
    assert!(isa().is_supported());
    assert_eq!(simd_level(), isa().name());
    assert!(["scalar", "avx2", "avx512-vnni", "neon", "neon-dotprod", "neon-i8mm"].contains(&simd_level()));
    // scripts/test-aarch64.sh names the instruction set each emulated CPU must get.
    if let Ok(expected) = std::env::var("MINFER_EXPECT_ISA") {
        assert_eq!(simd_level(), expected, "the instruction set chosen on this CPU");
    }
    for isa in Isa::ALL {
        assert_eq!(traits::for_isa(isa).is_some(), isa.is_supported(), "{isa:?}");
        // Only the `i8mm` table has two-by-two kernels, one for every quantized weight type with
        // NEON kernels (the types whose kernels are x86-64's alone run their scalar references
        // on aarch64).
        for row in traits::for_isa(isa).unwrap_or_default() {
            if let Some(dots) = row.block_dots() {
                use crate::quant::GgmlType::*;
                let neon = matches!(row.ty, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | Q6_K);
                assert_eq!(dots.has_2x2(), isa == Isa::I8mm && neon, "{} on {}", row.ty, isa.name());
            }
        }
    }
}

#[test]
#[should_panic(expected = "block counts differ")]
fn a_kernel_refuses_rows_of_different_lengths() {
    let dots = traits::block_dots(GgmlType::Q8_0).unwrap();
    dots.dot(&[0; 2 * 34], &[0; 3 * 34]);
}
