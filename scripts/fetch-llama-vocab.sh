#!/usr/bin/env bash
# Fetch llama.cpp's own tokenizer test vectors — the `models/ggml-vocab-*.gguf` vocabularies with
# their `.inp`/`.out` pairs — and its collection of real chat templates (`models/templates/`,
# kept under `templates/`), from the llama-cpp-python 0.3.36 source package on PyPI (which
# vendors llama.cpp 0c1e570). Only those files are kept, in $MINFER_LLAMA_VOCAB (default
# ~/.cache/minfer/llama-vocab-0c1e570); the 77 MB archive is checked against its sha256 and
# deleted. A second run does nothing. Prints the directory on stdout.
set -euo pipefail

url="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz"
sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
dir="${MINFER_LLAMA_VOCAB:-$HOME/.cache/minfer/llama-vocab-0c1e570}"

if [[ -f "${dir}/.complete" && -d "${dir}/templates" ]]; then
  echo "${dir}"
  exit 0
fi
mkdir -p "${dir}"
work="$(mktemp -d "${dir}/.fetch.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
echo "fetch-llama-vocab: downloading llama-cpp-python 0.3.36 (source)" >&2
if command -v curl >/dev/null 2>&1 && [[ -z "${MINFER_FETCH_WITH_PYTHON:-}" ]]; then
  curl -sSfL --retry 3 -o "${work}/src.tar.gz" "${url}"
else
  # No curl on the machine: Python's own HTTP client (pip's Python is there for the models).
  python3 -c 'import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=300) as r, open(sys.argv[2], "wb") as f:
    shutil.copyfileobj(r, f, 1 << 20)' "${url}" "${work}/src.tar.gz"
fi
got="$(sha256sum "${work}/src.tar.gz" | cut -d' ' -f1)"
if [[ "${got}" != "${sha256}" ]]; then
  echo "fetch-llama-vocab: sha256 ${got}, expected ${sha256}" >&2
  exit 1
fi
tar -xzf "${work}/src.tar.gz" -C "${work}" --wildcards 'llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-*' \
  'llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/*'
rm -rf "${dir}/templates"
mv "${work}"/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-* "${dir}/"
mv "${work}"/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates "${dir}/templates"
touch "${dir}/.complete"
echo "fetch-llama-vocab: stored $(ls "${dir}" | wc -l) files in ${dir}" >&2
echo "${dir}"
