#!/usr/bin/env bash
# Speculative decoding side by side: the model alone and with a draft model (or prompt lookup),
# greedy, on five code-writing prompts, alternating the two runs of each prompt. Prints each
# run's generation rate and the totals. Extra arguments go to both runs (e.g. -t 2).
#
#   scripts/bench-speculative.sh MODEL DRAFT [minfer flags...]
#   SPEC="--spec-type ngram-simple" scripts/bench-speculative.sh MODEL - [flags...]
#   DRAFT_FLAGS="--draft-max 8" scripts/bench-speculative.sh MODEL DRAFT   (a settings sweep)
#   PROMPT_FILE=scripts/prompts/rewrite.txt scripts/bench-speculative.sh MODEL -   (one prompt from
#       a file: a 55-line function to repeat with one change, where prompt lookup pays)
set -euo pipefail
model=${1:?usage: scripts/bench-speculative.sh MODEL DRAFT|- [flags...]}
draft=${2:?usage: scripts/bench-speculative.sh MODEL DRAFT|- [flags...]}
shift 2
minfer=${MINFER:-target/release/minfer}
n=${N:-256}
if [ "$draft" = - ]; then spec=(${SPEC:---spec-type ngram-simple}); else spec=(-md "$draft"); fi
# shellcheck disable=SC2206
spec+=(${DRAFT_FLAGS:-})
prompts=(
  "Write a Python function that checks whether a number is prime, with a docstring."
  "Write a C function that reverses a singly linked list."
  "Write a JavaScript function that debounces another function."
  "Write a Rust function that parses a string of comma-separated integers into a Vec<i32>."
  "Write a Python class for a stack with push, pop, peek and is_empty methods."
)
if [ -n "${PROMPT_FILE:-}" ]; then prompts=("$(cat "$PROMPT_FILE")"); fi
# The timing line's generated tokens and seconds, and the drafted and accepted counts.
run() {
  local line
  line=$("$minfer" "$model" "$1" -n "$n" --greedy "${@:2}" 2>&1 >/dev/null | grep 'Generated:')
  sed -n 's/.*Generated: \([0-9]*\) tokens in \([0-9.]*\) s.*/\1 \2/p' <<<"$line"
  sed -n 's/.*Drafted: \([0-9]*\), accepted \([0-9]*\).*/D \1 \2/p' <<<"$line"
}
plain_tokens=0 plain_s=0 spec_tokens=0 spec_s=0 drafted=0 accepted=0
for p in "${prompts[@]}"; do
  read -r pt ps < <(run "$p" "$@" | grep -v '^D')
  out=$(run "$p" "$@" "${spec[@]}")
  read -r st ss < <(grep -v '^D' <<<"$out")
  read -r _ d a < <(grep '^D' <<<"$out" || echo "D 0 0")
  printf '%-60.60s plain %6.1f tok/s  speculative %6.1f tok/s  (%s/%s kept)\n' "$p" \
    "$(bc -l <<<"$pt / $ps")" "$(bc -l <<<"$st / $ss")" "$a" "$d"
  plain_tokens=$((plain_tokens + pt)) spec_tokens=$((spec_tokens + st))
  plain_s=$(bc -l <<<"$plain_s + $ps") spec_s=$(bc -l <<<"$spec_s + $ss")
  drafted=$((drafted + d)) accepted=$((accepted + a))
done
printf 'total: plain %d tokens in %.2f s (%.1f tok/s); speculative %d tokens in %.2f s (%.1f tok/s); %.2fx; %d of %d proposals kept\n' \
  "$plain_tokens" "$plain_s" "$(bc -l <<<"$plain_tokens / $plain_s")" "$spec_tokens" "$spec_s" \
  "$(bc -l <<<"$spec_tokens / $spec_s")" "$(bc -l <<<"($spec_tokens / $spec_s) / ($plain_tokens / $plain_s)")" "$accepted" "$drafted"
