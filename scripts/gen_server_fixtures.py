#!/usr/bin/env python3
"""Write llama.cpp llama-server (commit 0c1e570) reference exchanges for reranking and embeddings:

- tests/fixtures/embeddings/tiny-qwen3-reranker.rerank.json, from
      llama-server -m tests/fixtures/models/tiny-qwen3-reranker-Q8_0.gguf --rerank -t 2 -c 1024 --port 8099
  POST /rerank (Jina form), POST /v1/rerank with "return_text": false (still the Jina form: only
  a TEI request, one with "texts", honours return_text) and POST /v1/rerank in TEI form; the
  prompts the server builds (format_prompt_rerank in tools/server/server-common.cpp: the GGUF's
  `tokenizer.chat_template.rerank` with {query} and {document} replaced, reproduced here) and
  their tokens (from the same server's POST /tokenize, which tokenizes as format_prompt_rerank
  does: add_special false, parse_special true); and llama-embedding's rank pooling on the same
  prompts, both as ready-formatted prompts and as query<TAB>document pairs that llama-embedding
  formats itself.
- tests/fixtures/embeddings/tiny-qwen3-server.json, from
      llama-server -m tests/fixtures/models/tiny-qwen3-Q8_0.gguf --embeddings --pooling last -t 2 -c 1024 --port 8099
  POST /v1/embeddings, POST /embedding, POST /completion (what it does in embeddings mode),
  POST /rerank (not a reranking server) and an over-long input; then the error cases of a plain
  server (no --embeddings) and of a mean-pooling one (input longer than the physical batch).

It works from the repository root (it changes there itself) and names the models by relative
path, which the server echoes as "model". Every response body is stored verbatim (spliced in as
JSON text) with its HTTP status. Nothing is left running: each server is terminated by its pid.

    LLAMA_BIN=<llama.cpp>/build/bin .venv/bin/python scripts/gen_server_fixtures.py
"""
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

root = Path(__file__).resolve().parent.parent
models = Path("tests/fixtures/models")  # relative: the servers echo the path as "model"
out_dir = root / "tests/fixtures/embeddings"
bin_dir = Path(os.environ.get(
    "LLAMA_BIN", "/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"))
sys.path.insert(0, str(bin_dir.parent.parent / "gguf-py"))  # llama.cpp's own gguf-py
from gguf import GGUFReader  # noqa: E402
PORT = 8099
BASE = f"http://127.0.0.1:{PORT}"

QUERY = "What is a panda?"
DOCUMENTS = [
    "hi",
    "it's a bear",
    "The giant panda (Ailuropoda melanoleuca), sometimes called a panda bear or simply panda, "
    "is a bear species endemic to China.",
    "Machine learning is a field of study.",
]


class Raw:
    """A JSON text to splice into the output unchanged."""
    def __init__(self, text):
        json.loads(text)
        self.text = text


def dumps(obj, indent=0):
    """json.dumps, but Raw values are written as their text."""
    pad = "  " * (indent + 1)
    if isinstance(obj, Raw):
        return obj.text
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list, Raw)) for v in obj):
        items = [f"{pad}{dumps(v, indent + 1)}" for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + "  " * indent + "]"
    return json.dumps(obj, ensure_ascii=False)


def http(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def exchange(path, body):
    status, text = http("POST", path, body)
    print(f"POST {path} -> {status} {text[:160]}")
    return {"method": "POST", "path": path, "request": body, "status": status,
            "response": Raw(text)}


class Server:
    def __init__(self, args, log):
        self.cmd = [str(bin_dir / "llama-server")] + args + ["--port", str(PORT)]
        self.log = log

    def __enter__(self):
        self.logf = open(self.log, "w")
        self.p = subprocess.Popen(self.cmd, stdout=self.logf, stderr=subprocess.STDOUT)
        for _ in range(600):
            try:
                if http("GET", "/health")[0] == 200:
                    return self
            except OSError:
                pass
            if self.p.poll() is not None:
                raise RuntimeError(f"server exited: {self.cmd}")
            time.sleep(0.2)
        raise RuntimeError("server did not come up")

    def __exit__(self, *exc):
        self.p.terminate()
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.logf.close()


def embedding_run(args, prompt, n):
    """llama-embedding, rerun until its (asynchronously logged, sometimes cut off at exit)
    output is whole: 2 "rerank score" lines per input, or n lines of 2 numbers (raw)."""
    cmd = [str(bin_dir / "llama-embedding")] + args + ["-p", prompt]
    for _ in range(50):
        p = subprocess.run(cmd, capture_output=True, text=True, check=True)
        if "--embd-output-format" in args:
            tail = p.stdout.rstrip("\n").split("\n")[-n:]
            if all(re.fullmatch(r"-?\d+\.\d{7} -?\d+\.\d{7}", line) for line in tail):
                return cmd, p.stdout, p.stderr
        elif len(re.findall(r"^rerank score \d+: .*$", p.stdout, re.M)) == 2 * n:
            return cmd, p.stdout, p.stderr
    raise RuntimeError(cmd)


def rel(cmd):
    return [Path(c).name if c.startswith(str(bin_dir)) else c for c in cmd]


def reranker():
    model = models / "tiny-qwen3-reranker-Q8_0.gguf"
    args = ["-m", str(model), "--rerank", "-t", "2", "-c", "1024"]
    jina = {"query": QUERY, "documents": DOCUMENTS, "top_n": 4}
    with Server(args, "/tmp/llama-server-rerank.log") as s:
        ex = [exchange("/rerank", jina),
              exchange("/v1/rerank", dict(jina, return_text=False)),
              exchange("/v1/rerank", {"query": QUERY, "texts": DOCUMENTS, "return_text": True})]
        # format_prompt_rerank, reproduced: the rerank template with {query} then {document}
        # replaced (string_replace_all), tokenized with add_special=false, parse_special=true
        from_gguf = GGUFReader(model).fields["tokenizer.chat_template.rerank"].contents()
        prompts = [from_gguf.replace("{query}", QUERY).replace("{document}", d) for d in DOCUMENTS]
        tokens, pieces = [], []
        for p in prompts:
            status, text = http("POST", "/tokenize",
                                {"content": p, "add_special": False, "parse_special": True,
                                 "with_pieces": True})
            assert status == 200
            toks = json.loads(text)["tokens"]
            tokens.append([t["id"] for t in toks])
            pieces.append([t["piece"] for t in toks])
        cmd = s.cmd
    usage = json.loads(ex[0]["response"].text)["usage"]["prompt_tokens"]
    assert usage == sum(map(len, tokens)), (usage, [len(t) for t in tokens])

    # llama-embedding, rank pooling: the ready prompts (no TAB in them, so tokenized as they
    # are, add_special=true, parse_special=true) split by a separator that is not in them ...
    common = ["-m", str(model), "--pooling", "rank", "--embd-normalize", "-1", "-t", "2",
              "-c", "1024"]
    emb = {}
    sep = "<#sep#>"
    for fmt in ("raw", None):
        a = common + ["--embd-separator", sep] + (["--embd-output-format", fmt] if fmt else [])
        if fmt == "raw":
            a.append("--verbose-prompt")
        c, out, err = embedding_run(a, sep.join(prompts), len(prompts))
        emb[f"formatted/{fmt or 'default'}"] = {"command": rel(c), "stdout": out}
    # ... and the query<TAB>document pairs, which llama-embedding formats with the same template
    pairs = "\n".join(f"{QUERY}\t{d}" for d in DOCUMENTS)
    for fmt in ("raw", None):
        a = common + (["--embd-output-format", fmt] if fmt else [])
        if fmt == "raw":
            a.append("--verbose-prompt")
        c, out, err = embedding_run(a, pairs, len(prompts))
        emb[f"pairs/{fmt or 'default'}"] = {"command": rel(c), "stdout": out}

    # the token ids llama-embedding printed must be the server's
    for key in ("formatted/raw", "pairs/raw"):
        ids = [int(m) for m in re.findall(r"^\s*(-?\d+) -> '", emb[key]["stdout"], re.M)]
        assert ids == sum(tokens, []), key

    doc = {
        "server_command": rel(cmd),
        "request": jina,
        "response": ex[0]["response"],
        "exchanges": ex,
        "rerank_template": from_gguf,
        "prompts": prompts,
        "tokens": tokens,
        "pieces": pieces,
        "embedding_rank": emb,
    }
    write_fixture("tiny-qwen3-reranker.rerank.json", doc)


def write_fixture(name, doc):
    """`doc` to tests/fixtures/embeddings/NAME, checked to read back as JSON."""
    dest = out_dir / name
    text = dumps(doc) + "\n"
    json.loads(text)
    dest.write_text(text)
    print(dest)


def embeddings_server():
    model = models / "tiny-qwen3-Q8_0.gguf"
    args = ["-m", str(model), "--embeddings", "--pooling", "last", "-t", "2", "-c", "1024"]
    long_input = "hello " * 1100
    with Server(args, "/tmp/llama-server-embd.log") as s:
        ex = [exchange("/v1/embeddings",
                       {"input": ["Hello world", "The quick brown fox jumps over the lazy dog."]}),
              exchange("/embedding", {"content": "Hello world"}),
              exchange("/completion", {"prompt": "hi"}),
              exchange("/rerank", {"query": QUERY, "documents": DOCUMENTS[:2]}),
              exchange("/embedding", {"content": long_input})]
        ex[-1]["request"] = {"content": '"hello " * 1100'}
        main_cmd = s.cmd
    errors = []
    plain = ["-m", str(model), "-t", "2", "-c", "1024"]
    with Server(plain, "/tmp/llama-server-plain.log") as s:
        errors.append({"server_command": rel(s.cmd),
                       **exchange("/v1/embeddings", {"input": "Hello world"})})
        errors.append({"server_command": rel(s.cmd),
                       **exchange("/rerank", {"query": QUERY, "documents": DOCUMENTS[:2]})})
    mean = ["-m", str(model), "--embeddings", "--pooling", "mean", "-t", "2", "-c", "1024"]
    with Server(mean, "/tmp/llama-server-mean.log") as s:
        e = exchange("/embedding", {"content": "hello " * 600})
        e["request"] = {"content": '"hello " * 600'}
        errors.append({"server_command": rel(s.cmd), **e})
    doc = {
        "server_command": rel(main_cmd),
        "exchanges": ex,
        "errors": errors,
    }
    write_fixture("tiny-qwen3-server.json", doc)


if __name__ == "__main__":
    os.chdir(root)
    out_dir.mkdir(parents=True, exist_ok=True)
    reranker()
    embeddings_server()
