// Element-wise ops over n f32 values: 0 add, 1 mul, 2 silu (of a), 3 swiglu (silu(a) * b),
// 4 scale (a times the f32 whose bits are `scale`), 5 gelu (as ggml's CPU: x rounded to f16, the
// tanh approximation's result rounded to f16; 0 at or below -10, x at or above 10). The same
// formulas as the CPU's kernels (`silu(x) = x / (1 + e^-x)`).
struct Params {
    n: u32,
    op: u32,
    row_len: u32,
    scale: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// x rounded to the nearest f16 value (ties to even), as an f32: done on the bits, since WGSL
// leaves the rounding of its own conversion to the implementation.
fn round_f16(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    let sign = bits & 0x80000000u;
    let mag = bits & 0x7fffffffu;
    let e = i32(mag >> 23u) - 127;
    if (e < -25) {
        return bitcast<f32>(sign);
    }
    // f16 keeps 10 fraction bits for normals (e >= -14); below, the step is 2^-24.
    var shift = 13u;
    if (e < -14) {
        shift = u32(13 + (-14 - e));
    }
    let mant = (mag & 0x7fffffu) | 0x800000u;
    let half = 1u << (shift - 1u);
    let rest = mant & ((1u << shift) - 1u);
    var m = mant >> shift;
    if (rest > half || (rest == half && (m & 1u) == 1u)) {
        m += 1u;
    }
    // Back to f32: m units of 2^(e - 23 + shift).
    let value = f32(m) * exp2(f32(e - 23 + i32(shift)));
    return bitcast<f32>(bitcast<u32>(value) | sign);
}

fn gelu(x: f32) -> f32 {
    if (x <= -10.0) {
        return 0.0;
    }
    if (x >= 10.0) {
        return x;
    }
    let h = round_f16(x);
    return round_f16(0.5 * h * (1.0 + tanh(0.7978846 * h * (1.0 + 0.044715 * h * h))));
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    // Dispatched as rows of `row_len` invocations: a grid's x extent is bounded.
    let i = gid.x + gid.y * p.row_len;
    if (i >= p.n) {
        return;
    }
    let x = a[i];
    var r: f32;
    switch p.op {
        case 0u: { r = x + b[i]; }
        case 1u: { r = x * b[i]; }
        case 2u: { r = x / (1.0 + exp(-x)); }
        case 4u: { r = x * bitcast<f32>(p.scale); }
        case 5u: { r = gelu(x); }
        case 6u: {
            // cap * tanh(x / cap); tanh is +-1 in f32 beyond 9.01, and the clamp keeps an
            // exp-based tanh finite.
            let cap = bitcast<f32>(p.scale);
            r = tanh(clamp(x * (1.0 / cap), -10.0, 10.0)) * cap;
        }
        default: { r = x / (1.0 + exp(-x)) * b[i]; }
    }
    out[i] = r;
}
