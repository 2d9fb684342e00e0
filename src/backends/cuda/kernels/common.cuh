// Shared by every kernel source: fixed-width types, f16/bf16 conversions, unaligned loads and
// warp reductions. NVRTC compiles each source with this text prepended, so nothing here may
// depend on a CUDA toolkit header (the NVRTC wheel ships none): conversions are PTX.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define NEG_INF __int_as_float(0xff800000)

// Rounding as the CPU backend and ggml do: exact widening, round-to-nearest-even narrowing.
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_to_f32(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}

// Quantized blocks are 18, 20, 22 or 34 bytes long, so a block's fields are only 2-byte
// aligned: read wider fields byte by byte.
__device__ __forceinline__ u16 load_u16(const u8* p) {
    return (u16)p[0] | ((u16)p[1] << 8);
}

__device__ __forceinline__ u32 load_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

// A block-wide sum for blocks of at most 1024 threads; every thread gets the total.
// `scratch` holds 32 values of shared memory.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int n_warps = (blockDim.x + 31) / 32;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : (T)0;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int n_warps = (blockDim.x + 31) / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : NEG_INF;
    return warp_max(v);
}

// Error flags a kernel raises for bad data the host could not check before the launch (ids
// and cells live on the device); the context reads them back when it synchronizes.
#define MINFER_ERR_ROW_ID 1u
#define MINFER_ERR_KV_CELL 2u
#define MINFER_ERR_KV_SPAN 4u
