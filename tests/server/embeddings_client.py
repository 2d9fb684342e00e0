"""Drives a running `minfer serve --embeddings` (or `--reranking`) with the official openai and
ollama Python clients, checking the vectors and scores against llama.cpp's (FIXTURE, from
tests/fixtures/embeddings/).

Usage: python embeddings_client.py BASE_URL GROUP FIXTURE
  GROUP embeddings: a server with --pooling last on tiny-qwen3-F32; FIXTURE its llama-embedding
                    reference: openai embeddings.create (float and base64, one input and several,
                    token arrays), Ollama's embed and embeddings, and the errors
  GROUP rerank:     a --reranking server on the tiny reranker; FIXTURE llama-server's /rerank
                    answers: Jina's shape, top_n, TEI's shape

Prints one line per check; exits non-zero with the failing assertion. tests/embeddings.rs runs it.
"""

import json
import math
import sys

import httpx
import ollama
import openai
from checks import check

BASE, GROUP, FIXTURE = sys.argv[1], sys.argv[2], sys.argv[3]
FX = json.load(open(FIXTURE))


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def close_to_llama(ours, index, combo="last/2"):
    want = FX["vectors"][combo][index]
    assert len(ours) == len(want), (len(ours), len(want))
    c = cosine(ours, want)
    assert c >= 0.99999, (index, c)


def embeddings():
    client = openai.OpenAI(base_url=BASE + "/v1", api_key="none")
    inputs = FX["inputs"]

    @check("embeddings.create gives each input llama-embedding's vector, with usage")
    def _():
        r = client.embeddings.create(model="any", input=inputs, encoding_format="float")
        assert [d.index for d in r.data] == list(range(len(inputs))), r
        for i, d in enumerate(r.data):
            close_to_llama(d.embedding, i)
        assert r.usage.prompt_tokens == sum(len(t) for t in FX["tokens"]), r.usage
        assert r.model == "any", r.model

    @check("the SDK's default base64 encoding decodes to the same vectors")
    def _():
        # openai-python asks for base64 by default and decodes it itself.
        r = client.embeddings.create(model="any", input=inputs[1])
        close_to_llama(r.data[0].embedding, 1)

    @check("token arrays embed as their text does")
    def _():
        r = client.embeddings.create(model="any", input=[FX["tokens"][2], FX["tokens"][0]], encoding_format="float")
        close_to_llama(r.data[0].embedding, 2)
        close_to_llama(r.data[1].embedding, 0)

    @check("embd_normalize -1 gives the unnormalized vector")
    def _():
        r = httpx.post(BASE + "/v1/embeddings", json={"input": inputs[3], "embd_normalize": -1}, timeout=60).json()
        close_to_llama(r["data"][0]["embedding"], 3, "last/-1")
        want = FX["vectors"]["last/-1"][3]
        assert max(abs(x - y) for x, y in zip(r["data"][0]["embedding"], want)) < 1e-2

    @check("dimensions other than the model's, and unknown encodings, are refused by name")
    def _():
        for extra, word in [({"dimensions": 8}, "dimensions"), ({"encoding_format": "int8"}, "encoding_format")]:
            try:
                client.embeddings.create(model="any", input="x", **extra)
                raise AssertionError(f"{extra} was accepted")
            except openai.BadRequestError as e:
                assert word in str(e), e
        r = client.embeddings.create(model="any", input="x", dimensions=len(FX["vectors"]["last/2"][0]))
        assert len(r.data[0].embedding) == len(FX["vectors"]["last/2"][0])

    @check("an empty input and a too long one are 400s")
    def _():
        for body in [{"input": ""}, {"input": "hello " * 3000}]:
            r = httpx.post(BASE + "/v1/embeddings", json=body, timeout=60)
            assert r.status_code == 400, (r.status_code, r.text)

    ol = ollama.Client(host=BASE, timeout=60)

    @check("ollama embed gives L2-normalized vectors and counts")
    def _():
        r = ol.embed(model="qwen3-embedding", input=inputs[:2])
        assert len(r.embeddings) == 2, r
        for i, v in enumerate(r.embeddings):
            close_to_llama(v, i)
            assert abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-5
        assert r.prompt_eval_count == len(FX["tokens"][0]) + len(FX["tokens"][1]), r

    @check("ollama's older embeddings call gives the raw vector")
    def _():
        r = ol.embeddings(model="qwen3-embedding", prompt=inputs[0])
        close_to_llama(list(r.embedding), 0, "last/-1")

    @check("ollama embed without truncation refuses a long input in Ollama's shape")
    def _():
        try:
            ol.embed(model="m", input="hello " * 3000, truncate=False)
            raise AssertionError("accepted")
        except ollama.ResponseError as e:
            assert e.status_code == 400 and "too large" in e.error, e
        r = ol.embed(model="m", input="hello " * 3000)
        assert len(r.embeddings) == 1


def rerank():
    want = FX["response"]
    request = FX["request"]

    @check("/rerank ranks the documents as llama-server does, best first")
    def _():
        r = httpx.post(BASE + "/rerank", json=request, timeout=60).json()
        assert [x["index"] for x in r["results"]] == [x["index"] for x in want["results"]], r
        for ours, theirs in zip(r["results"], want["results"]):
            assert abs(ours["relevance_score"] - theirs["relevance_score"]) <= 2e-3 * max(theirs["relevance_score"], 1e-3) + 1e-6, (ours, theirs)
        assert r["usage"] == want["usage"], (r["usage"], want["usage"])
        assert r["object"] == "list"

    @check("top_n keeps the best n, and return_documents adds their text")
    def _():
        r = httpx.post(BASE + "/v1/rerank", json={**request, "top_n": 2, "return_documents": True}, timeout=60).json()
        assert len(r["results"]) == 2, r
        top = r["results"][0]
        assert top["document"]["text"] == request["documents"][top["index"]], top

    @check("TEI's texts form answers a bare array with score and text")
    def _():
        r = httpx.post(BASE + "/rerank", json={"query": request["query"], "texts": request["documents"], "return_text": True}, timeout=60).json()
        assert isinstance(r, list) and len(r) == len(request["documents"]), r
        assert set(r[0]) == {"index", "score", "text"}, r[0]

    @check("a rerank without documents or query is a 400 naming the field")
    def _():
        for body, word in [({"query": "q", "documents": []}, "documents"), ({"documents": ["d"]}, "query")]:
            r = httpx.post(BASE + "/rerank", json=body, timeout=60)
            assert r.status_code == 400 and word in r.text, (r.status_code, r.text)


{"embeddings": embeddings, "rerank": rerank}[GROUP]()
