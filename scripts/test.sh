#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script).
#
# 1. formatting and lints; 2. what the tests need that is not in the repository: the gguf-py
# virtualenv (scripts/python-env.sh), the default model, the 1.5B speculative-decoding target and
# SmolLM2-135M, the llama-architecture model, and Gemma 3 270M (scripts/fetch-model.sh, … 1.5b,
# … smollm2, … gemma3), and
# llama.cpp's tokenizer test vocabularies (scripts/fetch-llama-vocab.sh), all cached,
# Chromium for the chat page's browser test (scripts/install-chromium.sh) and NGINX for the
# replicas test (scripts/install-nginx.sh), Mesa's lavapipe for the wgpu backend's tests
# (scripts/install-lavapipe.sh), NVRTC for compiling every CUDA kernel (from the
# virtualenv's nvidia-cuda-nvrtc wheel, put on the loader path); 3. every test, unit and
# integration, including those on the 491 MB model; 4. the engine's tests for aarch64 under qemu.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check" >&2
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings" >&2
cargo clippy --all-targets -- -D warnings
# The engine alone, as a program that embeds it takes it (default-features = false): it builds
# and lints without the surfaces, and pulls no HTTP, async or terminal crate.
echo "== cargo clippy --lib --examples --no-default-features -- -D warnings" >&2
cargo clippy --lib --examples --no-default-features -- -D warnings
surface_crates="$(cargo tree -e normal -p minfer --no-default-features --prefix none |
    grep -E '^(axum|hyper|hyper-util|tokio|futures-util|rustyline|ureq|indicatif|clap) ' || true)"
if [ -n "${surface_crates}" ]; then
    echo "the engine without default features pulls surface crates:" >&2
    echo "${surface_crates}" >&2
    exit 1
fi
echo "== test dependencies" >&2
py="$(scripts/python-env.sh)"
nvrtc_lib="$("${py}" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')"
export LD_LIBRARY_PATH="${nvrtc_lib}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
export MINFER_REQUIRE_NVRTC=1
scripts/fetch-model.sh >/dev/null
scripts/fetch-model.sh 1.5b >/dev/null
scripts/fetch-model.sh smollm2 >/dev/null
scripts/fetch-model.sh gemma3 >/dev/null
scripts/fetch-llama-vocab.sh >/dev/null
scripts/install-chromium.sh >/dev/null
scripts/install-nginx.sh >/dev/null
scripts/install-lavapipe.sh >/dev/null
# The wgpu backend runs on Mesa's lavapipe here: its tests (the kernels against the CPU
# reference, their translation to Metal and HLSL, the real model, tests/wgpu.rs) must find it.
# Mesa's Vulkan drivers complain on standard error when XDG_RUNTIME_DIR is unset.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
export MINFER_REQUIRE_WGPU=1
echo "== cargo test" >&2
cargo test
# The tiny models again on wgpu, against llama.cpp's logits with the CPU's bounds (the types wgpu
# declines refused by name).
echo "== MINFER_TEST_BACKEND=wgpu cargo test --test tiny_models" >&2
MINFER_TEST_BACKEND=wgpu cargo test --test tiny_models
# ARM: the engine's in-process tests cross-compiled for aarch64 and run under qemu, on a CPU with
# dotprod and on one without (scripts/test-aarch64.sh installs what it needs).
echo "== scripts/test-aarch64.sh" >&2
scripts/test-aarch64.sh
