// Element-wise ops over n f32 values: 0 add, 1 mul, 2 silu (of a), 3 swiglu (silu(a) * b),
// 4 scale (a times the f32 whose bits are `scale`). The same formulas as the CPU's kernels
// (`silu(x) = x / (1 + e^-x)`).
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
        default: { r = x / (1.0 + exp(-x)) * b[i]; }
    }
    out[i] = r;
}
