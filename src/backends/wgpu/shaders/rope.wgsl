// RoPE as the CPU's kernel computes it: pair i of each head turns by freq_scale * (theta_i /
// ff[i]) with theta_i = p * s^i, s = freq_base^(-2 / n_rot) computed on the host (its f32 bits
// passed in) and the powers taken by repeated f32 multiplication, as ggml's rope cache does.
// `ff` holds Llama 3.1's frequency factors when `has_ff` is 1 (else it is any buffer, unread,
// and the divisor is 1). Dimensions from n_rot on are copied. One workgroup a token; `neox`
// pairs (i, i + n_rot / 2), else (2i, 2i + 1).
struct Params {
    n_head: u32,
    head_dim: u32,
    n_rot: u32,
    theta_scale: u32,
    neox: u32,
    n_tokens: u32,
    freq_scale: u32,
    has_ff: u32,
    // Multiplies cos and sin (f32 bits).
    attn_factor: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> positions: array<i32>;
@group(0) @binding(2) var<storage, read> ff: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = wid.x;
    if (t >= p.n_tokens) {
        return;
    }
    let row = t * p.n_head * p.head_dim;
    let pos = f32(positions[t]);
    let scale = bitcast<f32>(p.theta_scale);
    let half = p.n_rot / 2u;
    // Each invocation takes (head, pair) items, then the pass-through dimensions.
    for (var item = lid.x; item < p.n_head * half; item += 64u) {
        let head = item / half;
        let i = item % half;
        var theta_base = pos;
        for (var k = 0u; k < i; k++) {
            theta_base = theta_base * scale;
        }
        var factor = 1.0;
        if (p.has_ff == 1u) {
            factor = ff[i];
        }
        let theta = bitcast<f32>(p.freq_scale) * (theta_base / factor);
        var i0 = 2u * i;
        var off = 1u;
        if (p.neox == 1u) {
            i0 = i;
            off = half;
        }
        let base = row + head * p.head_dim;
        let x0 = x[base + i0];
        let x1 = x[base + i0 + off];
        let c = cos(theta) * bitcast<f32>(p.attn_factor);
        let s = sin(theta) * bitcast<f32>(p.attn_factor);
        out[base + i0] = x0 * c - x1 * s;
        out[base + i0 + off] = x0 * s + x1 * c;
    }
    let rest = p.head_dim - p.n_rot;
    for (var item = lid.x; item < p.n_head * rest; item += 64u) {
        let at = row + (item / rest) * p.head_dim + p.n_rot + item % rest;
        out[at] = x[at];
    }
}
