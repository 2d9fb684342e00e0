// Weights in their GGML layouts, read as u32 words and unpacked with bit operations (no
// shader-f16, nor f16-in-f32, needed; `f16_to_f32` is f16.wgsl's, prepended):
// `value(row_base, i)` is value i of the row starting at byte `row_base`,
// with the formulas of ggml's `dequantize_row_*` (the CPU's scalar references). Correct first:
// each value is dequantized where it is used and multiplied with f32 activations.
//
// Entry points: `mul_mat` (out[t, o] = sum_i W[o, i] x[t, i] (+ bias[o])), one workgroup per
// output value; `get_rows` (out[t, :] = W[ids[t], :]), one workgroup per row.
struct Params {
    ty: u32,        // the GGML type id
    row_bytes: u32,
    n_in: u32,      // values per weight row
    n_out: u32,     // weight rows (matmul) or table rows (get_rows)
    n_tokens: u32,
    has_bias: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;      // activations, or ids as i32 bits
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

fn byte_at(off: u32) -> u32 {
    return (w[off >> 2u] >> ((off & 3u) * 8u)) & 0xffu;
}

fn u16_at(off: u32) -> u32 {
    return byte_at(off) | (byte_at(off + 1u) << 8u);
}

fn f16_at(off: u32) -> f32 {
    return f16_to_f32(u16_at(off));
}

fn i8_of(b: u32) -> f32 {
    return f32(bitcast<i32>(b << 24u) >> 24u);
}

// The scale and min of sub-block j of a Q4_K or Q5_K super-block (ggml's get_scale_min_k4).
fn scale_min_k4(scales: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(byte_at(scales + j) & 63u), f32(byte_at(scales + j + 4u) & 63u));
    }
    let sc = (byte_at(scales + j + 4u) & 0xfu) | ((byte_at(scales + j - 4u) >> 6u) << 4u);
    let m = (byte_at(scales + j + 4u) >> 4u) | ((byte_at(scales + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

fn value(row: u32, i: u32) -> f32 {
    switch p.ty {
        case 0u: { // F32
            return bitcast<f32>(w[(row >> 2u) + i]);
        }
        case 1u: { // F16
            return f16_at(row + 2u * i);
        }
        case 30u: { // BF16
            return bitcast<f32>(u16_at(row + 2u * i) << 16u);
        }
        case 2u: { // Q4_0: d, 16 bytes of nibbles (low: values 0-15, high: 16-31)
            let b = row + (i / 32u) * 18u;
            let j = i % 32u;
            let q = (byte_at(b + 2u + (j % 16u)) >> (4u * (j / 16u))) & 0xfu;
            return f16_at(b) * (f32(q) - 8.0);
        }
        case 3u: { // Q4_1: d, m, 16 bytes of nibbles
            let b = row + (i / 32u) * 20u;
            let j = i % 32u;
            let q = (byte_at(b + 4u + (j % 16u)) >> (4u * (j / 16u))) & 0xfu;
            return f16_at(b) * f32(q) + f16_at(b + 2u);
        }
        case 6u: { // Q5_0: d, qh (32 high bits), 16 bytes of nibbles
            let b = row + (i / 32u) * 22u;
            let j = i % 32u;
            let qh = u16_at(b + 2u) | (u16_at(b + 4u) << 16u);
            let q = ((byte_at(b + 6u + (j % 16u)) >> (4u * (j / 16u))) & 0xfu) | (((qh >> j) & 1u) << 4u);
            return f16_at(b) * (f32(q) - 16.0);
        }
        case 7u: { // Q5_1: d, m, qh, 16 bytes of nibbles
            let b = row + (i / 32u) * 24u;
            let j = i % 32u;
            let qh = u16_at(b + 4u) | (u16_at(b + 6u) << 16u);
            let q = ((byte_at(b + 8u + (j % 16u)) >> (4u * (j / 16u))) & 0xfu) | (((qh >> j) & 1u) << 4u);
            return f16_at(b) * f32(q) + f16_at(b + 2u);
        }
        case 8u: { // Q8_0: d, 32 i8
            let b = row + (i / 32u) * 34u;
            return f16_at(b) * i8_of(byte_at(b + 2u + (i % 32u)));
        }
        case 12u: { // Q4_K: d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
            let b = row + (i / 256u) * 144u;
            let r = i % 256u;
            let chunk = r / 64u;
            let hi = (r % 64u) / 32u;
            let q = (byte_at(b + 16u + chunk * 32u + (r % 32u)) >> (4u * hi)) & 0xfu;
            let sm = scale_min_k4(b + 4u, 2u * chunk + hi);
            return f16_at(b) * sm.x * f32(q) - f16_at(b + 2u) * sm.y;
        }
        case 13u: { // Q5_K: d, dmin, scales, 32 bytes of high bits, 128 bytes of nibbles
            let b = row + (i / 256u) * 176u;
            let r = i % 256u;
            let chunk = r / 64u;
            let hi = (r % 64u) / 32u;
            let l = r % 32u;
            let low = (byte_at(b + 48u + chunk * 32u + l) >> (4u * hi)) & 0xfu;
            let high = (byte_at(b + 16u + l) >> (2u * chunk + hi)) & 1u;
            let sm = scale_min_k4(b + 4u, 2u * chunk + hi);
            return f16_at(b) * sm.x * f32(low | (high << 4u)) - f16_at(b + 2u) * sm.y;
        }
        case 14u: { // Q6_K: 128 bytes of low nibbles, 64 of high pairs, 16 i8 scales, d
            let b = row + (i / 256u) * 210u;
            let r = i % 256u;
            let n = r / 128u;
            let quarter = (r % 128u) / 32u;
            let l = r % 32u;
            let ql = (byte_at(b + n * 64u + l + (quarter & 1u) * 32u) >> (4u * (quarter / 2u))) & 0xfu;
            let qh = (byte_at(b + 128u + n * 32u + l) >> (2u * quarter)) & 3u;
            let sc = i8_of(byte_at(b + 192u + n * 8u + l / 16u + 2u * quarter));
            return f16_at(b + 208u) * sc * (f32(ql | (qh << 4u)) - 32.0);
        }
        default: {
            return 0.0;
        }
    }
}

const WG: u32 = 64u;
var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn mul_mat(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = wid.x + wid.y * nwg.x;
    let t = wid.z;
    if (o >= p.n_out) {
        return;
    }
    let row = o * p.row_bytes;
    let xs = t * p.n_in;
    var s = 0.0;
    for (var i = lid.x; i < p.n_in; i += WG) {
        s += value(row, i) * x[xs + i];
    }
    partial[lid.x] = s;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lid.x < k) {
            partial[lid.x] += partial[lid.x + k];
        }
        workgroupBarrier();
    }
    if (lid.x == 0u) {
        var r = partial[0];
        if (p.has_bias == 1u) {
            r += bias[o];
        }
        out[t * p.n_out + o] = r;
    }
}

@compute @workgroup_size(64)
fn get_rows(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    // Both entry points share one binding layout: name `bias` so that the layout keeps it.
    _ = &bias;
    let t = wid.x;
    if (t >= p.n_tokens) {
        return;
    }
    let id = bitcast<u32>(x[t]);
    // An id outside the table was refused on the host; a stale one reads row 0, never past it.
    let r = select(0u, id, id < p.n_out);
    for (var i = lid.x; i < p.n_in; i += WG) {
        out[t * p.n_in + i] = value(r * p.row_bytes, i);
    }
}
