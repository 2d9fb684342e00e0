// The KV cache's stored types (f32, f16, Q8_0) as u32 words: writing a token's K and V rows
// into their cells (`kv_store`), and attention over the cells each token sees (`attention`).
// Conversions as the CPU's: f16 rounded to nearest even, Q8_0 as ggml's quantize_row_q8_0_ref
// (d = amax / 127, q = roundf(x / d), halves away from zero).

struct Params {
    width: u32,      // values per cell: n_head_kv * head_dim
    n_tokens: u32,
    type_k: u32,     // GGML type ids: 0 f32, 1 f16, 8 q8_0
    type_v: u32,
    n_ctx: u32,
    n_head: u32,
    head_dim: u32,
    explicit_span: u32,
    n_index: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

fn f32_to_f16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let raw = (b >> 23u) & 0xffu;
    let m = b & 0x7fffffu;
    if (raw == 0xffu) {
        return sign | 0x7c00u | select(0u, 0x200u | (m >> 13u), m != 0u);
    }
    let e = i32(raw) - 112;
    if (e >= 31) {
        return sign | 0x7c00u;
    }
    if (e <= 0) {
        if (e < -10) {
            return sign;
        }
        let mm = m | 0x800000u;
        let shift = u32(14 - e);
        var h = mm >> shift;
        let rem = mm & ((1u << shift) - 1u);
        let halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (h & 1u) == 1u)) {
            h += 1u;
        }
        return sign | h;
    }
    var h = (u32(e) << 10u) | (m >> 13u);
    let rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) == 1u)) {
        h += 1u;
    }
    return sign | h;
}

fn round_away(v: f32) -> f32 {
    return sign(v) * floor(abs(v) + 0.5);
}

// ---- kv_store ----------------------------------------------------------------------------

@group(0) @binding(0) var<storage, read> k_in: array<f32>;
@group(0) @binding(1) var<storage, read> v_in: array<f32>;
@group(0) @binding(2) var<storage, read> cells: array<i32>;
@group(0) @binding(3) var<storage, read_write> k_region: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> v_region: array<atomic<u32>>;
@group(0) @binding(5) var<uniform> p: Params;

// Byte `off` of a region set to `value`, keeping the word's other bytes (cells next to it may
// be written by other invocations).
fn put_byte_k(off: u32, value: u32) {
    let shift = (off & 3u) * 8u;
    atomicAnd(&k_region[off >> 2u], ~(0xffu << shift));
    atomicOr(&k_region[off >> 2u], (value & 0xffu) << shift);
}

fn put_byte_v(off: u32, value: u32) {
    let shift = (off & 3u) * 8u;
    atomicAnd(&v_region[off >> 2u], ~(0xffu << shift));
    atomicOr(&v_region[off >> 2u], (value & 0xffu) << shift);
}

fn src_value(is_v: bool, i: u32) -> f32 {
    if (is_v) {
        return v_in[i];
    }
    return k_in[i];
}

fn put_word(is_v: bool, w: u32, value: u32) {
    if (is_v) {
        atomicStore(&v_region[w], value);
    } else {
        atomicStore(&k_region[w], value);
    }
}

fn put_byte(is_v: bool, off: u32, value: u32) {
    if (is_v) {
        put_byte_v(off, value);
    } else {
        put_byte_k(off, value);
    }
}

// One workgroup per (token, K or V): wid.x the token, wid.y 0 for K, 1 for V.
@compute @workgroup_size(64)
fn kv_store(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = wid.x;
    let is_v = wid.y == 1u;
    let cell_i = cells[t];
    if (t >= p.n_tokens || cell_i < 0 || u32(cell_i) >= p.n_ctx) {
        return;
    }
    let cell = u32(cell_i);
    let ty = select(p.type_k, p.type_v, is_v);
    let src = t * p.width;
    if (ty == 0u) {
        for (var i = lid.x; i < p.width; i += 64u) {
            put_word(is_v, cell * p.width + i, bitcast<u32>(src_value(is_v, src + i)));
        }
    } else if (ty == 1u) {
        // Two values a word; a cell's row starts on a word (the width is even).
        for (var i = lid.x; i < p.width / 2u; i += 64u) {
            let lo = f32_to_f16(src_value(is_v, src + 2u * i));
            let hi = f32_to_f16(src_value(is_v, src + 2u * i + 1u));
            put_word(is_v, cell * p.width / 2u + i, lo | (hi << 16u));
        }
    } else {
        // Q8_0: a block of 32 values an invocation.
        for (var blk = lid.x; blk < p.width / 32u; blk += 64u) {
            var amax = 0.0;
            for (var j = 0u; j < 32u; j++) {
                amax = max(amax, abs(src_value(is_v, src + blk * 32u + j)));
            }
            let d = amax / 127.0;
            let id = select(0.0, 1.0 / d, d != 0.0);
            let off = (cell * p.width / 32u + blk) * 34u;
            let dh = f32_to_f16(d);
            put_byte(is_v, off, dh);
            put_byte(is_v, off + 1u, dh >> 8u);
            for (var j = 0u; j < 32u; j++) {
                let q = i32(round_away(src_value(is_v, src + blk * 32u + j) * id));
                put_byte(is_v, off + 2u + j, bitcast<u32>(q));
            }
        }
    }
}
