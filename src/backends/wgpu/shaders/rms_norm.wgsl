// RMS normalization of each row of d values, times a weight of d values when there is one
// (`has_weight`): one workgroup a row, the sum of squares reduced in workgroup memory.
struct Params {
    d: u32,
    n_rows: u32,
    eps: f32,
    has_weight: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.n_rows) {
        return;
    }
    let base = row * p.d;
    var s = 0.0;
    for (var i = lid.x; i < p.d; i += 256u) {
        let v = x[base + i];
        s += v * v;
    }
    partial[lid.x] = s;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (lid.x < k) {
            partial[lid.x] += partial[lid.x + k];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(partial[0] / f32(p.d) + p.eps);
    for (var i = lid.x; i < p.d; i += 256u) {
        var v = x[base + i] * scale;
        if (p.has_weight == 1u) {
            v = v * w[i];
        }
        out[base + i] = v;
    }
}
