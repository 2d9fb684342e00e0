#!/usr/bin/env bash
# Soak the server: normal and hostile traffic mixed against `minfer serve` on a tiny model, on
# loopback, for SECONDS (default 600), then check that memory stayed flat, no slot is stuck and
# every normal request was answered. The figures are printed on the line starting "soak:".
set -euo pipefail
cd "$(dirname "$0")/.."
MINFER_SOAK_SECONDS="${1:-600}" cargo test --release --test soak -- --nocapture
