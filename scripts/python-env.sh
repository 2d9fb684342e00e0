#!/usr/bin/env bash
# Create (idempotently) the Python virtualenv used to generate and check the
# GGUF / quantization reference fixtures and to test the HTTP server, then print the absolute path of its
# python interpreter on stdout. All other output goes to stderr.
#
# Usage: scripts/python-env.sh            -> prints e.g. /path/to/repo/.venv/bin/python
#        PY=$(scripts/python-env.sh) && "$PY" scripts/gen_quant_vectors.py
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "${script_dir}/.." && pwd)"
venv="${repo_root}/.venv"
venv_python="${venv}/bin/python"
stamp="${venv}/.minfer-requirements"

# Exact pins: the fixtures under tests/fixtures/{quant,gguf} were generated with gguf and numpy;
# the server tests (tests/server.rs, tests/server_apis.rs) drive `minfer serve` with the official openai,
# anthropic and ollama clients; pandas
# reads llama-bench's and minfer's CSV as one frame (scripts/check-bench-columns.py); the
# CUDA kernels are compiled by the NVRTC of nvidia-cuda-nvrtc (no GPU needed; the version the
# CUDA 13.0 driver machines have), see scripts/test.sh.
requirements="gguf==0.19.0
numpy==2.4.6
openai==3.57.0
jsonschema==4.26.0
pandas==3.1.1
anthropic==2.17.0
ollama==0.6.3
nvidia-cuda-nvrtc==13.0.88"

base_python="${PYTHON:-}"
if [[ -z "${base_python}" ]]; then
    for candidate in python3 python; do
        if command -v "${candidate}" >/dev/null 2>&1; then
            base_python="${candidate}"
            break
        fi
    done
fi

if [[ -x "${venv_python}" && -f "${stamp}" ]] && [[ "$(cat "${stamp}")" == "${requirements}" ]]; then
    echo "python-env: ${venv} is up to date" >&2
    echo "${venv_python}"
    exit 0
fi

if [[ ! -x "${venv_python}" ]]; then
    if [[ -z "${base_python}" ]]; then
        echo "python-env: no python3 found (set PYTHON=/path/to/python3)" >&2
        exit 1
    fi
    echo "python-env: creating virtualenv at ${venv} with ${base_python}" >&2
    "${base_python}" -m venv "${venv}" >&2
fi

echo "python-env: installing requirements into ${venv}" >&2
# shellcheck disable=SC2086
"${venv_python}" -m pip install --disable-pip-version-check --quiet ${requirements//$'\n'/ } >&2
printf '%s' "${requirements}" > "${stamp}"
echo "python-env: ready" >&2
echo "${venv_python}"
