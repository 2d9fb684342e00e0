// out[t, h] = softmax_c(score(q[t, h] . k[c, h / g])) . v[c, h / g], score(x) = x * kq_scale
// (or cap * tanh(x * kq_scale / cap) with a soft-cap), over the cells (the
// last n_swa of them when the layer has a sliding window)
// token t sees: 0..=positions[t], or kv_index[spans[2t] .. spans[2t] + spans[2t + 1]]. One
// workgroup per (head, token); cells in tiles of 64, one score an invocation, the softmax kept
// online (the accumulator rescaled when a tile raises the maximum), each invocation holding up
// to 4 of the head's dimensions (heads of at most 256).
struct Params {
    width: u32,
    n_tokens: u32,
    type_k: u32,
    type_v: u32,
    n_ctx: u32,
    n_head: u32,
    head_dim: u32,
    explicit_span: u32,
    n_index: u32,
    n_head_kv: u32,
    // The scores' factor (f32 bits): 1 / sqrt(head_dim) for most models.
    kq_scale: u32,
    // Sliding window: only the last n_swa cells a token sees (0: all of them).
    n_swa: u32,
    // Logit soft-cap (f32 bits; 0: none): s = cap * tanh(q.k * (kq_scale / cap)).
    softcap: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<u32>;
@group(0) @binding(2) var<storage, read> v: array<u32>;
@group(0) @binding(3) var<storage, read> positions: array<i32>;
@group(0) @binding(4) var<storage, read> kv_index: array<i32>;
@group(0) @binding(5) var<storage, read> kv_span: array<i32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
@group(0) @binding(7) var<uniform> p: Params;

fn k_byte(off: u32) -> u32 {
    return (k[off >> 2u] >> ((off & 3u) * 8u)) & 0xffu;
}

fn v_byte(off: u32) -> u32 {
    return (v[off >> 2u] >> ((off & 3u) * 8u)) & 0xffu;
}

fn k_value(i: u32) -> f32 {
    if (p.type_k == 0u) {
        return bitcast<f32>(k[i]);
    }
    if (p.type_k == 1u) {
        return f16_to_f32((k[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu);
    }
    let b = (i / 32u) * 34u;
    let d = f16_to_f32(k_byte(b) | (k_byte(b + 1u) << 8u));
    return d * f32(bitcast<i32>(k_byte(b + 2u + i % 32u) << 24u) >> 24u);
}

fn v_value(i: u32) -> f32 {
    if (p.type_v == 0u) {
        return bitcast<f32>(v[i]);
    }
    if (p.type_v == 1u) {
        return f16_to_f32((v[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu);
    }
    let b = (i / 32u) * 34u;
    let d = f16_to_f32(v_byte(b) | (v_byte(b + 1u) << 8u));
    return d * f32(bitcast<i32>(v_byte(b + 2u + i % 32u) << 24u) >> 24u);
}

const TILE: u32 = 64u;
var<workgroup> q_s: array<f32, 256>;
var<workgroup> p_s: array<f32, 64>;
var<workgroup> cell_s: array<u32, 64>;
var<workgroup> red: array<f32, 64>;
var<workgroup> count_s: u32;
var<workgroup> first_s: u32;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let t = wid.y;
    let hd = p.head_dim;
    let kv_head = head / (p.n_head / p.n_head_kv);
    let cap = bitcast<f32>(p.softcap);
    let scale = select(bitcast<f32>(p.kq_scale), bitcast<f32>(p.kq_scale) / cap, cap != 0.0);
    for (var j = lid.x; j < hd; j += TILE) {
        q_s[j] = q[(t * p.n_head + head) * hd + j];
    }
    if (lid.x == 0u) {
        // A span outside the index list, or a prefix past the cache, attends to nothing.
        first_s = 0u;
        count_s = 0u;
        if (p.explicit_span == 1u) {
            let f = kv_span[2u * t];
            let c = kv_span[2u * t + 1u];
            if (f >= 0 && c >= 0 && u32(f) + u32(c) <= p.n_index) {
                first_s = u32(f);
                count_s = u32(c);
            }
        } else {
            count_s = u32(clamp(positions[t] + 1, 0, i32(p.n_ctx)));
        }
        if (p.n_swa > 0u && count_s > p.n_swa) {
            first_s += count_s - p.n_swa;
            count_s = p.n_swa;
        }
    }
    // Read back as uniform values: the loop below has barriers.
    let count = workgroupUniformLoad(&count_s);
    let first = workgroupUniformLoad(&first_s);
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    var m = -3.4028235e38;
    var sum = 0.0;
    workgroupBarrier();
    for (var base = 0u; base < count; base += TILE) {
        let n = min(TILE, count - base);
        var s = -3.4028235e38;
        if (lid.x < n) {
            var cell = first + base + lid.x;
            if (p.explicit_span == 1u) {
                cell = u32(max(kv_index[first + base + lid.x], 0));
            }
            cell = min(cell, p.n_ctx - 1u);
            cell_s[lid.x] = cell;
            let at = cell * p.width + kv_head * hd;
            var dot = 0.0;
            for (var j = 0u; j < hd; j++) {
                dot += q_s[j] * k_value(at + j);
            }
            s = dot * scale;
            if (cap != 0.0) {
                // tanh is +-1 in f32 beyond 9.01; the clamp keeps an exp-based tanh finite.
                s = cap * tanh(clamp(s, -10.0, 10.0));
            }
        }
        red[lid.x] = s;
        workgroupBarrier();
        for (var r = TILE / 2u; r > 0u; r >>= 1u) {
            if (lid.x < r) {
                red[lid.x] = max(red[lid.x], red[lid.x + r]);
            }
            workgroupBarrier();
        }
        let tile_max = red[0];
        workgroupBarrier();
        let new_m = max(m, tile_max);
        let rescale = exp(m - new_m);
        var w = 0.0;
        if (lid.x < n) {
            w = exp(s - new_m);
        }
        p_s[lid.x] = w;
        red[lid.x] = w;
        workgroupBarrier();
        for (var r = TILE / 2u; r > 0u; r >>= 1u) {
            if (lid.x < r) {
                red[lid.x] += red[lid.x + r];
            }
            workgroupBarrier();
        }
        sum = sum * rescale + red[0];
        for (var d = 0u; d < 4u; d++) {
            let j = lid.x + d * TILE;
            if (j < hd) {
                var a = acc[d] * rescale;
                for (var c = 0u; c < n; c++) {
                    a += p_s[c] * v_value(cell_s[c] * p.width + kv_head * hd + j);
                }
                acc[d] = a;
            }
        }
        m = new_m;
        workgroupBarrier();
    }
    for (var d = 0u; d < 4u; d++) {
        let j = lid.x + d * TILE;
        if (j < hd) {
            out[(t * p.n_head + head) * hd + j] = select(0.0, acc[d] / sum, sum > 0.0);
        }
    }
}
