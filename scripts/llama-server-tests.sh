#!/usr/bin/env bash
# llama.cpp's own server tests (tools/server/tests/unit, pytest) against `minfer serve`.
#
#   scripts/llama-server-tests.sh [PYTEST ARGS...]     # default: the files listed in FILES
#   LLAMA_CPP=/path/to/llama.cpp scripts/llama-server-tests.sh unit/test_tokenize.py -x
#
# The suite starts `llama-server` with llama.cpp's flags and downloads its models; here it
# starts tests/server/llama_cpp/llama-server instead, which runs `minfer serve` with local
# models standing in for the suite's (see that file). The suite's own files are used unchanged,
# from its own directory, with tests/server/llama_cpp/minfer_llama_server_plugin.py in place of
# its conftest (which would download every model first). Needs a release build
# (cargo build --release --bin minfer; MINFER_BIN to use another) and pytest, requests, openai,
# wget and prometheus-client in the Python environment ($PYTHON, default .venv/bin/python).
#
# Pass and fail per file: run the files one at a time, e.g.
#   for f in basic tokenize completion chat_completion; do
#       scripts/llama-server-tests.sh unit/test_$f.py -q -m "not slow" | tail -1; done
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
llama_cpp=${LLAMA_CPP:-/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp}
tests="$llama_cpp/tools/server/tests"
[ -f "$tests/utils.py" ] || { echo "no llama.cpp server tests at $tests (set LLAMA_CPP)" >&2; exit 2; }
python=${PYTHON:-$here/.venv/bin/python}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$here/target}
export MINFER_BIN=${MINFER_BIN:-$CARGO_TARGET_DIR/release/minfer}
[ -x "$MINFER_BIN" ] || { echo "no minfer binary at $MINFER_BIN: cargo build --release --bin minfer" >&2; exit 2; }
export LLAMA_SERVER_BIN_PATH="$here/tests/server/llama_cpp/llama-server"
export PYTHONPATH="$here/tests/server/llama_cpp:$tests${PYTHONPATH:+:$PYTHONPATH}"
# Ports well away from a server someone may be running on 8080.
export PORT=${PORT:-18080}
FILES=(unit/test_basic.py unit/test_tokenize.py unit/test_completion.py unit/test_chat_completion.py
       unit/test_infill.py unit/test_slot_save.py unit/test_metrics.py unit/test_ignore_eos.py
       unit/test_stream.py unit/test_template.py unit/test_ctx_shift.py unit/test_security.py)
# As the suite's own tests.sh: every listed file, without the slow tests (SLOW_TESTS=1: with).
if [ $# -eq 0 ]; then
    set -- "${FILES[@]}"
    [ "${SLOW_TESTS:-0}" = 1 ] || set -- "$@" -m "not slow"
fi
cd "$tests"
exec "$python" -m pytest --noconftest -p minfer_llama_server_plugin -p no:cacheprovider "$@"
