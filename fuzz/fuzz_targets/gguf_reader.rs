//! Fuzz the GGUF reader: `minfer::gguf::parse_header` on arbitrary bytes, then the tensor data
//! of whatever it accepts through `minfer::quant::dequantize_row`.
//!
//! What must hold for every input:
//! * nothing panics, hangs or aborts;
//! * `parse_header` allocates at most a constant factor of the input's size (checked with a
//!   counting allocator, see `MAX_AMPLIFICATION`);
//! * every tensor of an accepted header lies inside the input, exactly as
//!   `GgufFile::tensor_data` slices it;
//! * `dequantize_row` accepts every small tensor of a supported type, since `parse_header`
//!   already checked that its size is a whole number of blocks.

#![no_main]

use libfuzzer_sys::fuzz_target;
use minfer::gguf::parse_header;
use minfer::quant::dequantize_row;

/// Bytes `parse_header` may have allocated at once, per byte of input. The reader bounds every
/// count by the bytes that remain, but allocates before it reads the elements, so a stack of
/// unfinished nested arrays (at most `MAX_ARRAY_DEPTH` deep) legitimately costs a few tens of
/// times the input; anything past this is not a constant factor any more.
const MAX_AMPLIFICATION: usize = 128;
/// Allowance for fixed costs (hash tables' first buckets, error messages) on tiny inputs.
const FIXED_ALLOWANCE: usize = 1 << 20;
/// Only tensors this small are dequantized, to keep executions fast.
const MAX_DEQUANT_ELEMENTS: u64 = 1 << 16;

#[path = "counting_alloc.rs"]
mod counting_alloc;

fuzz_target!(|bytes: &[u8]| {
    let (parsed, allocated) = counting_alloc::peak_during(|| parse_header(bytes));
    let limit = MAX_AMPLIFICATION * bytes.len() + FIXED_ALLOWANCE;
    assert!(
        allocated <= limit,
        "parse_header allocated {allocated} bytes at once for a {}-byte input (limit {limit})",
        bytes.len()
    );

    let Ok(header) = parsed else { return };

    // Typed getters: any answer is fine, only a panic is not.
    let metadata = &header.metadata;
    let _ = metadata.get_u32("general.alignment");
    let _ = metadata.get_str("general.architecture");
    let _ = metadata.get_array("tokenizer.ggml.tokens").map(|a| a.len());
    let _ = metadata.get_uint("split.count");
    let _ = metadata.get_float("general.alignment");

    for t in &header.tensors {
        // The same slicing as `GgufFile::tensor_data`, which relies on the bounds that
        // `parse_header` checked.
        let start = (header.data_offset + t.offset) as usize;
        let data = &bytes[start..start + t.size as usize];

        let n = t.n_elements();
        if !t.ggml_type.is_supported() || n > MAX_DEQUANT_ELEMENTS {
            continue;
        }
        let mut out = vec![0f32; n as usize];
        if let Err(e) = dequantize_row(t.ggml_type, data, &mut out) {
            panic!(
                "tensor '{}' ({}, shape {:?}, {} bytes) was accepted by parse_header but \
                 dequantize_row refused it: {e}",
                t.name, t.ggml_type, t.shape, t.size
            );
        }
    }
});
