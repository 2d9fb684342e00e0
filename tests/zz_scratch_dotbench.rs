use minfer::quant::{quantize_row, vec_dot, GgmlType};
#[test]
fn dotbench() {
    let n = 1536usize;
    let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
    let mut a = vec![0u8; GgmlType::Q8_K.row_size(n as u64).unwrap() as usize];
    quantize_row(GgmlType::Q8_K, &x, &mut a).unwrap();
    for ty in [
        GgmlType::Q2_K,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ2_S,
        GgmlType::IQ3_S,
        GgmlType::Q4_K,
    ] {
        let rs = ty.row_size(n as u64).unwrap() as usize;
        let w: Vec<u8> = (0..rs).map(|i| (i * 131 % 251) as u8).collect();
        let mut w = w;
        // sane f16 scales: zero the scale bytes by dequantizing? just run
        let _ = &mut w;
        let t = std::time::Instant::now();
        let mut s = 0.0f32;
        let iters = 20000;
        for _ in 0..iters {
            s += vec_dot(ty, &w, &a, n).unwrap();
        }
        let el = t.elapsed().as_secs_f64();
        println!(
            "{ty}: {:.1} ns/superblock ({s})",
            el * 1e9 / (iters as f64 * (n / 256) as f64)
        );
    }
}
