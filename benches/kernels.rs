//! The decoding kernels' read rates, every quantized weight type against every kernel this CPU
//! runs: from memory (the slice flushed from the caches, as the kernel choice times them) and
//! from cache (a slice small enough to stay there: the most a kernel computes). A kernel whose
//! rate from cache is not well above the others' from memory is compute-bound here.
//!
//! Then the repacked K-quant tiles from memory at each prefetch distance the choice times.
//!
//! `cargo bench --bench kernels` (`-- --slice-mib N` for the slice from memory, default 4).

use minfer::quant::choice::{candidates_of, cpu_model, time_kernels, time_prefetch, Kernel};
use minfer::quant::GgmlType;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args
        .iter()
        .position(|a| a == "--slice-mib")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    println!("{}", cpu_model());
    println!("\n| type | kernel | from memory GB/s | from cache GB/s |");
    println!("| --- | --- | ---: | ---: |");
    for &ty in GgmlType::SUPPORTED {
        let mut kernels = candidates_of(ty);
        if kernels.is_empty() {
            continue;
        }
        if !kernels.contains(&Kernel::Scalar) {
            kernels.push(Kernel::Scalar);
        }
        let memory = time_kernels(ty, &kernels, mib << 20, true);
        let cache = time_kernels(ty, &kernels, 256 << 10, false);
        for ((k, m), (_, c)) in memory.iter().zip(&cache) {
            println!("| {ty} | {k} | {m:.1} | {c:.1} |");
        }
    }
    println!("\n| type | records prefetched ahead | from memory GB/s |");
    println!("| --- | ---: | ---: |");
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        for (records, gbps) in time_prefetch(ty, mib << 20) {
            println!("| {ty} | {records} | {gbps:.1} |");
        }
    }
}
