#!/usr/bin/env python3
"""A bounded load test for `minfer serve`: N concurrent streaming clients, each sending R chat
requests one after another with the official openai client, then a summary: requests/s,
time to first token (p50/p99), aggregate generated tokens/s, and the server's RSS before and
after (with --pid).

Each client repeats one prompt of its own at temperature 0, so its R answers must be the same
text; --check fails the run if any request errs, if a stream's chunks carry two ids, if a
stream's token count disagrees with its usage, if a client's answers differ (tokens of another
stream mixed in), or if a request that stopped for length did not get exactly --max-tokens.

Usage: scripts/load-test.py --url http://127.0.0.1:8080 --clients 64 --requests 4 --max-tokens 32 [--pid PID] [--check]
Run it with the project's virtualenv (scripts/python-env.sh installs the openai client).
"""

import argparse
import asyncio
import statistics
import sys
import time

from openai import AsyncOpenAI


def rss_mib(pid):
    """The server's resident memory in MiB: total, and the anonymous part (KV caches, buffers;
    the rest is the memory-mapped model file)."""
    if not pid:
        return None
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS"), fields.get("RssAnon")


async def one(client, model, prompt, max_tokens):
    start = time.perf_counter()
    ttft = None
    ids, text, finish, usage, pieces = set(), "", None, None, 0
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta.content
        if delta:
            if ttft is None:
                ttft = time.perf_counter() - start
            text += delta
            pieces += 1
        finish = chunk.choices[0].finish_reason or finish
    return {"ttft": ttft, "ids": ids, "text": text, "finish": finish, "usage": usage, "pieces": pieces,
            "time": time.perf_counter() - start}


async def client_loop(client, model, c, args, results):
    prompt = f"Client {c}: list {c % 7 + 3} words that rhyme with {['cat', 'sun', 'tree', 'day'][c % 4]}."
    for _ in range(args.requests):
        try:
            results.append((c, await one(client, model, prompt, args.max_tokens)))
        except Exception as e:  # noqa: BLE001 - every failure is counted and reported
            results.append((c, {"error": repr(e)}))


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--pid", type=int)
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    client = AsyncOpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    rss_before = rss_mib(args.pid)
    results = []
    start = time.perf_counter()
    await asyncio.gather(*(client_loop(client, model, c, args, results) for c in range(args.clients)))
    wall = time.perf_counter() - start
    rss_after = rss_mib(args.pid)

    errors = [r["error"] for _, r in results if "error" in r]
    ok = [(c, r) for c, r in results if "error" not in r]
    ttfts = sorted(r["ttft"] for _, r in ok if r["ttft"] is not None)
    tokens = sum(r["usage"].completion_tokens for _, r in ok if r["usage"])

    def pct(q):
        return ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] if ttfts else float("nan")

    print(f"{len(results)} requests ({args.clients} clients x {args.requests}), {len(errors)} failed, in {wall:.1f} s")
    print(f"requests/s {len(ok) / wall:.2f} | ttft p50 {pct(0.5):.3f} s, p99 {pct(0.99):.3f} s, "
          f"mean {statistics.mean(ttfts) if ttfts else float('nan'):.3f} s | aggregate {tokens / wall:.1f} tok/s "
          f"({tokens} tokens)")
    if rss_before is not None:
        print(f"server RSS {rss_before[0]:.0f} MiB before ({rss_before[1]:.0f} MiB anonymous), "
              f"{rss_after[0]:.0f} MiB after ({rss_after[1]:.0f} MiB anonymous)")

    if args.check:
        problems = list(errors)
        by_client = {}
        for c, r in ok:
            if len(r["ids"]) != 1:
                problems.append(f"client {c}: a stream carried ids {r['ids']}")
            if r["usage"] is None or r["finish"] is None:
                problems.append(f"client {c}: no usage or finish reason")
                continue
            n = r["usage"].completion_tokens
            if r["finish"] == "length" and n != args.max_tokens:
                problems.append(f"client {c}: finish length after {n} tokens, not {args.max_tokens}")
            if n > args.max_tokens or r["pieces"] > n:
                problems.append(f"client {c}: {r['pieces']} pieces for {n} tokens (limit {args.max_tokens})")
            by_client.setdefault(c, set()).add(r["text"])
        for c, texts in by_client.items():
            if len(texts) != 1:
                problems.append(f"client {c}: its identical requests got different answers: {texts}")
        all_ids = [i for _, r in ok for i in r["ids"]]
        if len(set(all_ids)) != len(all_ids):
            problems.append("two streams shared an id")
        if problems:
            print("FAILED:\n  " + "\n  ".join(problems[:20]))
            sys.exit(1)
        print("check ok: every request completed, no stream mixed with another")


asyncio.run(main())
