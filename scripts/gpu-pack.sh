#!/usr/bin/env bash
# Packs the CUDA checks for a machine with an NVIDIA GPU and no Rust toolchain: builds the
# release binary and the test binaries here, strips them, and puts them beside
# scripts/gpu-check.sh in .gpu/ (git-ignored through .git/info/exclude) with the fixtures they
# read for one architecture: its F32 tiny model (the check quantizes the other ten types there,
# with minfer's quantizer, byte-identical to llama-quantize) and llama.cpp's reference logits,
# compressed, and the test of a random model with the default model's real shape (with qwen2).
# One architecture keeps the folder under 64 MiB: run the pair once for qwen2 and once for qwen3.
#
# A model for a speed figure may come along (a constant-weight twin of the default model, a few
# MB gzipped: `.gguf` or `.gguf.gz`); the check then benches it on the GPU.
#
# Usage: scripts/gpu-pack.sh [qwen2|qwen3] [MODEL]  → then `bash .gpu/gpu-check.sh` on the GPU machine,
# carrying .gpu (and moving tests/fixtures out of the tree for that call: tracked files travel too)
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${1:-qwen2}"
out=.gpu
rm -rf "${out}" && mkdir -p "${out}"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
cargo build --release >&2
cp target/release/minfer "${out}/minfer"
# The test binaries, by the name of their target (cargo prints each executable's path).
cargo test --release --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, shutil, sys
wanted = {"minfer": "lib_tests", "backend_ops": "backend_ops", "tiny_models": "tiny_models",
          "real_shape_model": "real_shape_model"}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    if t["name"] in wanted and ("lib" in t["kind"] or "test" in t["kind"]):
        shutil.copy(m["executable"], sys.argv[1] + "/" + wanted[t["name"]])
' "${out}"
strip "${out}"/* 2>/dev/null || true
# Compressed: the binaries travel in a third of their size.
(cd "${out}" && tar czf bin.tar.gz minfer lib_tests backend_ops tiny_models real_shape_model &&
    rm minfer lib_tests backend_ops tiny_models real_shape_model)
(cd tests/fixtures && tar czf "../../${out}/fixtures.tar.gz" "models/tiny-${arch}-F32.gguf" \
    tiny-reference/prompts.json tiny-reference/tiny-"${arch}"-*)
echo "${arch}" > "${out}/arch"
if [[ -n "${2:-}" ]]; then
    case "$2" in
        *.gz) cp "$2" "${out}/bench.gguf.gz" ;;
        *) gzip -1 -c "$2" > "${out}/bench.gguf.gz" ;;
    esac
fi
cp scripts/gpu-check.sh "${out}/"
du -sh "${out}"/* >&2
