//! Row gather from a table of any supported ggml type into f32 rows (ggml's `get_rows`): the
//! token embedding lookup. Owns the id checks and the row addressing; the conversion of a row
//! belongs to `crate::quant::dequantize_row`.

use super::{check_len, check_nonzero, row_bytes, size, KernelError};
use crate::quant::{self, GgmlType, QuantError};

/// Row `i` of `out` (`[n_embd, ids.len()]`) becomes row `ids[i]` of `table` (`n_rows` rows of
/// `n_embd` values of `ttype`), dequantized. Every id is checked before anything is written.
pub fn get_rows(
    table: &[u8],
    ttype: GgmlType,
    n_embd: usize,
    n_rows: usize,
    ids: &[i32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    const K: &str = "get_rows";
    check_nonzero(K, "n_embd", n_embd)?;
    if !ttype.is_supported() {
        return Err(KernelError::Quant {
            kernel: K,
            source: QuantError::UnsupportedType {
                ggml_type: ttype,
                op: "dequantize",
            },
        });
    }
    let row = row_bytes(K, ttype, n_embd)?;
    check_len(K, "table", table.len(), size(K, "table", row, n_rows)?)?;
    check_len(K, "out", out.len(), size(K, "out", n_embd, ids.len())?)?;
    if let Some((index, &id)) = ids
        .iter()
        .enumerate()
        .find(|&(_, &id)| usize::try_from(id).map_or(true, |id| id >= n_rows))
    {
        return Err(KernelError::RowIdOutOfRange {
            kernel: K,
            index,
            id,
            n_rows,
        });
    }
    for (&id, out_row) in ids.iter().zip(out.chunks_exact_mut(n_embd)) {
        let start = id as usize * row;
        quant::dequantize_row(ttype, &table[start..start + row], out_row)
            .map_err(|source| KernelError::Quant { kernel: K, source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::XorShift;

    #[test]
    fn each_id_selects_its_dequantized_table_row() {
        let mut r = XorShift(51);
        let (n_embd, n_rows) = (256, 6);
        let values = r.vec(n_embd * n_rows, 1.0);
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let mut table = vec![0u8; ty.row_size((n_embd * n_rows) as u64).unwrap() as usize];
            quant::quantize_row(ty, &values, &mut table).unwrap();
            let mut all = vec![0.0f32; n_embd * n_rows];
            quant::dequantize_row(ty, &table, &mut all).unwrap();

            let ids = [5, 0, 5, 2];
            let mut out = vec![0.0; n_embd * ids.len()];
            get_rows(&table, ty, n_embd, n_rows, &ids, &mut out).unwrap();
            for (i, &id) in ids.iter().enumerate() {
                let id = id as usize;
                assert_eq!(
                    &out[i * n_embd..][..n_embd],
                    &all[id * n_embd..][..n_embd],
                    "{ty} ids[{i}]"
                );
            }
        }
    }

    #[test]
    fn an_id_outside_the_table_is_refused_naming_it_and_the_row_count() {
        let table = vec![0u8; 3 * 34];
        let mut out = vec![7.0; 64];
        let err = get_rows(&table, GgmlType::Q8_0, 32, 3, &[1, 3], &mut out).unwrap_err();
        assert_eq!(
            err.to_string(),
            "get_rows: ids[1] = 3 is not a row of a table of 3 rows"
        );
        assert!(
            out.iter().all(|&v| v == 7.0),
            "nothing is written before the ids are checked"
        );
        let err = get_rows(&table, GgmlType::Q8_0, 32, 3, &[-1, 0], &mut out).unwrap_err();
        assert!(matches!(
            err,
            KernelError::RowIdOutOfRange {
                index: 0,
                id: -1,
                n_rows: 3,
                ..
            }
        ));
    }

    #[test]
    fn bad_sizes_are_refused_naming_the_kernel_and_the_sizes() {
        let err = get_rows(&[0; 100], GgmlType::Q8_0, 32, 3, &[0], &mut [0.0; 32]).unwrap_err();
        assert_eq!(err.to_string(), "get_rows: table has length 100, expected 102");
        let err = get_rows(&[0; 102], GgmlType::Q8_0, 32, 3, &[0], &mut [0.0; 31]).unwrap_err();
        assert_eq!(err.to_string(), "get_rows: out has length 31, expected 32");
        let err = get_rows(&[0; 8], GgmlType::I64, 1, 1, &[0], &mut [0.0; 1]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "get_rows: dequantize is not implemented for ggml type I64"
        );
    }
}
