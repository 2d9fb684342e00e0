// The activation kernels of the qwen2 and qwen3 graphs: RMSNorm (whole rows and per head),
// RoPE, the element-wise ops, row selection, the KV store and GQA attention over an f32, f16 or q8_0
// KV cache. Each follows the CPU backend's kernel (which follows ggml) in its order of float
// operations where that order is cheap to keep.

// out[r, :] = (x[r, :] * 1/sqrt(mean(x[r, :]^2) + eps)) * w — one block a row of `d` values;
// `w` may be null (no weight). Per-head norms are rows of `head_dim`.
extern "C" __global__ void rms_norm(const float* x, const float* w, int d, float eps, float* out) {
    __shared__ double scratch[32];
    const float* xr = x + (i64)blockIdx.x * d;
    float* o = out + (i64)blockIdx.x * d;
    // Squares in f32, summed in f64, as the CPU kernel (and ggml) sum them.
    double sum = 0.0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) sum += (double)(xr[j] * xr[j]);
    sum = block_sum(sum, scratch);
    const float mean = (float)(sum / (double)d);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float v = xr[j] * scale;
        o[j] = w ? v * w[j] : v;
    }
}

// In-place rotation of `n_head` heads of `head_dim` per token; the first `n_rot` dimensions
// of a head turn, the rest stay. Pair i turns by freq_scale * (theta_i / ff[i]) with theta_i =
// p * theta_scale^i, the power built by repeated multiplication as ggml's rope cache does; `ff`
// (Llama 3.1's frequency factors) may be null, which divides by 1; cos and sin are multiplied by
// attn_factor (LongRoPE's magnitude factor, 1 for most models). `neox`: dimension i pairs
// with i + n_rot/2; otherwise 2i pairs with 2i + 1. One thread a pair; grid.x over tokens * heads.
extern "C" __global__ void rope(float* x, const int* positions, int n_head, int head_dim, int n_rot,
                                float theta_scale, int neox, const float* ff, float freq_scale,
                                float attn_factor) {
    const int token = blockIdx.x / n_head;
    const int head = blockIdx.x % n_head;
    float* h = x + ((i64)token * n_head + head) * head_dim;
    const float p = (float)positions[token];
    for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x) {
        float theta_base = p;
        for (int k = 0; k < i; k++) theta_base *= theta_scale;
        const float theta = freq_scale * (theta_base / (ff ? ff[i] : 1.0f));
        const float s = sinf(theta) * attn_factor;
        const float c = cosf(theta) * attn_factor;
        const int i0 = neox ? i : 2 * i;
        const int i1 = neox ? i + n_rot / 2 : 2 * i + 1;
        const float x0 = h[i0];
        const float x1 = h[i1];
        h[i0] = x0 * c - x1 * s;
        h[i1] = x0 * s + x1 * c;
    }
}

// op 0: a + b; 1: a * b; 2: silu(a) * b; 3: silu(a) (b unused); 4: a * s (b unused); 5: gelu(a)
// 6: s * tanh(a / s) (a soft-cap of s)
// as ggml's CPU computes it (x rounded to f16, the tanh approximation's result rounded to f16;
// 0 at or below -10, x at or above 10). silu(x) = x / (1 + exp(-x)).
extern "C" __global__ void elementwise(const float* a, const float* b, float* out, i64 n, int op, float s) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const float x = a[i];
        float r;
        switch (op) {
        case 0: r = x + b[i]; break;
        case 1: r = x * b[i]; break;
        case 2: r = (x / (1.0f + expf(-x))) * b[i]; break;
        case 4: r = x * s; break;
        case 6: r = tanhf(x * (1.0f / s)) * s; break;
        case 5: {
            if (x <= -10.0f) r = 0.0f;
            else if (x >= 10.0f) r = x;
            else {
                const float h = f16_to_f32(f32_to_f16(x));
                r = f16_to_f32(f32_to_f16(0.5f * h * (1.0f + tanhf(0.79788456080286535587989211986876f * h * (1.0f + 0.044715f * h * h)))));
            }
            break;
        }
        default: r = x / (1.0f + expf(-x)); break;
        }
        out[i] = r;
    }
}

// out[i, :] = x[ids[i], :] for rows of `d` values; an id outside `n_rows` raises
// MINFER_ERR_ROW_ID. One block a selected row.
extern "C" __global__ void get_rows_act(const float* x, const int* ids, int d, int n_rows, float* out,
                                        u32* error) {
    const int id = ids[blockIdx.x];
    float* o = out + (i64)blockIdx.x * d;
    if (id < 0 || id >= n_rows) {
        if (threadIdx.x == 0) atomicOr(error, MINFER_ERR_ROW_ID);
        for (int j = threadIdx.x; j < d; j += blockDim.x) o[j] = 0.0f;
        return;
    }
    for (int j = threadIdx.x; j < d; j += blockDim.x) o[j] = x[(i64)id * d + j];
}

// How a KV region stores its values (`kv_type`).
#define KV_F32 0
#define KV_F16 1
#define KV_Q8_0 2

// One block of 32 values as ggml's `quantize_row_q8_0_ref`: d = max|x| / 127 (stored as f16),
// q = roundf(x / d).
__device__ __forceinline__ void store_q8_0(const float* x, u8* block) {
    float amax = 0.0f;
    for (int l = 0; l < 32; l++) amax = fmaxf(amax, fabsf(x[l]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const u16 dh = f32_to_f16(d);
    block[0] = (u8)(dh & 0xFF);
    block[1] = (u8)(dh >> 8);
    for (int l = 0; l < 32; l++) ((i8*)(block + 2))[l] = (i8)roundf(x[l] * id);
}

// One row of `width` values into a region of `kv_type` from value `at` (this block's threads).
__device__ __forceinline__ void store_row(const float* x, int width, i64 at, int kv_type, void* region) {
    if (kv_type == KV_Q8_0) {
        for (int b = threadIdx.x; b < width / 32; b += blockDim.x) {
            store_q8_0(x + 32 * b, (u8*)region + (at / 32 + b) * 34);
        }
        return;
    }
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        if (kv_type == KV_F16) {
            ((u16*)region)[at + j] = f32_to_f16(x[j]);
        } else {
            ((float*)region)[at + j] = x[j];
        }
    }
}

// Writes token t's K and V rows (`width` f32 values each) into cell cells[t] of the layer's
// regions of `n_ctx` cells, stored as `k_type` and `v_type` (q8_0: `width` is a multiple of 32,
// one thread a block). A cell outside the regions raises MINFER_ERR_KV_CELL. One block a token.
extern "C" __global__ void kv_store(const float* k, const float* v, const int* cells, int width, int n_ctx,
                                    int k_type, int v_type, void* k_region, void* v_region, u32* error) {
    const int t = blockIdx.x;
    const int cell = cells[t];
    if (cell < 0 || cell >= n_ctx) {
        if (threadIdx.x == 0) atomicOr(error, MINFER_ERR_KV_CELL);
        return;
    }
    const i64 at = (i64)cell * width;
    const float* kr = k + (i64)t * width;
    const float* vr = v + (i64)t * width;
    store_row(kr, width, at, k_type, k_region);
    store_row(vr, width, at, v_type, v_region);
}

__device__ __forceinline__ float kv_value(const void* region, int kv_type, i64 at) {
    if (kv_type == KV_F16) return f16_to_f32(((const u16*)region)[at]);
    if (kv_type == KV_Q8_0) {
        const u8* block = (const u8*)region + (at / 32) * 34;
        return f16_to_f32(load_u16(block)) * (float)((const i8*)(block + 2))[at % 32];
    }
    return ((const float*)region)[at];
}

// Cells one pass of `attention` scores together, one a thread.
#define ATTN_TILE 128
// The widest head `attention` takes: two dimensions a thread.
#define ATTN_MAX_HEAD_DIM 256

// out[t, h, :] = softmax_c(q[t, h, :] . k[c, h / g, :] * scale) . v[c, h / g, :] over
// the cells token t sees: 0..=positions[t], or (`kv_index` non-null) the kv_span[2t + 1] cells
// listed in kv_index (n_index entries) from kv_span[2t]. One block of ATTN_TILE threads per (head, token); the
// softmax is online over tiles of cells (rescaling when a tile raises the maximum), as the
// CPU kernel does per block of cells.
extern "C" __global__ void attention(const float* q, const void* k_region, const void* v_region, int k_type,
                                     int v_type,
                                     const int* positions, const int* kv_index, int n_index, const int* kv_span,
                                     int n_head, int n_head_kv, int head_dim, int n_ctx, float* out, u32* error,
                                     float scale, int n_swa, float softcap) {
    // A soft-cap (Gemma 2): s = cap * tanh(q.k * (scale / cap)), as ggml's flash attention.
    if (softcap != 0.0f) scale /= softcap;
    __shared__ float q_s[ATTN_MAX_HEAD_DIM];
    __shared__ float p_s[ATTN_TILE];
    __shared__ int cell_s[ATTN_TILE];
    __shared__ float scratch[32];
    const int head = blockIdx.x;
    const int t = blockIdx.y;
    const int kv_head = head / (n_head / n_head_kv);
    const int stride = n_head_kv * head_dim;
    const float* qh = q + ((i64)t * n_head + head) * head_dim;
    for (int j = threadIdx.x; j < head_dim; j += blockDim.x) q_s[j] = qh[j];

    int first = 0;
    int count;
    if (kv_index) {
        first = kv_span[2 * t];
        count = kv_span[2 * t + 1];
    } else {
        count = positions[t] + 1;
    }
    // A span outside the index list (or a prefix past the cache) is refused, never read.
    if (count < 0 || (!kv_index && (count < 1 || count > n_ctx)) || (kv_index && (first < 0 || first > n_index - count))) {
        if (threadIdx.x == 0) atomicOr(error, MINFER_ERR_KV_SPAN);
        count = 0;
    }
    // A sliding window: the last n_swa cells only.
    if (n_swa > 0 && count > n_swa) {
        first += count - n_swa;
        count = n_swa;
    }

    float acc0 = 0.0f;
    float acc1 = 0.0f;
    float max = NEG_INF;
    float sum = 0.0f;
    __syncthreads();
    for (int base = 0; base < count; base += ATTN_TILE) {
        const int n = min(ATTN_TILE, count - base);
        float s = NEG_INF;
        if ((int)threadIdx.x < n) {
            int cell = kv_index ? kv_index[first + base + threadIdx.x] : first + base + threadIdx.x;
            if (cell < 0 || cell >= n_ctx) {
                atomicOr(error, MINFER_ERR_KV_SPAN);
                cell = -1;
            } else {
                const i64 at = (i64)cell * stride + (i64)kv_head * head_dim;
                float dot = 0.0f;
                for (int j = 0; j < head_dim; j++) dot += q_s[j] * kv_value(k_region, k_type, at + j);
                s = dot * scale;
                if (softcap != 0.0f) s = softcap * tanhf(s);
            }
            cell_s[threadIdx.x] = cell;
        }
        const float tile_max = block_max(s, scratch);
        const float new_max = fmaxf(max, tile_max);
        // Nothing is accumulated while the maximum is still -inf.
        const float rescale = max == NEG_INF ? 0.0f : expf(max - new_max);
        const float p = ((int)threadIdx.x < n && s != NEG_INF) ? expf(s - new_max) : 0.0f;
        if ((int)threadIdx.x < ATTN_TILE) p_s[threadIdx.x] = p;
        const float tile_sum = block_sum(p, scratch);
        sum = sum * rescale + tile_sum;
        acc0 *= rescale;
        acc1 *= rescale;
        max = new_max;
        __syncthreads();
        for (int c = 0; c < n; c++) {
            const int cell = cell_s[c];
            if (cell < 0) continue;
            const i64 at = (i64)cell * stride + (i64)kv_head * head_dim;
            const float pc = p_s[c];
            const int j0 = threadIdx.x;
            const int j1 = threadIdx.x + blockDim.x;
            if (j0 < head_dim) acc0 += pc * kv_value(v_region, v_type, at + j0);
            if (j1 < head_dim) acc1 += pc * kv_value(v_region, v_type, at + j1);
        }
        __syncthreads();
    }
    float* o = out + ((i64)t * n_head + head) * head_dim;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int j0 = threadIdx.x;
    const int j1 = threadIdx.x + blockDim.x;
    if (j0 < head_dim) o[j0] = acc0 * inv;
    if (j1 < head_dim) o[j1] = acc1 * inv;
}
