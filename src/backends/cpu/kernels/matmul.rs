//! Matrix multiplication of a weight (any dot-capable ggml type) by token-major f32 activations,
//! as ggml's `mul_mat`: each activation row is quantized once to the weight type's
//! `vec_dot_type`, then every output is one block dot product of `crate::quant`.
//!
//! This file owns the loop over rows and tokens and the activation quantization; the arithmetic
//! of a dot product belongs to `crate::quant` and must not be re-implemented here. Like ggml's
//! `ggml_compute_forward_mul_mat`, it reads the weight type's row of the type table
//! (`crate::quant::traits`: its dot products for the instruction set chosen at start-up, and
//! its panel kernel) and never switches on the type. The kernels are bit-identical to the scalar
//! references whatever the instruction set. Splitting the rows across threads is the caller's
//! business: [`matmul_rows`] computes any subset of output rows with bit-identical results,
//! because each output is a single, complete dot product.

use super::{check_len, check_nonzero, row_bytes, size, KernelError};
use crate::quant::gemm::{self, PanelKernel};
use crate::quant::repack::Repacked;
use crate::quant::{self, traits, GgmlType, QuantError};
use std::ops::Range;

/// One batch of activation rows (`n_tokens` rows of `n_in` values) in the form the weight
/// type's dot product consumes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activations<'a> {
    /// Plain f32 rows, for F32, F16 and BF16 weights.
    F32(&'a [f32]),
    /// Rows quantized to the weight type's `vec_dot_type`, `row_size(n_in)` bytes each, and
    /// the per-block terms of the matrix-matrix kernel when it will run ([`gemm`]).
    Quantized {
        /// The activation type: the weight type's `vec_dot_type` (Q8_0, Q8_1 or Q8_K).
        ty: GgmlType,
        /// `n_tokens` rows of `row_size(n_in)` bytes each.
        data: &'a [u8],
        /// Per-block scales and words for the matrix-matrix kernel; `None` when the dot-product path runs.
        terms: Option<gemm::ActivationTerms<'a>>,
    },
}

impl Activations<'_> {
    fn ty(&self) -> Option<GgmlType> {
        match self {
            Activations::F32(_) => None,
            Activations::Quantized { ty, .. } => Some(*ty),
        }
    }
}

/// Quantized activation rows start at this alignment inside the scratch buffer, which covers
/// every activation block type, so the dot products view them in place instead of copying.
const SCRATCH_ALIGN: usize = 16;

/// Prepare `x` (`[n_in, n_tokens]`) for a matmul with `wtype` weights: quantize each row once into
/// `scratch` with the reference quantizer of `wtype.vec_dot_type()`, or pass f32 rows through
/// for float weights. `scratch` grows as needed and is reused across calls. When the
/// matrix-matrix kernel will take the product (enough tokens, a type and CPU it handles), the
/// activations' per-block terms are computed here too, once for all threads.
///
/// The same as [`ActivationBuffers::new`], one [`quantize_chunk`] over all rows, and
/// [`ActivationBuffers::finish`]; a caller with threads splits the rows instead.
pub fn quantize_activations<'a>(
    wtype: GgmlType,
    n_in: usize,
    x: &'a [f32],
    n_tokens: usize,
    scratch: &'a mut Vec<u8>,
) -> Result<Activations<'a>, KernelError> {
    let mut buffers = ActivationBuffers::new(wtype, n_in, x, n_tokens, false, scratch)?;
    if let Some(chunk) = buffers.chunks(n_tokens.max(1)).next() {
        quantize_chunk(chunk)?;
    }
    Ok(buffers.finish())
}

/// The quantized activation rows of one product and their kernel terms, being filled:
/// regions of one scratch buffer, split by token into [`ActivationChunk`]s that
/// [`quantize_chunk`] fills independently (on any thread), then viewed by
/// [`ActivationBuffers::finish`].
pub struct ActivationBuffers<'a> {
    x: &'a [f32],
    n_in: usize,
    /// The activation type; `None` for float weights, whose activations are `x` itself.
    ty: Option<GgmlType>,
    data: &'a mut [u8],
    d: &'a mut [f32],
    aux: &'a mut [i32],
    /// The panel kernel whose terms the chunks compute, when it will take the product.
    panel: Option<PanelKernel>,
}

/// The rows of some tokens of an [`ActivationBuffers`]: their f32 input and their outputs.
pub struct ActivationChunk<'b> {
    ty: GgmlType,
    n_in: usize,
    x: &'b [f32],
    data: &'b mut [u8],
    d: &'b mut [f32],
    aux: &'b mut [i32],
    panel: Option<PanelKernel>,
}

impl<'a> ActivationBuffers<'a> {
    /// Sizes `scratch` for `n_tokens` rows of `n_in` values of `wtype`'s activation type (and
    /// the kernel terms when [`gemm`] will run: always for a `repacked` weight, else from
    /// enough tokens on) and splits it into the output regions.
    pub fn new(
        wtype: GgmlType,
        n_in: usize,
        x: &'a [f32],
        n_tokens: usize,
        repacked: bool,
        scratch: &'a mut Vec<u8>,
    ) -> Result<Self, KernelError> {
        const K: &str = "quantize_activations";
        check_nonzero(K, "n_in", n_in)?;
        check_len(K, "x", x.len(), size(K, "x", n_in, n_tokens)?)?;
        let Some(aty) = wtype.vec_dot_type() else {
            return Ok(ActivationBuffers {
                x,
                n_in,
                ty: None,
                data: &mut [],
                d: &mut [],
                aux: &mut [],
                panel: None,
            });
        };
        let row = row_bytes(K, aty, n_in)?;
        let total = size(K, "scratch", row, n_tokens)?;
        let panel = if repacked {
            gemm::kernel(wtype)
        } else {
            gemm::kernel_for(wtype, n_tokens)
        };
        let n_terms = if panel.is_some() {
            n_tokens * (n_in / aty.block_size())
        } else {
            0
        };
        let n_aux = n_terms * panel.map_or(0, |p| p.aux_words());
        // The quantized rows, then (from a multiple of SCRATCH_ALIGN) the terms' scales and the
        // kernel's words, 4 bytes each.
        let data_len = total.next_multiple_of(SCRATCH_ALIGN);
        let needed = n_terms
            .checked_add(n_aux)
            .and_then(|n| n.checked_mul(4))
            .and_then(|t| data_len.checked_add(t)?.checked_add(SCRATCH_ALIGN))
            .ok_or(KernelError::Overflow {
                kernel: K,
                operand: "scratch",
            })?;
        if scratch.len() < needed {
            scratch.resize(needed, 0);
        }
        let offset = scratch.as_ptr().align_offset(SCRATCH_ALIGN);
        let (data, rest) = scratch[offset..offset + needed - SCRATCH_ALIGN].split_at_mut(data_len);
        let (d, aux) = bytemuck::cast_slice_mut::<u8, f32>(rest).split_at_mut(n_terms);
        Ok(ActivationBuffers {
            x,
            n_in,
            ty: Some(aty),
            data: &mut data[..total],
            d,
            aux: bytemuck::cast_slice_mut(aux),
            panel,
        })
    }

    /// The chunks of `tokens_per_chunk` tokens (the last may be shorter); none for float
    /// weights, which need no preparation.
    pub fn chunks(&mut self, tokens_per_chunk: usize) -> impl Iterator<Item = ActivationChunk<'_>> {
        let (n_in, panel) = (self.n_in, self.panel);
        let ty = self.ty.unwrap_or(GgmlType::F32);
        let per = tokens_per_chunk.max(1);
        let n_tokens = if self.ty.is_some() { self.x.len() / n_in } else { 0 };
        let row = self.data.len() / n_tokens.max(1);
        let nb = self.d.len() / n_tokens.max(1);
        let words = self.aux.len() / n_tokens.max(1);
        let mut d = self.d.chunks_mut((per * nb).max(1));
        let mut aux = self.aux.chunks_mut((per * words).max(1));
        self.x
            .chunks(per * n_in)
            .take(n_tokens.div_ceil(per))
            .zip(self.data.chunks_mut((per * row).max(1)))
            .map(move |(x, data)| ActivationChunk {
                ty,
                n_in,
                x,
                data,
                d: if panel.is_some() {
                    d.next().unwrap_or_default()
                } else {
                    &mut []
                },
                aux: if panel.is_some() {
                    aux.next().unwrap_or_default()
                } else {
                    &mut []
                },
                panel,
            })
    }

    /// The activations, once every chunk is filled.
    pub fn finish(self) -> Activations<'a> {
        match self.ty {
            None => Activations::F32(self.x),
            Some(ty) => Activations::Quantized {
                ty,
                data: self.data,
                terms: self.panel.is_some().then_some(gemm::ActivationTerms {
                    d: self.d,
                    aux: self.aux,
                }),
            },
        }
    }
}

/// Quantizes a chunk's rows with the reference quantizer (compiled for the chosen instruction
/// set by the type table), and computes their kernel terms.
pub fn quantize_chunk(chunk: ActivationChunk<'_>) -> Result<(), KernelError> {
    const K: &str = "quantize_activations";
    let quant_err = |source| KernelError::Quant { kernel: K, source };
    let row = chunk.data.len() / (chunk.x.len() / chunk.n_in).max(1);
    for (xr, dr) in chunk.x.chunks_exact(chunk.n_in).zip(chunk.data.chunks_exact_mut(row)) {
        quant::quantize_activation_row(chunk.ty, xr, dr).map_err(quant_err)?;
    }
    if let Some(panel) = chunk.panel {
        let nb = chunk.n_in / chunk.ty.block_size();
        panel
            .activation_terms(chunk.data, nb, chunk.d, chunk.aux)
            .map_err(quant_err)?;
    }
    Ok(())
}

/// `y[t * n_out + o] = dot(weight row o, x row t)` for a weight `w` of `n_out` rows of `n_in`
/// values of `wtype` and activations `x` of `n_tokens` rows of `n_in`. `scratch` holds the
/// quantized activations (see [`quantize_activations`]); it is the only memory this allocates.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    w: &[u8],
    wtype: GgmlType,
    n_in: usize,
    n_out: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    scratch: &mut Vec<u8>,
) -> Result<(), KernelError> {
    const K: &str = "matmul";
    check_nonzero(K, "n_in", n_in)?;
    check_weight(K, w, wtype, n_in, n_out)?;
    check_len(K, "x", x.len(), size(K, "x", n_in, n_tokens)?)?;
    check_len(K, "y", y.len(), size(K, "y", n_out, n_tokens)?)?;
    let act = quantize_activations(wtype, n_in, x, n_tokens, scratch)?;
    matmul_rows(w, wtype, n_in, n_out, act, n_tokens, 0..n_out, y)
}

/// The output rows `rows` of [`matmul`] for all tokens, from activations already prepared by
/// [`quantize_activations`]. `y` holds `rows.len() * n_tokens` values, token-major over the
/// selected rows: `y[t * rows.len() + (o - rows.start)]`. With `rows = 0..n_out` that is
/// `matmul`'s output; with one token it is the slice `y_full[rows]`.
///
/// Each weight row is read once per call: the token loop is inside the row loop.
///
/// Weight and activation bytes are viewed as blocks in place when aligned for them (GGUF tensor
/// data and [`quantize_activations`]' output always are); otherwise each dot product copies its
/// operands, which is correct but slow.
#[allow(clippy::too_many_arguments)]
pub fn matmul_rows(
    w: &[u8],
    wtype: GgmlType,
    n_in: usize,
    n_out: usize,
    act: Activations<'_>,
    n_tokens: usize,
    rows: Range<usize>,
    y: &mut [f32],
) -> Result<(), KernelError> {
    const K: &str = "matmul_rows";
    check_nonzero(K, "n_in", n_in)?;
    let w_row = check_weight(K, w, wtype, n_in, n_out)?;
    if rows.start > rows.end || rows.end > n_out {
        return Err(KernelError::RowRange {
            kernel: K,
            start: rows.start,
            end: rows.end,
            n_out,
        });
    }
    check_len(K, "y", y.len(), size(K, "y", rows.len(), n_tokens)?)?;
    if act.ty() != wtype.vec_dot_type() {
        return Err(KernelError::ActivationType {
            kernel: K,
            wtype,
            expected: wtype.vec_dot_type(),
            got: act.ty(),
        });
    }
    let quant_err = |source| KernelError::Quant { kernel: K, source };
    let nr = rows.len();
    let w_rows = &w[rows.start * w_row..rows.end * w_row];
    let weights = w_rows.chunks_exact(w_row);
    match act {
        Activations::F32(x) => {
            let dot = traits::float_dot(wtype).map_err(quant_err)?;
            check_len(K, "x", x.len(), size(K, "x", n_in, n_tokens)?)?;
            for (i, wr) in weights.enumerate() {
                for (t, xr) in x.chunks_exact(n_in).enumerate() {
                    y[t * nr + i] = dot.dot(wr, xr);
                }
            }
        }
        Activations::Quantized { ty, data, terms } => {
            let dots = traits::block_dots(wtype).map_err(quant_err)?;
            let a_row = row_bytes(K, ty, n_in)?;
            check_len(K, "activations", data.len(), size(K, "activations", a_row, n_tokens)?)?;
            if let Some(terms) = terms {
                let nb = n_in / wtype.block_size();
                if gemm::gemm_rows(wtype, w, nb, data, terms, n_tokens, rows.clone(), y).map_err(quant_err)? {
                    return Ok(());
                }
            }
            if n_tokens == 1 {
                dots.matvec(w_rows, w_row, data, y);
                return Ok(());
            }
            // Where the type has a two-by-two kernel (SMMLA), two weight rows against two tokens
            // at a time; the odd row, or every row elsewhere, against the tokens two at a time
            // (the kernels unpack a weight block once for both). The odd token one by one.
            let mut first = 0;
            if dots.has_2x2() {
                let mut row_pairs = w_rows.chunks_exact(2 * w_row);
                for (q, wr) in (&mut row_pairs).enumerate() {
                    let (w0, w1) = wr.split_at(w_row);
                    let i = 2 * q;
                    let mut pairs = data.chunks_exact(2 * a_row);
                    for (p, ar) in (&mut pairs).enumerate() {
                        let (a0, a1) = ar.split_at(a_row);
                        let [[d00, d01], [d10, d11]] = dots.dot_2x2([w0, w1], [a0, a1]);
                        y[2 * p * nr + i] = d00;
                        y[(2 * p + 1) * nr + i] = d01;
                        y[2 * p * nr + i + 1] = d10;
                        y[(2 * p + 1) * nr + i + 1] = d11;
                    }
                    let last = pairs.remainder();
                    if !last.is_empty() {
                        y[(n_tokens - 1) * nr + i] = dots.dot(w0, last);
                        y[(n_tokens - 1) * nr + i + 1] = dots.dot(w1, last);
                    }
                }
                first = nr - row_pairs.remainder().len() / w_row;
            }
            for (i, wr) in weights.enumerate().skip(first) {
                let mut pairs = data.chunks_exact(2 * a_row);
                for (p, ar) in (&mut pairs).enumerate() {
                    let (a0, a1) = ar.split_at(a_row);
                    let [d0, d1] = dots.dot_x2(wr, a0, a1);
                    y[2 * p * nr + i] = d0;
                    y[(2 * p + 1) * nr + i] = d1;
                }
                let last = pairs.remainder();
                if !last.is_empty() {
                    y[(n_tokens - 1) * nr + i] = dots.dot(wr, last);
                }
            }
        }
    }
    Ok(())
}

/// [`matmul_rows`] for a weight in the repacked layout (`crate::quant::repack`), at any number
/// of tokens: `rows` are whole groups of 16, `act` comes from [`ActivationBuffers`] made for a
/// repacked weight (with the kernel terms), and `y` is laid out as `matmul_rows` lays it out.
/// Every output is bit-identical to the scalar dot product of its row and token.
pub fn matmul_rows_repacked(
    w: &Repacked,
    act: Activations<'_>,
    n_tokens: usize,
    rows: Range<usize>,
    y: &mut [f32],
) -> Result<(), KernelError> {
    const K: &str = "matmul_rows_repacked";
    let quant_err = |source| KernelError::Quant { kernel: K, source };
    let (Activations::Quantized { data, terms, .. }, true) = (act, act.ty() == w.ty.vec_dot_type()) else {
        return Err(KernelError::ActivationType {
            kernel: K,
            wtype: w.ty,
            expected: w.ty.vec_dot_type(),
            got: act.ty(),
        });
    };
    let Some(terms) = terms else {
        return Err(quant_err(QuantError::UnsupportedType {
            ggml_type: w.ty,
            op: "a product of repacked weights with activations prepared without the kernel terms",
        }));
    };
    if rows.start > rows.end || rows.end > w.n_out {
        return Err(KernelError::RowRange {
            kernel: K,
            start: rows.start,
            end: rows.end,
            n_out: w.n_out,
        });
    }
    match gemm::gemm_rows_repacked(w, data, terms, n_tokens, rows, y) {
        Ok(true) => Ok(()),
        Ok(false) => Err(quant_err(QuantError::UnsupportedType {
            ggml_type: w.ty,
            op: "a product of repacked weights on this CPU",
        })),
        Err(e) => Err(quant_err(e)),
    }
}

/// Bytes per weight row, after checking that `w` holds exactly `n_out` of them.
fn check_weight(
    kernel: &'static str,
    w: &[u8],
    wtype: GgmlType,
    n_in: usize,
    n_out: usize,
) -> Result<usize, KernelError> {
    let w_row = row_bytes(kernel, wtype, n_in)?;
    check_len(kernel, "w", w.len(), size(kernel, "w", w_row, n_out)?)?;
    Ok(w_row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::XorShift;

    /// A weight quantized from `values`, or random blocks of a type minfer only reads.
    fn quantized_weight(ty: GgmlType, values: &[f32]) -> Vec<u8> {
        let row = traits::get(ty).unwrap();
        if !row.can_quantize() {
            let mut r = XorShift(values.len() as u64 ^ 0x5eed);
            return row
                .test
                .unwrap()
                .random_row(&mut r, values.len() / row.block_size, row.type_size);
        }
        let mut w = vec![0u8; ty.row_size(values.len() as u64).unwrap() as usize];
        quant::quantize_row(ty, values, &mut w).unwrap();
        w
    }

    /// The weight types, from the type table.
    fn weight_types() -> impl Iterator<Item = GgmlType> {
        traits::computable().map(|row| row.ty)
    }

    #[test]
    fn every_output_is_the_dot_product_of_a_weight_row_with_a_quantized_token_row() {
        let mut r = XorShift(11);
        let (n_in, n_out, n_tokens) = (512, 5, 3);
        for ty in weight_types() {
            let w = quantized_weight(ty, &r.vec(n_in * n_out, 1.0));
            let x = r.vec(n_in * n_tokens, 2.0);
            let mut y = vec![0.0; n_out * n_tokens];
            let mut scratch = Vec::new();
            matmul(&w, ty, n_in, n_out, &x, n_tokens, &mut y, &mut scratch).unwrap();

            let w_row = w.len() / n_out;
            for t in 0..n_tokens {
                let xt = &x[t * n_in..][..n_in];
                for o in 0..n_out {
                    let wr = &w[o * w_row..][..w_row];
                    let expected = match ty.vec_dot_type() {
                        None => quant::vec_dot_f32(ty, wr, xt).unwrap(),
                        Some(aty) => {
                            let mut a = vec![0u8; aty.row_size(n_in as u64).unwrap() as usize];
                            quant::quantize_row(aty, xt, &mut a).unwrap();
                            quant::vec_dot(ty, wr, &a, n_in).unwrap()
                        }
                    };
                    assert_eq!(y[t * n_out + o].to_bits(), expected.to_bits(), "{ty} t={t} o={o}");

                    // And the whole thing approximates the f32 product of the dequantized rows.
                    let mut wf = vec![0.0f32; n_in];
                    quant::dequantize_row(ty, wr, &mut wf).unwrap();
                    let exact: f64 = wf.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let scale: f64 = wf.iter().zip(xt).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                    let got = y[t * n_out + o] as f64;
                    assert!((got - exact).abs() <= 0.02 * scale + 1e-6, "{ty}: {got} vs {exact}");
                }
            }
        }
    }

    #[test]
    fn row_ranges_reproduce_the_full_product_bit_for_bit() {
        let mut r = XorShift(12);
        let (n_in, n_out, n_tokens) = (256, 7, 4);
        for ty in weight_types() {
            let w = quantized_weight(ty, &r.vec(n_in * n_out, 1.0));
            let x = r.vec(n_in * n_tokens, 1.0);
            let mut full = vec![0.0; n_out * n_tokens];
            let mut scratch = Vec::new();
            matmul(&w, ty, n_in, n_out, &x, n_tokens, &mut full, &mut scratch).unwrap();

            let act = quantize_activations(ty, n_in, &x, n_tokens, &mut scratch).unwrap();
            for rows in [0..3, 3..7, 2..2, 6..7] {
                let mut part = vec![f32::NAN; rows.len() * n_tokens];
                matmul_rows(&w, ty, n_in, n_out, act, n_tokens, rows.clone(), &mut part).unwrap();
                for t in 0..n_tokens {
                    for (i, o) in rows.clone().enumerate() {
                        assert_eq!(
                            part[t * rows.len() + i].to_bits(),
                            full[t * n_out + o].to_bits(),
                            "{ty}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn unaligned_weights_give_the_same_result() {
        let mut r = XorShift(13);
        // Three tokens: a pair for the two-row kernels and an odd one.
        let (n_in, n_out, n_tokens) = (256, 3, 3);
        for ty in weight_types() {
            let w = quantized_weight(ty, &r.vec(n_in * n_out, 1.0));
            let mut shifted = vec![0u8; w.len() + 1];
            shifted[1..].copy_from_slice(&w);
            let x = r.vec(n_in * n_tokens, 1.0);
            let (mut a, mut b) = (vec![0.0; n_out * n_tokens], vec![0.0; n_out * n_tokens]);
            let mut scratch = Vec::new();
            matmul(&w, ty, n_in, n_out, &x, n_tokens, &mut a, &mut scratch).unwrap();
            matmul(&shifted[1..], ty, n_in, n_out, &x, n_tokens, &mut b, &mut scratch).unwrap();
            assert_eq!(a, b, "{ty}");
        }
    }

    #[test]
    fn a_reused_scratch_does_not_leak_into_the_next_product() {
        let mut r = XorShift(14);
        let (n_in, n_out) = (64, 2);
        let w = quantized_weight(GgmlType::Q8_0, &r.vec(n_in * n_out, 1.0));
        let mut scratch = vec![0xAB; 10_000];
        let x = r.vec(n_in, 1.0);
        let mut y1 = vec![0.0; n_out];
        matmul(&w, GgmlType::Q8_0, n_in, n_out, &x, 1, &mut y1, &mut scratch).unwrap();
        let mut y2 = vec![0.0; n_out];
        matmul(&w, GgmlType::Q8_0, n_in, n_out, &x, 1, &mut y2, &mut Vec::new()).unwrap();
        assert_eq!(y1, y2);
    }

    #[test]
    fn bad_sizes_are_refused_naming_the_kernel_and_the_sizes() {
        let w = vec![0u8; 2 * 34];
        let mut scratch = Vec::new();
        let err = matmul(&w, GgmlType::Q8_0, 32, 2, &[0.0; 32], 1, &mut [0.0; 3], &mut scratch).unwrap_err();
        assert_eq!(err.to_string(), "matmul: y has length 3, expected 2");
        let err = matmul(&w, GgmlType::Q8_0, 32, 3, &[0.0; 32], 1, &mut [0.0; 3], &mut scratch).unwrap_err();
        assert_eq!(err.to_string(), "matmul: w has length 68, expected 102");
        let err = matmul(&w, GgmlType::Q8_0, 34, 2, &[0.0; 34], 1, &mut [0.0; 2], &mut scratch).unwrap_err();
        assert!(matches!(err, KernelError::Quant { kernel: "matmul", .. }), "{err}");
        let err = matmul(&[], GgmlType::I32, 4, 0, &[], 0, &mut [], &mut scratch).unwrap_err();
        let expected = "matmul_rows: vec_dot_f32 is not implemented for ggml type I32";
        assert_eq!(err.to_string(), expected);

        let x = [0.0f32; 32];
        let act = Activations::F32(&x);
        let err = matmul_rows(&w, GgmlType::Q8_0, 32, 2, act, 1, 0..2, &mut [0.0; 2]).unwrap_err();
        let expected = "matmul_rows: Q8_0 weights take Q8_0 activations, got f32";
        assert_eq!(err.to_string(), expected);
        let act = quantize_activations(GgmlType::Q8_0, 32, &x, 1, &mut scratch).unwrap();
        let err = matmul_rows(&w, GgmlType::Q8_0, 32, 2, act, 1, 1..3, &mut [0.0; 2]).unwrap_err();
        let expected = "matmul_rows: rows 1..3 are not within the 2 output rows";
        assert_eq!(err.to_string(), expected);
    }
}
