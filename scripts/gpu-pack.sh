#!/usr/bin/env bash
# Packs the CUDA checks for a machine with an NVIDIA GPU and no Rust toolchain: builds the
# release binary and the test binaries here, strips them, and puts them beside
# scripts/gpu-check.sh in .gpu/ (git-ignored through .git/info/exclude) with the fixtures they
# read: the two F32 tiny models (the check quantizes the other 20 there, with minfer's quantizer,
# byte-identical to llama-quantize) and llama.cpp's reference logits, compressed. Under 64 MiB.
#
# Usage: scripts/gpu-pack.sh  → then run `bash .gpu/gpu-check.sh` on the GPU machine, carrying .gpu
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu
rm -rf "${out}" && mkdir -p "${out}"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
cargo build --release >&2
cp target/release/minfer "${out}/minfer"
# The test binaries, by the name of their target (cargo prints each executable's path).
cargo test --release --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, shutil, sys
wanted = {"minfer": "lib_tests", "backend_ops": "backend_ops", "tiny_models": "tiny_models"}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    if t["name"] in wanted and ("lib" in t["kind"] or "test" in t["kind"]):
        shutil.copy(m["executable"], sys.argv[1] + "/" + wanted[t["name"]])
' "${out}"
strip "${out}"/* 2>/dev/null || true
tar czf "${out}/fixtures.tar.gz" -C tests/fixtures models/tiny-qwen2-F32.gguf models/tiny-qwen3-F32.gguf tiny-reference
cp scripts/gpu-check.sh "${out}/"
du -sh "${out}"/* >&2
