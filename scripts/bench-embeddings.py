#!/usr/bin/env python3
"""Embeddings throughput of a running server: N inputs of L random tokens each (ids from a
fixed seed, so every server embeds the same inputs), sent to /v1/embeddings as token arrays,
R requests at a time of N/R inputs each; prints embeddings/s over the best of 3 runs.

    scripts/bench-embeddings.py URL [--inputs 256] [--tokens 64] [--requests 1] [--vocab 150000]

Start the server first, e.g. (both at 2 threads, pooling last):
    minfer serve MODEL -t 2 --embeddings --pooling last -b 1024 --port 8090
    llama-server -m MODEL -t 2 --embeddings --pooling last -b 1024 -ub 1024 -np 16 -c 1024 --port 8091
"""
import argparse
import concurrent.futures
import json
import random
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("--inputs", type=int, default=256)
ap.add_argument("--tokens", type=int, default=64)
ap.add_argument("--requests", type=int, default=1)
ap.add_argument("--vocab", type=int, default=150000)
a = ap.parse_args()

rng = random.Random(1234)
inputs = [[rng.randrange(100, a.vocab) for _ in range(a.tokens)] for _ in range(a.inputs)]
per = (a.inputs + a.requests - 1) // a.requests
chunks = [inputs[i:i + per] for i in range(0, a.inputs, per)]


def post(chunk):
    body = json.dumps({"input": chunk, "encoding_format": "float"}).encode()
    req = urllib.request.Request(a.url.rstrip("/") + "/v1/embeddings", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        data = json.load(r)["data"]
    assert len(data) == len(chunk), len(data)
    return len(data)


post(chunks[0][:2])  # warm-up
best = 0.0
for _ in range(3):
    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(chunks)) as pool:
        n = sum(pool.map(post, chunks))
    rate = n / (time.perf_counter() - t)
    best = max(best, rate)
print(f"{a.inputs} inputs x {a.tokens} tokens, {len(chunks)} request(s): {best:.1f} embeddings/s (best of 3)")
