#!/usr/bin/env python3
"""An agents' workload against a running server: 16 conversations x 4 turns, all 16 at once,
every conversation starting with the same ~1,100-token system prompt (instructions and 24 tool
lines); each turn a short user message and a reply capped at 24 tokens, temperature 0, streamed
from /v1/chat/completions. Prints TTFT p50/p95 (time to the first content chunk), the prompt
tokens actually prefilled (llama-server's `timings.prompt_n`, else usage.prompt_tokens minus
cached_tokens), the naive sum (every turn's whole prompt), and aggregate generated tok/s.

    scripts/bench-agents.py URL [--conversations 16] [--turns 4] [--max-tokens 24]
                                [--duration SECONDS --rss-pid PID]

Start each server with the same KV budget, e.g. 16,384 cells:
    minfer serve MODEL -t 2 -c 16384 --port 8090
    llama-server -m MODEL -t 2 -np 4 -c 16384 --port 8091

With --duration the workload runs round after round (each round's conversations new, the system
prompt the same) until that many seconds have passed, and with --rss-pid the server's VmRSS is
sampled every 5 s; the figures are then those of all rounds, with the RSS samples' min/max.
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("--conversations", type=int, default=16)
ap.add_argument("--turns", type=int, default=4)
ap.add_argument("--max-tokens", type=int, default=24)
ap.add_argument("--duration", type=float, default=0)
ap.add_argument("--rss-pid", type=int)
a = ap.parse_args()

TOOLS = [
    ("read_file", "path", "Read a file of the repository and return its text."),
    ("write_file", "path, text", "Replace a file's text, creating it when missing."),
    ("list_dir", "path", "List a directory's entries with their sizes."),
    ("search", "pattern, path", "Search files under a path for a regular expression."),
    ("run_tests", "filter", "Run the test suite, or the tests whose names match the filter."),
    ("run_command", "command", "Run a shell command in the repository and return its output."),
    ("git_diff", "path", "Show the uncommitted changes of a path."),
    ("git_log", "count", "Show the last commits with their messages."),
    ("git_commit", "message", "Commit every staged change with the message."),
    ("apply_patch", "patch", "Apply a unified diff to the working tree."),
    ("open_issue", "number", "Read an issue with its comments."),
    ("comment", "number, text", "Comment on an issue or a pull request."),
    ("fetch_url", "url", "Fetch a web page and return its text."),
    ("format", "path", "Format a source file with the project's formatter."),
    ("lint", "path", "Run the linter on a path and return its findings."),
    ("build", "target", "Build a target and return the compiler's messages."),
    ("benchmark", "name", "Run a benchmark and return its figures."),
    ("profile", "command", "Profile a command and return its hottest functions."),
    ("install", "package", "Install a package with the system's package manager."),
    ("ask_user", "question", "Ask the user a question and wait for the answer."),
    ("remember", "note", "Keep a note for the rest of the session."),
    ("recall", "topic", "Return the notes kept about a topic."),
    ("plan", "steps", "Record the plan of the task as numbered steps."),
    ("finish", "summary", "End the task with a summary of what was done."),
]
RULES = [
    "You are a coding agent working in a software repository on behalf of a developer.",
    "Read the relevant code before changing it, and change only what the task needs.",
    "Prefer small, reviewable steps; run the tests after every change that could break them.",
    "Never invent file contents, test results or command output: call a tool and read its answer.",
    "When a command fails, read its error, find the cause, and fix the cause rather than the symptom.",
    "Keep the project's style: its naming, its error handling, its comments and its layout.",
    "Write tests as sentences that say what they prove, and make them fail before they pass.",
    "Do not add dependencies without a reason the developer would accept.",
    "Explain what you did in plain words, briefly, with the commands that show it works.",
]
SYSTEM = "\n".join(RULES * 4) + "\n\nTools, called as JSON {\"tool\": NAME, \"arguments\": {...}}:\n" + "\n".join(
    f"- {name}({args}): {doc}" for name, args, doc in TOOLS)
QUESTIONS = ["What does the build script do?", "Which tests cover the parser?", "Fix the failing lint.",
             "Summarize the last three commits."]

lock = threading.Lock()
ttfts, prefilled, naive, generated = [], [0], [0], [0]


def turn(messages):
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": a.max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(a.url.rstrip("/") + "/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    start, first, text, usage, timings = time.perf_counter(), None, "", None, None
    with urllib.request.urlopen(req, timeout=1200) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter() - start
                text += piece
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    n_prompt = usage["prompt_tokens"]
    cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
    read = timings["prompt_n"] if timings and "prompt_n" in timings else n_prompt - cached
    with lock:
        ttfts.append(first if first is not None else time.perf_counter() - start)
        prefilled[0] += read
        naive[0] += n_prompt
        generated[0] += usage["completion_tokens"]
    return text


def conversation(i, round_):
    messages = [{"role": "system", "content": SYSTEM}]
    label = f"conversation {i}" if round_ == 0 else f"round {round_}, conversation {i}"
    for t in range(a.turns):
        messages.append({"role": "user", "content": f"[{label}] {QUESTIONS[t % len(QUESTIONS)]}"})
        messages.append({"role": "assistant", "content": turn(messages)})


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))


rss, done = [], threading.Event()


def sample_rss():
    while not done.is_set():
        rss.append(rss_kb(a.rss_pid))
        done.wait(5)


if a.rss_pid:
    threading.Thread(target=sample_rss, daemon=True).start()
start = time.perf_counter()
rounds = 0
while True:
    threads = [threading.Thread(target=conversation, args=(i, rounds)) for i in range(a.conversations)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rounds += 1
    if time.perf_counter() - start >= a.duration:
        break
wall = time.perf_counter() - start
done.set()
q = statistics.quantiles(ttfts, n=20)
print(json.dumps({
    "conversations": a.conversations, "turns": a.turns, "requests": len(ttfts),
    "ttft_p50_s": round(statistics.median(ttfts), 3), "ttft_p95_s": round(q[18], 3),
    "prefilled_tokens": prefilled[0], "naive_prompt_tokens": naive[0],
    "prefilled_ratio": round(prefilled[0] / max(naive[0], 1), 3),
    "generated_tokens": generated[0], "aggregate_tok_s": round(generated[0] / wall, 2), "wall_s": round(wall, 1),
    "rounds": rounds,
    **({"rss_mib_min": round(min(rss) / 1024, 1), "rss_mib_max": round(max(rss) / 1024, 1), "rss_samples": len(rss),
        "rss_mib_each_minute": [round(kb / 1024, 1) for kb in rss[::12]]}
       if rss else {}),
}))
