#!/usr/bin/env bash
# ARM without ARM: cross-compiles the in-process tests for aarch64-unknown-linux-gnu and runs them
# under qemu-aarch64, twice: as a CPU with the dotprod and i8mm extensions (QEMU_CPU=max: the
# engine takes the SDOT kernels and SMMLA's two-by-two prompt tiles) and as a Cortex-A53 (baseline
# NEON, no dotprod). Run by scripts/test.sh; alone: scripts/test-aarch64.sh.
#
# Only Debian's packages: the cross gcc (linker and C compiler for build scripts' C), the arm64
# libc, qemu-user, and Debian's Rust (rustc-web, cargo-web) with the aarch64 standard library of
# the same version (libstd-rust-web-dev:arm64): a std works only with the compiler it was built
# by, so this script builds with /usr/bin/rustc, never the rustup toolchain the rest uses.
# Installs what is missing (as root, or through sudo). The engine alone is built
# (--no-default-features: no HTTP, no GPU crates), into target/aarch64 (kept between runs).
#
# What runs under qemu: the library's unit tests (the kernels against their scalar references,
# the CPU backend, the graph, the tokenizer, ...), tests/backend_ops.rs and tests/tiny_models.rs
# (the 22 tiny models against llama.cpp's logits, and their logits' bits against those recorded
# on x86-64). Tests that spawn the minfer binary would need binfmt and are not run here.
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu
packages=(rustc-web cargo-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { echo "test-aarch64: apt needs root (or sudo)" >&2; exit 1; }
    sudo="sudo"
  fi
  echo "test-aarch64: installing ${missing[*]}" >&2
  dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
host_version="$(dpkg-query -W -f='${Version}' rustc-web)"
std_version="$(dpkg-query -W -f='${Version}' libstd-rust-web-dev:arm64)"
if [[ "${host_version}" != "${std_version}" ]]; then
  echo "test-aarch64: rustc-web ${host_version} and libstd-rust-web-dev:arm64 ${std_version} differ;" \
    "install the same version of both" >&2
  exit 1
fi

export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
# Linked statically: under Debian 12's qemu-aarch64 (7.2) a dynamically linked glibc program
# spins forever in its first pthread_create, and the test harness runs every test on a thread.
# Warnings are errors, as in the x86 lints: code for x86 alone must not leak into this build.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static -D warnings"
# Each test binary under a time limit (20 minutes; the longest, tiny_models, takes about 6):
# Debian 12's qemu-aarch64 now and then loses a guest thread's futex wake-up, and the binary
# then sleeps forever with no CPU used (seen at different tests from one run to the next). A
# pass whose binary ran out of time is run once more (below), never more.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="timeout --kill-after=10 1200 qemu-aarch64"
# No debug information: it is half of the cross build's time, and nothing here reads it.
export CARGO_PROFILE_TEST_DEBUG=0 CARGO_PROFILE_DEV_DEBUG=0
# The switches of the x86 runs must not leak into these.
unset MINFER_NO_AVX512 MINFER_NO_AVX2 MINFER_KERNEL MINFER_TEST_BACKEND MINFER_NO_I8MM MINFER_NO_DOTPROD MINFER_NO_NEON
cargo=(/usr/bin/cargo test --target "${target}" --target-dir target/aarch64 --no-default-features
  --lib --test backend_ops --test tiny_models)

echo "== aarch64: cross build ($(/usr/bin/rustc --version))" >&2
"${cargo[@]}" --no-run

log="$(mktemp)"
trap 'rm -f "${log}"' EXIT
# QEMU_CPU: the CPU model qemu-aarch64 emulates; MINFER_REQUIRE_ISA makes a kernel test that
# finds its instruction set missing fail instead of skipping; MINFER_EXPECT_ISA is the one the
# engine must choose there.
# One test at a time: with two tests each running a CPU thread pool, Debian 12's qemu-aarch64 once
# lost the guest's threads and waited forever. On the Cortex-A53 the float tiny models are left
# out (their kernels are checked bit for bit in the unit tests there too), to keep the run
# within its time.
for cpu in max cortex-a53; do
  skip=()
  case "${cpu}" in
    max) isa=neon-i8mm required=neon,neon-dotprod,neon-i8mm ;;
    cortex-a53) isa=neon required=neon skip=(--skip tiny_qwen2_f --skip tiny_qwen3_f --skip tiny_qwen2_bf16 --skip tiny_qwen3_bf16) ;;
  esac
  for attempt in 1 2; do
    echo "== aarch64 under qemu, QEMU_CPU=${cpu}: the kernels should run ${isa}" >&2
    set +e
    QEMU_CPU="${cpu}" MINFER_REQUIRE_ISA="${required}" MINFER_EXPECT_ISA="${isa}" \
      "${cargo[@]}" -- --nocapture --test-threads 1 "${skip[@]}" 2>&1 | tee "${log}" |
      grep -E '^test result|dot products checked|FAILED|panicked' >&2
    status="${PIPESTATUS[0]}"
    set -e
    # Out of time (timeout's 124, or its kill): qemu's lost wake-up, not a test's verdict.
    if grep -qE 'exit status: (124|137)|signal: 9, SIGKILL' "${log}" && [[ "${attempt}" == 1 ]]; then
      echo "test-aarch64: a test binary under qemu (${cpu}) ran out of time; running the pass once more" >&2
      continue
    fi
    break
  done
  grep -q '^test result: FAILED' "${log}" && exit 1
  grep -qE 'exit status: (124|137)|signal: 9, SIGKILL' "${log}" && { echo "test-aarch64: out of time twice under ${cpu}" >&2; exit 1; }
  [[ "${status}" == 0 ]] || { echo "test-aarch64: the tests under ${cpu} failed (cargo's status ${status})" >&2; exit 1; }
  # The kernels that ran, counted: every quantized type's NEON (and SDOT) dot products checked
  # bit for bit, and the instruction set the engine chose.
  for name in ${required//,/ }; do
    line="$(grep -oE "(^| )${name} dot products checked.*" "${log}" || true)"
    [[ -n "${line}" ]] || { echo "test-aarch64: the ${name} kernels did not run under ${cpu}" >&2; exit 1; }
    echo "test-aarch64: ${cpu}: ${line}" >&2
  done
  if [[ "${cpu}" == max ]] && ! grep -qE '(^| )neon-i8mm dot products checked.*two weight rows by two tokens' "${log}"; then
    echo "test-aarch64: the SMMLA two-by-two kernels did not run under ${cpu}" >&2
    exit 1
  fi
  if [[ "${cpu}" == cortex-a53 ]] && grep -qE '(^| )neon-(dotprod|i8mm) dot products checked' "${log}"; then
    echo "test-aarch64: the SDOT or SMMLA kernels ran on a CPU without dotprod" >&2
    exit 1
  fi
  grep -q "the chosen table runs on this cpu.*ok\|the_chosen_table_runs_on_this_cpu_and_names_its_instruction_set ... ok" "${log}" ||
    { echo "test-aarch64: the instruction-set test did not pass" >&2; exit 1; }
done
