#!/usr/bin/env bash
# The CUDA checks, run on a machine with an NVIDIA GPU from the folder scripts/gpu-pack.sh made:
# the device probe, the kernel tests (NVRTC compiles, the cache), the conformance test of the
# backend seam on CUDA (every op, all eleven weight types, against the CPU), and the eleven tiny
# models of the packed architecture on CUDA against llama.cpp's logits within the CPU's bounds, and
# (with qwen2) a random model of the default model's real shape on CUDA against the CPU for -ngl
# 0, 1, 12 and all, and 1,000 decode steps without a device allocation. On the host's CPU: the
# AMX tile kernels against their emulation and the scalar reference, the tiny models with and
# without AMX, and (with a model) its speed on the GPU against the device's copy bandwidth, a
# profile of decode steps with each node's kernels timed to their end, and thread scaling at 2
# to 16 threads on the CPU; and where the machine has a Vulkan driver, the wgpu backend's
# conformance, tiny models and speed. Prints one line per check and a summary, copies every check's whole
# log to $OUT when it is set, and exits non-zero when any fails.
#
# Usage: bash .gpu/gpu-check.sh [MODEL.gguf]   (a model for a speed figure; default: the one
# scripts/gpu-pack.sh packed, if any)
set -uo pipefail
cd "$(dirname "$0")"
here="$(pwd)"
export MINFER_FIXTURES="${here}/fixtures" MINFER_CUDA_CACHE="${here}/cuda-cache" MINFER_REQUIRE_NVRTC=1 MINFER_REQUIRE_CUDA=1
mkdir -p fixtures && tar xzf fixtures.tar.gz -C fixtures && tar xzf bin.tar.gz
arch="$(cat arch)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
failed=()
check() {
    local name=$1
    shift
    local start=$SECONDS
    "$@" > "log-${name}.txt" 2>&1
    local rc=$?
    echo "${name}: rc=${rc} ($((SECONDS - start)) s)"
    tail -n 15 "log-${name}.txt" | sed 's/^/    /'
    [[ ${rc} == 0 ]] || failed+=("${name}")
}
for ty in F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K; do
    ./minfer quantize --pure "fixtures/models/tiny-${arch}-F32.gguf" "fixtures/models/tiny-${arch}-${ty}.gguf" "${ty}" > /dev/null 2>&1 ||
        failed+=("quantize-${arch}-${ty}")
done
check generate ./minfer "fixtures/models/tiny-${arch}-Q8_0.gguf" "Hello" --backend cuda -n 8 --greedy --no-template
check kernels ./lib_tests --test-threads=1 backends::cuda graph::registry
check conformance ./backend_ops --test-threads=1
check tiny-models-cuda env MINFER_TEST_BACKEND=cuda ./tiny_models --test-threads=1 "tiny_${arch}_"
if [[ ${arch} == qwen2 ]]; then
    check real-shape ./real_shape_model --nocapture
fi
bench_model="${1:-}"
if [[ -z "${bench_model}" && -f bench.gguf.gz ]]; then
    gunzip -kf bench.gguf.gz && bench_model=bench.gguf
fi
# The host's CPU (a Xeon with AMX): the tile kernels on the hardware against the emulated tiles
# and the scalar reference, then the tiny models' prompts through them, and with them off.
check amx-kernels env MINFER_REQUIRE_AMX=1 ./lib_tests --test-threads=1 --nocapture quant::simd::x86::amx quant::gemm
check tiny-models-cpu env MINFER_TEST_BACKEND=cpu ./tiny_models --test-threads=1 "tiny_${arch}_"
check tiny-models-cpu-no-amx env MINFER_TEST_BACKEND=cpu MINFER_NO_AMX=1 ./tiny_models --test-threads=1 "tiny_${arch}_"
if [[ -n "${bench_model}" ]]; then
    check bench ./minfer bench "${bench_model}" -ngl 99 -p 512 -n 128 -r 5 --bandwidth
    # Each node's kernels timed to their end: one decode step's per-kernel breakdown.
    check profile ./minfer bench "${bench_model}" -ngl 99 -p 0 -n 32 -r 1 --profile
    # Thread scaling on the CPU, with the hand-off cost per node; then the prompt without AMX.
    check bench-cpu env MINFER_BACKENDS=cpu ./minfer bench "${bench_model}" -t 2,4,8,16 -p 512 -n 64 -r 2 --handoff
    check bench-cpu-no-amx env MINFER_BACKENDS=cpu MINFER_NO_AMX=1 ./minfer bench "${bench_model}" -t 4,16 -p 512 -n 0 -r 2
fi
# wgpu through the machine's Vulkan driver (NVIDIA's, where it is installed): the kernels
# against the CPU, the tiny models against llama.cpp, and the speed beside CUDA's. A machine
# with no hardware Vulkan adapter says so and is not counted as a failure.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
wgpu_line="$(./minfer info "fixtures/models/tiny-${arch}-Q8_0.gguf" 2>/dev/null | grep '^backend wgpu' || echo 'backend wgpu = not in this build')"
echo "${wgpu_line}"
if [[ ${wgpu_line} == *unusable* || ${wgpu_line} == *"software adapter"* || ${wgpu_line} == *"not in this build"* ]]; then
    echo "wgpu: no hardware Vulkan adapter here (no NVIDIA Vulkan driver?); not checked"
else
    check wgpu-conformance env MINFER_REQUIRE_WGPU=1 ./backend_ops --test-threads=1 wgpu
    check tiny-models-wgpu env MINFER_TEST_BACKEND=wgpu ./tiny_models --test-threads=1 "tiny_${arch}_"
    if [[ -n "${bench_model}" ]]; then
        check bench-wgpu ./minfer bench "${bench_model}" --backend wgpu -ngl 99 -p 512 -n 128 -r 3
    fi
fi
# The whole logs come back where the caller collects files.
[[ -n "${OUT:-}" ]] && cp log-*.txt "${OUT}/"
echo "SUMMARY: ${#failed[@]} failed${failed[*]:+: ${failed[*]}}"
[[ ${#failed[@]} == 0 ]]
