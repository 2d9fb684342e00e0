// The one-token variant of weights.wgsl (appended to it): `chunk_dot` multiplies one token's
// activations, and the GPU's matrix-vector kernel of decode lives here.
alias Acc = f32;
alias Xs = u32; // the offset of the chunk's first activation
const TOKENS: u32 = 1u;

fn chunk_x(t: u32, c: u32) -> Xs {
    return t * p.n_in + c * 32u;
}

fn xv(xs: Xs, i: u32) -> Acc {
    return x[xs + i];
}

fn store(t: u32, col: u32, s: Acc, add: f32) {
    out[t * p.n_out + col] = s + add;
}

// out[t, o] = sum_i W[o, i] x[t, i] (+ bias[o]) on a GPU: 32 invocations reduce each row, each
// taking whole chunks, eight rows to a workgroup (a driver's cost is per workgroup, too).
const WG: u32 = 32u;   // invocations per row of the matrix-vector kernel
const ROWS: u32 = 8u;  // rows per workgroup: fewer, larger workgroups (a CPU driver's cost is per group)
var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(256)
fn mul_mat(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let lane = li % WG;
    let o = (wid.x + wid.y * nwg.x) * ROWS + li / WG;
    let t = wid.z;
    var s = 0.0;
    if (o < p.rows) {
        let row = o * p.row_bytes;
        let n_chunks = (p.n_in + 31u) / 32u;
        for (var c = lane; c < n_chunks; c += WG) {
            s += chunk_dot(row, c, chunk_x(t, c));
        }
    }
    partial[li] = s;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lane < k) {
            partial[li] += partial[li + k];
        }
        workgroupBarrier();
    }
    if (lane == 0u && o < p.rows) {
        var r = partial[li];
        if (p.has_bias == 1u) {
            r += bias[p.row0 + o];
        }
        out[t * p.n_out + p.row0 + o] = r;
    }
}

