#!/usr/bin/env python3
"""A llama-bench CSV and `minfer bench`'s CSV load into one pandas frame with no renamed column.

    scripts/check-bench-columns.py [--llama LLAMA.csv] [--minfer MINFER.csv | --binary MINFER]

LLAMA.csv defaults to tests/fixtures/bench/llama-bench.csv (llama-bench's own output; its README
says how it was made). Without --minfer, the script runs `minfer bench` on the tiny Qwen2 model
(--binary, default target/release/minfer) with the fixture's tests: -p 16 -n 4 -r 1 -o csv.

It checks what a llama-bench script relies on: minfer's first columns are llama-bench's, in its
order, under its names; concatenating the two frames adds no column (minfer's extras come after
llama-bench's, unknown to it and empty in its rows); and every llama-bench column keeps its pandas
type (an integer column stays integer, a rate stays float), so a groupby or a mean over both
engines' rows works. Needs pandas (scripts/python-env.sh installs it; tests/bench_cli.rs runs this
script). Exits 1 on a mismatch.
"""

import argparse
import io
import os
import subprocess
import sys

import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def minfer_csv(binary: str) -> str:
    model = os.path.join(ROOT, "tests/fixtures/models/tiny-qwen2-Q4_K.gguf")
    args = [binary, "bench", "-m", model, "-p", "16", "-n", "4", "-r", "1", "-t", "1", "-o", "csv"]
    env = dict(os.environ, MINFER_BACKENDS="cpu")
    return subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama", default=os.path.join(ROOT, "tests/fixtures/bench/llama-bench.csv"))
    p.add_argument("--minfer", help="minfer's CSV (default: run minfer bench)")
    p.add_argument("--binary", default=os.path.join(ROOT, "target/release/minfer"))
    a = p.parse_args()

    llama = pd.read_csv(a.llama)
    text = open(a.minfer).read() if a.minfer else minfer_csv(a.binary)
    ours = pd.read_csv(io.StringIO(text))
    both = pd.concat([llama, ours], ignore_index=True)

    problems = []
    n = len(llama.columns)
    if list(ours.columns[:n]) != list(llama.columns):
        problems.append(f"minfer's first {n} columns are not llama-bench's: {list(ours.columns[:n])}")
    if list(both.columns) != list(ours.columns):
        added = [c for c in both.columns if c not in ours.columns]
        problems.append(f"the concatenation adds columns minfer lacks: {added}")
    for column in llama.columns:
        if both[column].dtype != llama[column].dtype:
            problems.append(
                f"{column}: {llama[column].dtype} in llama-bench's frame, {ours[column].dtype} in minfer's, "
                f"{both[column].dtype} together"
            )
    engines = both.groupby("build_commit")["avg_ts"].mean()

    print(f"llama-bench: {len(llama)} rows x {n} columns; minfer: {len(ours)} rows x {len(ours.columns)} columns")
    print(f"together: {len(both)} rows x {len(both.columns)} columns; minfer's extras: {list(ours.columns[n:])}")
    print("mean avg_ts by build_commit:", ", ".join(f"{k}: {v:.2f}" for k, v in engines.items()))
    for problem in problems:
        print("MISMATCH:", problem, file=sys.stderr)
    if not problems:
        print(f"ok: the same {n} columns, names and types, in llama-bench's order")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
