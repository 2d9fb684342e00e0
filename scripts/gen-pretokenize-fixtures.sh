#!/usr/bin/env bash
# Regenerate tests/fixtures/tokenizer/pretokenize_gpt4o.jsonl (llama.cpp's own word splits for
# the `gpt-4o` pre-tokenizer over the corpus in scripts/llama-cpp-pretokenize.cpp) and
# tests/fixtures/tokenizer/unicode_classes.txt (the class of every code point in llama.cpp's
# Unicode tables). Needs a llama.cpp source tree with its static libraries built
# (cmake -B build -DBUILD_SHARED_LIBS=OFF && cmake --build build), at $LLAMA_CPP (default: the
# one vendored in llama-cpp-python 0.3.36, commit 0c1e570, unpacked under /work/ref).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
L="${LLAMA_CPP:-/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp}"
src="${root}/scripts/llama-cpp-pretokenize.cpp"
fixtures="${root}/tests/fixtures/tokenizer"

# The harness's copy of the regex must still be the line llama.cpp uses for GPT4O.
# (It ends in `;` there and `,` in llama.cpp's list, so that last character is left out.)
regex_line="$(grep -A1 '^static const char \* GPT4O_REGEX =' "${src}" | tail -n1)"
regex_line="${regex_line%?}"
if ! grep -qF -- "${regex_line}" "${L}/src/llama-vocab.cpp"; then
  echo "gen-pretokenize-fixtures: the gpt-4o regex in ${src} is not in ${L}/src/llama-vocab.cpp" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
g++ -O2 -std=c++17 "${src}" -I"${L}/include" -I"${L}/src" -I"${L}/ggml/include" \
  "${L}/build/src/libllama.a" "${L}/build/ggml/src/libggml.a" "${L}/build/ggml/src/libggml-cpu.a" \
  "${L}/build/ggml/src/libggml-base.a" -lgomp -lpthread -o "${work}/llama-cpp-pretokenize"
"${work}/llama-cpp-pretokenize" > "${work}/pretokenize_gpt4o.jsonl"
"${work}/llama-cpp-pretokenize" classes > "${work}/unicode_classes.txt"
mv "${work}/pretokenize_gpt4o.jsonl" "${work}/unicode_classes.txt" "${fixtures}/"
echo "gen-pretokenize-fixtures: $(wc -l < "${fixtures}/pretokenize_gpt4o.jsonl") gpt-4o cases," \
  "$(wc -l < "${fixtures}/unicode_classes.txt") class runs in ${fixtures}" >&2
