// Kernels that read a weight in its GGML layout: the matrix-vector / small-batch product and
// the embedding lookup, for all 11 weight types. Every type is read through `load32`, which
// dequantizes one run of 32 consecutive values (a whole block of the 32-value types, an eighth
// of a K-quant super-block), with the formulas of ggml's `dequantize_row_*`.
//
// Correct first: weights are dequantized to f32 and multiplied with f32 activations (llama.cpp's
// CUDA backend quantizes the activations to q8_1 instead; the speed work does that).

// GGML type ids, as in the GGUF file.
#define GGML_F32 0
#define GGML_F16 1
#define GGML_Q4_0 2
#define GGML_Q4_1 3
#define GGML_Q5_0 6
#define GGML_Q5_1 7
#define GGML_Q8_0 8
#define GGML_Q4_K 12
#define GGML_Q5_K 13
#define GGML_Q6_K 14
#define GGML_BF16 30

// The 6-bit scale and minimum of sub-block j of a Q4_K / Q5_K super-block (ggml's
// `get_scale_min_k4`).
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float* sc, float* m) {
    if (j < 4) {
        *sc = (float)(q[j] & 63);
        *m = (float)(q[j + 4] & 63);
    } else {
        *sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Values 32*c .. 32*c + 31 of a row of `type` into v.
__device__ __forceinline__ void load32(int type, const u8* row, int c, float* v) {
    switch (type) {
    case GGML_F32: {
        const float* r = (const float*)row + 32 * c;
        for (int l = 0; l < 32; l++) v[l] = r[l];
        break;
    }
    case GGML_F16: {
        const u16* r = (const u16*)row + 32 * c;
        for (int l = 0; l < 32; l++) v[l] = f16_to_f32(r[l]);
        break;
    }
    case GGML_BF16: {
        const u16* r = (const u16*)row + 32 * c;
        for (int l = 0; l < 32; l++) v[l] = bf16_to_f32(r[l]);
        break;
    }
    case GGML_Q4_0: {
        const u8* b = row + 18 * c;
        const float d = f16_to_f32(load_u16(b));
        const u8* qs = b + 2;
        for (int j = 0; j < 16; j++) {
            v[j] = (float)((qs[j] & 0xF) - 8) * d;
            v[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
        break;
    }
    case GGML_Q4_1: {
        const u8* b = row + 20 * c;
        const float d = f16_to_f32(load_u16(b));
        const float m = f16_to_f32(load_u16(b + 2));
        const u8* qs = b + 4;
        for (int j = 0; j < 16; j++) {
            v[j] = (float)(qs[j] & 0xF) * d + m;
            v[j + 16] = (float)(qs[j] >> 4) * d + m;
        }
        break;
    }
    case GGML_Q5_0: {
        const u8* b = row + 22 * c;
        const float d = f16_to_f32(load_u16(b));
        const u32 qh = load_u32(b + 2);
        const u8* qs = b + 6;
        for (int j = 0; j < 16; j++) {
            const int xh0 = ((qh >> j) << 4) & 0x10;
            const int xh1 = (qh >> (j + 12)) & 0x10;
            v[j] = (float)(((qs[j] & 0xF) | xh0) - 16) * d;
            v[j + 16] = (float)(((qs[j] >> 4) | xh1) - 16) * d;
        }
        break;
    }
    case GGML_Q5_1: {
        const u8* b = row + 24 * c;
        const float d = f16_to_f32(load_u16(b));
        const float m = f16_to_f32(load_u16(b + 2));
        const u32 qh = load_u32(b + 4);
        const u8* qs = b + 8;
        for (int j = 0; j < 16; j++) {
            const int xh0 = ((qh >> j) << 4) & 0x10;
            const int xh1 = (qh >> (j + 12)) & 0x10;
            v[j] = (float)((qs[j] & 0xF) | xh0) * d + m;
            v[j + 16] = (float)((qs[j] >> 4) | xh1) * d + m;
        }
        break;
    }
    case GGML_Q8_0: {
        const u8* b = row + 34 * c;
        const float d = f16_to_f32(load_u16(b));
        const i8* qs = (const i8*)(b + 2);
        for (int j = 0; j < 32; j++) v[j] = (float)qs[j] * d;
        break;
    }
    case GGML_Q4_K: {
        const u8* b = row + 144 * (c / 8);
        const int sub = c % 8;
        const float d = f16_to_f32(load_u16(b));
        const float dmin = f16_to_f32(load_u16(b + 2));
        float sc, m;
        scale_min_k4(sub, b + 4, &sc, &m);
        const float d1 = d * sc;
        const float m1 = dmin * m;
        const u8* q = b + 16 + 32 * (sub / 2);
        const int shift = (sub & 1) * 4;
        for (int l = 0; l < 32; l++) v[l] = d1 * (float)((q[l] >> shift) & 0xF) - m1;
        break;
    }
    case GGML_Q5_K: {
        const u8* b = row + 176 * (c / 8);
        const int sub = c % 8;
        const float d = f16_to_f32(load_u16(b));
        const float dmin = f16_to_f32(load_u16(b + 2));
        float sc, m;
        scale_min_k4(sub, b + 4, &sc, &m);
        const float d1 = d * sc;
        const float m1 = dmin * m;
        const u8* qh = b + 16;
        const u8* q = b + 48 + 32 * (sub / 2);
        const int shift = (sub & 1) * 4;
        for (int l = 0; l < 32; l++) {
            const int hi = ((qh[l] >> sub) & 1) << 4;
            v[l] = d1 * (float)(((q[l] >> shift) & 0xF) + hi) - m1;
        }
        break;
    }
    case GGML_Q6_K: {
        const u8* b = row + 210 * (c / 8);
        const int sub = c % 8;
        const int half = sub / 4;
        const int k = sub % 4;
        const u8* ql = b + 64 * half + 32 * (k & 1);
        const u8* qh = b + 128 + 32 * half;
        const i8* sc = (const i8*)(b + 192) + 8 * half + 2 * k;
        const float d = f16_to_f32(load_u16(b + 208));
        const int lo_shift = (k >> 1) * 4;
        for (int l = 0; l < 32; l++) {
            const int q = (((ql[l] >> lo_shift) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
            v[l] = d * (float)sc[l / 16] * (float)q;
        }
        break;
    }
    default:
        for (int l = 0; l < 32; l++) v[l] = 0.0f;
        break;
    }
}

// Tokens one block of `mul_mat` computes together: each weight run is read once for all of them.
#define MMV_TOKENS 8

// y[t, r] = x[t, :] . w[r, :] (+ bias[r]) for `n_out` rows of `row_bytes` bytes and `n_tok`
// tokens: one warp a row, a block of warps over consecutive rows, grid.y over groups of
// MMV_TOKENS tokens. `n_in` is a multiple of 32 (the host checks it).
extern "C" __global__ void mul_mat(const u8* w, int type, i64 row_bytes, int n_in, int n_out, const float* x,
                                   int n_tok, const float* bias, float* y) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int t0 = blockIdx.y * MMV_TOKENS;
    if (row >= n_out) {
        return;
    }
    const int nt = min(MMV_TOKENS, n_tok - t0);
    const u8* wr = w + (i64)row * row_bytes;
    float acc[MMV_TOKENS];
    for (int t = 0; t < MMV_TOKENS; t++) acc[t] = 0.0f;
    float v[32];
    for (int c = lane; c < n_in / 32; c += 32) {
        load32(type, wr, c, v);
        for (int t = 0; t < MMV_TOKENS; t++) {
            if (t < nt) {
                const float* xr = x + (i64)(t0 + t) * n_in + 32 * c;
                float s = 0.0f;
                for (int l = 0; l < 32; l++) s += v[l] * xr[l];
                acc[t] += s;
            }
        }
    }
    for (int t = 0; t < MMV_TOKENS; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < nt) {
            y[(i64)(t0 + t) * n_out + row] = bias ? s + bias[row] : s;
        }
    }
}

// out[i, :] = table[ids[i], :], dequantized: one block a row. An id outside the table's
// `n_rows` rows raises MINFER_ERR_ROW_ID and writes zeros.
extern "C" __global__ void get_rows_weight(const u8* table, int type, i64 row_bytes, int n_embd, int n_rows,
                                           const int* ids, float* out, u32* error) {
    const int i = blockIdx.x;
    const int id = ids[i];
    float* o = out + (i64)i * n_embd;
    if (id < 0 || id >= n_rows) {
        if (threadIdx.x == 0) atomicOr(error, MINFER_ERR_ROW_ID);
        for (int j = threadIdx.x; j < n_embd; j += blockDim.x) o[j] = 0.0f;
        return;
    }
    const u8* r = table + (i64)id * row_bytes;
    float v[32];
    for (int c = threadIdx.x; c < n_embd / 32; c += blockDim.x) {
        load32(type, r, c, v);
        for (int l = 0; l < 32; l++) o[32 * c + l] = v[l];
    }
}
