#!/usr/bin/env python3
"""Write llama.cpp reference embeddings to tests/fixtures/embeddings/<model-stem>.json.

For each model, runs llama.cpp's `llama-embedding` (commit 0c1e570) four times, once per
(pooling, normalisation) in {mean, last} x {-1 (none), 2 (euclidean)}, on the four INPUTS below
given as one `-p` joined by newlines and split back by `--embd-separator` (a real newline
character: llama.cpp does not unescape the separator argument, so a literal `\\n` would not
split). The first run also passes `--verbose-prompt`, whose token listing gives "tokens". The
vectors are copied verbatim, as text, from the `--embd-output-format json` output (`%1.7f`).

    LLAMA_BIN=<llama.cpp>/build/bin .venv/bin/python scripts/gen_embedding_fixtures.py MODEL.gguf...

Each run is

    llama-embedding -m MODEL -t 2 -c 512 --pooling P --embd-normalize N \\
        --embd-output-format json --embd-separator $'\\n' [--verbose-prompt] -p "$(INPUTS joined by \\n)"
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

INPUTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    'fn main() { println!("hi"); }',
    "Embeddings turn text into vectors that can be compared by cosine similarity.",
]
COMBOS = [("mean", -1), ("mean", 2), ("last", -1), ("last", 2)]

root = Path(__file__).resolve().parent.parent
out_dir = root / "tests/fixtures/embeddings"
bin_dir = Path(os.environ.get(
    "LLAMA_BIN", "/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"))


def run(model, pooling, norm, verbose):
    cmd = [str(bin_dir / "llama-embedding"), "-m", str(model), "-t", "2", "-c", "512",
           "--pooling", pooling, "--embd-normalize", str(norm),
           "--embd-output-format", "json", "--embd-separator", "\n"]
    if verbose:
        cmd.append("--verbose-prompt")
    cmd += ["-p", "\n".join(INPUTS)]
    # llama.cpp's logger prints from a worker thread that the process does not join at exit
    # (common/log.cpp, "logs may be lost if not flushed before the program exits"), so the tail
    # of the output is sometimes cut off (seen with --verbose-prompt): rerun until the JSON
    # document is whole.
    for _ in range(50):
        p = subprocess.run(cmd, capture_output=True, text=True, check=True)
        if p.stdout.rstrip().endswith("]\n}"):
            return p.stdout, p.stderr
    raise RuntimeError(f"no complete output from {cmd}")


def parse_tokens(stdout, stderr):
    counts = [int(m) for m in re.findall(r"number of tokens in prompt = (\d+)", stderr)]
    ids = [int(m.group(1)) for m in re.finditer(r"^\s*(-?\d+) -> '", stdout, re.M)]
    assert len(counts) == len(INPUTS) and sum(counts) == len(ids), (counts, len(ids))
    out, i = [], 0
    for n in counts:
        out.append(ids[i:i + n])
        i += n
    return out


def parse_vectors(stdout):
    """The raw text of each "embedding": [...] array, in index order."""
    start = stdout.index("{\n")
    doc = stdout[start:stdout.rindex("}") + 1]
    arrays = re.findall(r'"embedding": (\[[^\]]*\])', doc)
    parsed = json.loads(doc)  # sanity: valid JSON, right count and order
    assert [d["index"] for d in parsed["data"]] == list(range(len(INPUTS)))
    assert len(arrays) == len(INPUTS)
    for a, d in zip(arrays, parsed["data"]):
        assert json.loads(a) == d["embedding"]
    return arrays


def main():
    out_dir.mkdir(parents=True, exist_ok=True)
    for model in map(Path, sys.argv[1:]):
        tokens, vectors = None, {}
        for k, (pooling, norm) in enumerate(COMBOS):
            stdout, stderr = run(model, pooling, norm, verbose=(k == 0))
            if k == 0:
                tokens = parse_tokens(stdout, stderr)
            vectors[f"{pooling}/{norm}"] = parse_vectors(stdout)
        head = json.dumps({"model": model.name, "inputs": INPUTS, "tokens": tokens})
        body = ",\n".join(
            f'    {json.dumps(key)}: [\n' + ",\n".join(f"      {a}" for a in arrs) + "\n    ]"
            for key, arrs in vectors.items())
        text = head[:-1] + ', "vectors": {\n' + body + "\n  }\n}\n"
        json.loads(text)
        dest = out_dir / f"{model.stem}.json"
        dest.write_text(text)
        print(dest, [len(t) for t in tokens])


if __name__ == "__main__":
    main()
