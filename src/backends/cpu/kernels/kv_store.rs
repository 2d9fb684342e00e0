//! Writing one step's K and V rows into a layer's persistent cache regions at the cells the
//! positions name.

use super::{check_len, size, KernelError, KvRegionMut};

/// Row `t` of `k` and `v` (`width` values each) goes to cell `positions[t]` of `k_region` and
/// `v_region` (`n_ctx` cells of `width` values, in their stored types). A position outside the
/// cache is an error.
pub fn kv_store(
    positions: &[i32],
    k: &[f32],
    v: &[f32],
    width: usize,
    mut k_region: KvRegionMut<'_>,
    mut v_region: KvRegionMut<'_>,
) -> Result<(), KernelError> {
    const K: &str = "kv_store";
    let n = positions.len();
    check_len(K, "k", k.len(), size(K, "k", n, width)?)?;
    check_len(K, "v", v.len(), k.len())?;
    check_len(K, "v_region", v_region.len(), k_region.len())?;
    let n_kv = k_region.len().checked_div(width).unwrap_or(0);
    for (t, &pos) in positions.iter().enumerate() {
        let cell = usize::try_from(pos)
            .ok()
            .filter(|&c| c < n_kv)
            .ok_or(KernelError::PositionOutOfRange {
                kernel: K,
                token: t,
                pos,
                n_kv,
            })?;
        k_region.write(cell * width, &k[t * width..(t + 1) * width])?;
        v_region.write(cell * width, &v[t * width..(t + 1) * width])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_land_in_the_cells_their_positions_name() {
        let (k, v) = ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]);
        let (mut kr, mut vr) = (vec![0.0; 8], vec![0.0; 8]);
        kv_store(&[3, 1], &k, &v, 2, KvRegionMut::F32(&mut kr), KvRegionMut::F32(&mut vr)).unwrap();
        assert_eq!(kr, [0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 1.0, 2.0]);
        assert_eq!(vr, [0.0, 0.0, 7.0, 8.0, 0.0, 0.0, 5.0, 6.0]);
    }

    #[test]
    fn a_position_outside_the_cache_is_refused() {
        let (mut kr, mut vr) = (vec![0.0; 4], vec![0.0; 4]);
        let err = kv_store(
            &[2],
            &[1.0, 2.0],
            &[1.0, 2.0],
            2,
            KvRegionMut::F32(&mut kr),
            KvRegionMut::F32(&mut vr),
        )
        .unwrap_err();
        assert_eq!(
            err,
            KernelError::PositionOutOfRange {
                kernel: "kv_store",
                token: 0,
                pos: 2,
                n_kv: 2
            }
        );
    }
}
