// out[t, :] = src[ids[t], :] for f32 rows of d values (the tail-row reduction's gather): one
// workgroup a row. An id outside the source reads row 0 (the graph's ids are its own rows).
struct Params {
    d: u32,
    n_rows_in: u32,
    n_ids: u32,
    pad: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = wid.x;
    if (t >= p.n_ids) {
        return;
    }
    let id = ids[t];
    let r = select(0u, u32(id), id >= 0 && u32(id) < p.n_rows_in);
    for (var i = lid.x; i < p.d; i += 64u) {
        out[t * p.d + i] = src[r * p.d + i];
    }
}
