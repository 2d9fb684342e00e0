// The eight-token variant of weights.wgsl (appended to it): `chunk_dot` multiplies eight
// tokens' activations at once, so a chunk dequantized once serves all eight. Past the last
// token the last one is read again and its sums dropped.
alias Acc = mat2x4<f32>;
struct Xs {
    t0: u32, // the first of the eight tokens
    i0: u32, // the chunk's first value
}
const TOKENS: u32 = 8u;

fn chunk_x(t0: u32, c: u32) -> Xs {
    return Xs(t0, c * 32u);
}

fn xt(xs: Xs, k: u32, i: u32) -> f32 {
    return x[min(xs.t0 + k, p.n_tokens - 1u) * p.n_in + xs.i0 + i];
}

fn xv(xs: Xs, i: u32) -> Acc {
    return Acc(
        vec4<f32>(xt(xs, 0u, i), xt(xs, 1u, i), xt(xs, 2u, i), xt(xs, 3u, i)),
        vec4<f32>(xt(xs, 4u, i), xt(xs, 5u, i), xt(xs, 6u, i), xt(xs, 7u, i)),
    );
}

fn put(t: u32, col: u32, v: f32) {
    if (t < p.n_tokens) {
        out[t * p.n_out + col] = v;
    }
}

fn store(t0: u32, col: u32, s: Acc, add: f32) {
    put(t0, col, s[0].x + add);
    put(t0 + 1u, col, s[0].y + add);
    put(t0 + 2u, col, s[0].z + add);
    put(t0 + 3u, col, s[0].w + add);
    put(t0 + 4u, col, s[1].x + add);
    put(t0 + 5u, col, s[1].y + add);
    put(t0 + 6u, col, s[1].z + add);
    put(t0 + 7u, col, s[1].w + add);
}
