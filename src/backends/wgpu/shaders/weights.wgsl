// Weights in their GGML layouts, read as u32 words and unpacked with bit operations (no
// shader-f16, nor f16-in-f32, needed; `f16_to_f32` is f16.wgsl's, prepended), with the formulas
// of ggml's `dequantize_row_*` (the CPU's scalar references). The host prepends `const TY: u32`,
// the GGML type id, so each weight type compiles to its own kernels with the other types'
// branches gone.
//
// A token variant is appended (weights_token.wgsl or weights_tokens8.wgsl): how many tokens'
// activations `chunk_dot` multiplies at once (`Acc`, `Xs`, `xv`, `store`, `TOKENS`).
//
// Entry points (out[t, o] = sum_i W[o, i] x[t, i] (+ bias[o]), and the lookup):
// - `mul_mat` (one-token variant): a GPU's matrix-vector kernel of decode, 32 invocations per
//   row, each taking whole 32-value chunks, their scales read once (`chunk_dot`).
// - `mul_mm`: the product for prompts on a GPU, tiled: a workgroup dequantizes a 64 x 32 tile
//   of W and loads a 64 x 32 tile of x into workgroup memory, then each invocation
//   accumulates a 4 x 4 block of outputs, so every weight value is dequantized once per 64
//   tokens.
// - `mul_mat_rows`: the product on a CPU's lanes (a software driver), one invocation per row.
// - `get_rows` (out[t, :] = W[ids[t], :]), one workgroup per row.
// A weight larger than one binding is uploaded in parts of whole rows; each dispatch reads
// one part, rows `row0 .. row0 + rows` of the whole.
struct Params {
    ty: u32,        // the GGML type id (TY; kept for the layout)
    row_bytes: u32,
    n_in: u32,      // values per weight row
    n_out: u32,     // rows of the whole weight: the output's stride
    n_tokens: u32,
    has_bias: u32,
    row0: u32,      // the part's first row
    rows: u32,      // the part's rows
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

// The four bytes at `off`, a multiple of 2 (every block of the types read by words starts on
// one; MXFP4's 17-byte blocks are read by bytes).
fn word_at(off: u32) -> u32 {
    let i = off >> 2u;
    if ((off & 2u) == 0u) {
        return w[i];
    }
    return (w[i] >> 16u) | (w[i + 1u] << 16u);
}

// Byte k (0-3) of word q, as a float of its signed value.
fn i8_in(q: u32, k: u32) -> f32 {
    return f32(bitcast<i32>(q << (24u - 8u * k)) >> 24u);
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

// ggml's kvalues_iq4nl (IQ4_NL, IQ4_XS) and kvalues_mxfp4 (twice the E2M1 values).
var<private> KV_IQ4NL: array<i32, 16> = array<i32, 16>(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
var<private> KV_MXFP4: array<i32, 16> = array<i32, 16>(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);

// Value j (0-31) of a block's 4-bit values packed as Q4_0 packs them (low nibbles 0-15, high
// 16-31), from byte `qs`: Q4_0, Q4_1 and Q5_*'s low bits, IQ4_NL's and MXFP4's table indices.
fn nibble_at(qs: u32, j: u32) -> u32 {
    return (byte_at(qs + (j % 16u)) >> (4u * (j / 16u))) & 0xfu;
}

// Value i of the row starting at byte `row`.
fn value(row: u32, i: u32) -> f32 {
    switch TY {
        case 10u: { // Q2_K: 16 scale|min<<4 bytes, 64 bytes of 2-bit values, d, dmin
            let b = row + (i / 256u) * 84u;
            let r = i % 256u;
            let q = (byte_at(b + 16u + (r / 128u) * 32u + r % 32u) >> (2u * ((r % 128u) / 32u))) & 3u;
            let sc = byte_at(b + r / 16u);
            return f16_at(b + 80u) * f32(sc & 0xfu) * f32(q) - f16_at(b + 82u) * f32(sc >> 4u);
        }
        case 11u: { // Q3_K: 32 bytes of high bits, 64 of low 2-bit values, 12 of 6-bit scales, d
            let b = row + (i / 256u) * 110u;
            let r = i % 256u;
            let h = r / 128u;
            let s = (r % 128u) / 32u;
            let l = r % 32u;
            let low = (byte_at(b + 32u + h * 32u + l) >> (2u * s)) & 3u;
            let high = (byte_at(b + l) >> (4u * h + s)) & 1u;
            let j = r / 16u;
            var sl = byte_at(b + 96u + j % 8u);
            if (j >= 8u) {
                sl = sl >> 4u;
            }
            let sh = (byte_at(b + 104u + j % 4u) >> (2u * (j / 4u))) & 3u;
            let sc = f32(i32((sl & 0xfu) | (sh << 4u)) - 32);
            return f16_at(b + 108u) * sc * f32(i32(low) - select(4, 0, high == 1u));
        }
        case 20u: { // IQ4_NL: d, 16 bytes of table indices
            let b = row + (i / 32u) * 18u;
            return f16_at(b) * f32(KV_IQ4NL[nibble_at(b + 2u, i % 32u)]);
        }
        case 23u: { // IQ4_XS: d, scales_h, 4 bytes of scales_l, 128 bytes of table indices
            let b = row + (i / 256u) * 136u;
            let r = i % 256u;
            let ib = r / 32u;
            let ls = ((byte_at(b + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0xfu) | (((u16_at(b + 2u) >> (2u * ib)) & 3u) << 4u);
            let dl = f16_at(b) * f32(i32(ls) - 32);
            return dl * f32(KV_IQ4NL[nibble_at(b + 8u + 16u * ib, r % 32u)]);
        }
        case 39u: { // MXFP4: an E8M0 exponent, 16 bytes of E2M1 codes (17-byte blocks: any offset)
            let b = row + (i / 32u) * 17u;
            let e = byte_at(b);
            // GGML_E8M0_TO_FP32_HALF: 2^(e - 128), the two smallest as subnormals.
            let d = bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
            return f32(KV_MXFP4[nibble_at(b + 1u, i % 32u)]) * d;
        }
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
            return f16_at(b) * (f32(nibble_at(b + 2u, i % 32u)) - 8.0);
        }
        case 3u: { // Q4_1: d, m, 16 bytes of nibbles
            let b = row + (i / 32u) * 20u;
            return f16_at(b) * f32(nibble_at(b + 4u, i % 32u)) + f16_at(b + 2u);
        }
        case 6u: { // Q5_0: d, qh (32 high bits), 16 bytes of nibbles
            let b = row + (i / 32u) * 22u;
            let j = i % 32u;
            let qh = u16_at(b + 2u) | (u16_at(b + 4u) << 16u);
            let q = nibble_at(b + 6u, j) | (((qh >> j) & 1u) << 4u);
            return f16_at(b) * (f32(q) - 16.0);
        }
        case 7u: { // Q5_1: d, m, qh, 16 bytes of nibbles
            let b = row + (i / 32u) * 24u;
            let j = i % 32u;
            let qh = u16_at(b + 4u) | (u16_at(b + 6u) << 16u);
            let q = nibble_at(b + 8u, j) | (((qh >> j) & 1u) << 4u);
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


// The dot product of values 32c .. 32c + 31 of the row starting at byte `row` with x[xs ..]:
// every block type's blocks (or sub-blocks, for the K types) are whole chunks of 32, so each
// chunk's scales are read once and its quants a word (four values, or eight nibbles) at a time.
// Dequantizing and multiplying in one pass keeps every value in a register (an array of 32 is
// memory on a software driver). The float types stop at the row's end.
fn chunk_dot(row: u32, c: u32, xs: Xs) -> Acc {
    switch TY {
        case 2u, 3u: { // Q4_0 (d, nibbles - 8), Q4_1 (d, m, nibbles)
            let q4_1 = TY == 3u;
            let b = row + c * select(18u, 20u, q4_1);
            let qs = b + select(2u, 4u, q4_1);
            var s = Acc();
            var sx = Acc();
            for (var j = 0u; j < 16u; j += 4u) {
                let q = word_at(qs + j);
                for (var k = 0u; k < 4u; k++) {
                    let x0 = xv(xs, j + k);
                    let x1 = xv(xs, j + k + 16u);
                    s += f32((q >> (8u * k)) & 0xfu) * x0 + f32((q >> (8u * k + 4u)) & 0xfu) * x1;
                    sx += x0 + x1;
                }
            }
            let dm = word_at(b);
            let d = f16_to_f32(dm & 0xffffu);
            return d * s + select(-8.0 * d, f16_to_f32(dm >> 16u), q4_1) * sx;
        }
        case 6u, 7u: { // Q5_0 (d, qh, nibbles; - 16), Q5_1 (d, m, qh, nibbles)
            let q5_1 = TY == 7u;
            let b = row + c * select(22u, 24u, q5_1);
            let qh = word_at(b + select(2u, 4u, q5_1));
            let qs = b + select(6u, 8u, q5_1);
            var s = Acc();
            var sx = Acc();
            for (var j = 0u; j < 16u; j += 4u) {
                let q = word_at(qs + j);
                for (var k = 0u; k < 4u; k++) {
                    let lo = ((q >> (8u * k)) & 0xfu) | (((qh >> (j + k)) & 1u) << 4u);
                    let hi = ((q >> (8u * k + 4u)) & 0xfu) | (((qh >> (j + k + 16u)) & 1u) << 4u);
                    let x0 = xv(xs, j + k);
                    let x1 = xv(xs, j + k + 16u);
                    s += f32(lo) * x0 + f32(hi) * x1;
                    sx += x0 + x1;
                }
            }
            let dm = word_at(b);
            let d = f16_to_f32(dm & 0xffffu);
            return d * s + select(-16.0 * d, f16_to_f32(dm >> 16u), q5_1) * sx;
        }
        case 8u: { // Q8_0
            let b = row + c * 34u;
            var s = Acc();
            for (var j = 0u; j < 32u; j += 4u) {
                let q = word_at(b + 2u + j);
                for (var k = 0u; k < 4u; k++) {
                    s += i8_in(q, k) * xv(xs, j + k);
                }
            }
            return f16_at(b) * s;
        }
        case 12u, 13u: { // Q4_K, Q5_K: sub-block c % 8 of super-block c / 8
            let q5 = TY == 13u;
            let b = row + (c / 8u) * select(144u, 176u, q5);
            let sub = c % 8u;
            let q0 = b + select(16u, 48u, q5) + (sub / 2u) * 32u;
            let shift = 4u * (sub % 2u);
            var s = Acc();
            var sx = Acc();
            for (var l = 0u; l < 32u; l += 4u) {
                let q = word_at(q0 + l) >> shift;
                var h = 0u;
                if (q5) {
                    h = word_at(b + 16u + l) >> sub;
                }
                for (var k = 0u; k < 4u; k++) {
                    let xv = xv(xs, l + k);
                    s += f32(((q >> (8u * k)) & 0xfu) | (((h >> (8u * k)) & 1u) << 4u)) * xv;
                    sx += xv;
                }
            }
            let sm = scale_min_k4(b + 4u, sub);
            let dm = word_at(b);
            return f16_to_f32(dm & 0xffffu) * sm.x * s - f16_to_f32(dm >> 16u) * sm.y * sx;
        }
        case 14u: { // Q6_K: two 16-value scales per chunk
            let b = row + (c / 8u) * 210u;
            let n = (c % 8u) / 4u;
            let quarter = c % 4u;
            let lo0 = b + n * 64u + (quarter & 1u) * 32u;
            let lo_shift = 4u * (quarter / 2u);
            let hi0 = b + 128u + n * 32u;
            var s0 = Acc();
            var s1 = Acc();
            for (var l = 0u; l < 32u; l += 4u) {
                let ql = word_at(lo0 + l) >> lo_shift;
                let qh = word_at(hi0 + l) >> (2u * quarter);
                var s = Acc();
                for (var k = 0u; k < 4u; k++) {
                    let q = ((ql >> (8u * k)) & 0xfu) | (((qh >> (8u * k)) & 3u) << 4u);
                    s += (f32(q) - 32.0) * xv(xs, l + k);
                }
                if (l < 16u) {
                    s0 += s;
                } else {
                    s1 += s;
                }
            }
            let sc = b + 192u + n * 8u + 2u * quarter;
            return f16_at(b + 208u) * (i8_of(byte_at(sc)) * s0 + i8_of(byte_at(sc + 1u)) * s1);
        }
        default: { // F32, F16, BF16, and the types read value by value (Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4)
            let i0 = c * 32u;
            var s = Acc();
            for (var j = 0u; j < 32u && i0 + j < p.n_in; j++) {
                s += value(row, i0 + j) * xv(xs, j);
            }
            return s;
        }
    }
}

// The product for adapters whose invocations are a CPU's SIMD lanes (a software driver): one
// invocation per weight row, every invocation walking the same chunk of the same tokens at
// once, so the activations are read at one address by all lanes, and each chunk is
// dequantized once for TOKENS tokens. No workgroup memory, no barriers.
@compute @workgroup_size(64)
fn mul_mat_rows(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = (wid.x + wid.y * nwg.x) * 64u + li;
    if (o >= p.rows) {
        return;
    }
    let row = o * p.row_bytes;
    let n_chunks = (p.n_in + 31u) / 32u;
    var add = 0.0;
    if (p.has_bias == 1u) {
        add = bias[p.row0 + o];
    }
    for (var t0 = 0u; t0 < p.n_tokens; t0 += TOKENS) {
        var s = Acc();
        for (var c = 0u; c < n_chunks; c++) {
            s += chunk_dot(row, c, chunk_x(t0, c));
        }
        store(t0, p.row0 + o, s, add);
    }
}

const TM: u32 = 64u; // weight rows per tile
const TN: u32 = 64u; // tokens per tile
const TK: u32 = 32u; // values per tile row
var<workgroup> w_tile: array<f32, 2048>; // [TM][TK]
var<workgroup> x_tile: array<f32, 2048>; // [TN][TK]

@compute @workgroup_size(256)
fn mul_mm(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let o0 = wid.x * TM;
    let t0 = wid.y * TN;
    let tr = li / 16u; // this invocation's rows: o0 + 4 tr ..
    let tc = li % 16u; // and tokens: t0 + 4 tc ..
    var acc: array<f32, 16>;
    for (var k0 = 0u; k0 < p.n_in; k0 += TK) {
        for (var e = li; e < TM * TK; e += 256u) {
            let o = o0 + e / TK;
            let i = k0 + e % TK;
            var v = 0.0;
            if (o < p.rows && i < p.n_in) {
                v = value(o * p.row_bytes, i);
            }
            w_tile[e] = v;
        }
        for (var e = li; e < TN * TK; e += 256u) {
            let t = t0 + e / TK;
            let i = k0 + e % TK;
            var v = 0.0;
            if (t < p.n_tokens && i < p.n_in) {
                v = x[t * p.n_in + i];
            }
            x_tile[e] = v;
        }
        workgroupBarrier();
        for (var k = 0u; k < TK; k++) {
            var a: array<f32, 4>;
            var b: array<f32, 4>;
            for (var r = 0u; r < 4u; r++) {
                a[r] = w_tile[(tr * 4u + r) * TK + k];
                b[r] = x_tile[(tc * 4u + r) * TK + k];
            }
            for (var r = 0u; r < 4u; r++) {
                for (var q = 0u; q < 4u; q++) {
                    acc[r * 4u + q] += a[r] * b[q];
                }
            }
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < 4u; r++) {
        let o = o0 + tr * 4u + r;
        if (o >= p.rows) {
            continue;
        }
        var add = 0.0;
        if (p.has_bias == 1u) {
            add = bias[p.row0 + o];
        }
        for (var q = 0u; q < 4u; q++) {
            let t = t0 + tc * 4u + q;
            if (t < p.n_tokens) {
                out[t * p.n_out + p.row0 + o] = acc[r * 4u + q] + add;
            }
        }
    }
}

@compute @workgroup_size(32)
fn get_rows(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    // Every entry point shares one binding layout: name `bias` so that the layout keeps it.
    _ = &bias;
    let t = wid.x;
    if (t >= p.n_tokens) {
        return;
    }
    // Each part writes the rows it holds; an id outside the table was refused on the host.
    let id = bitcast<u32>(x[t]);
    if (id < p.row0 || id >= p.row0 + p.rows) {
        return;
    }
    let row = (id - p.row0) * p.row_bytes;
    for (var i = lid.x; i < p.n_in; i += 32u) {
        out[t * p.n_in + i] = value(row, i);
    }
}
