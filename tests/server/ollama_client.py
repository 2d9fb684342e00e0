"""Drives a running `minfer serve` with the official ollama Python client.

Usage: python ollama_client.py BASE_URL GROUP
  GROUP protocol: chat and generate, whole and streamed, tools, format, options, list, show, ps,
                  version and errors (any model: greedy outputs are compared with each other,
                  never judged)
  GROUP thinking: a server whose template opens the reasoning, with --reasoning-budget: `thinking`
                  apart from the answer

Prints one line per check; exits non-zero with the failing assertion. tests/server_apis.rs runs it.
"""

import json
import sys

import httpx
import ollama
from checks import check

BASE, GROUP = sys.argv[1], sys.argv[2]
client = ollama.Client(host=BASE, timeout=120)
MODEL = "qwen2.5-coder:0.5b"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write a haiku about the sea."}]
GREEDY = {"temperature": 0, "top_k": 1}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string", "maxLength": 12}},
            "required": ["location"],
            "additionalProperties": False,
        },
    },
}


def protocol():
    @check("a chat answer is Ollama's last object, with counts and durations")
    def _():
        r = client.chat(model=MODEL, messages=MESSAGES, options={**GREEDY, "num_predict": 6})
        assert r.done and r.done_reason == "length" and r.message.role == "assistant", r
        assert r.eval_count == 6 and r.prompt_eval_count > 0, r
        assert r.total_duration >= r.eval_duration > 0, r
        assert r.model == MODEL and r.created_at, r

    @check("a streamed chat adds up to the whole answer and ends with done")
    def _():
        whole = client.chat(model=MODEL, messages=MESSAGES, options={**GREEDY, "num_predict": 12})
        parts = list(client.chat(model=MODEL, messages=MESSAGES, stream=True, options={**GREEDY, "num_predict": 12}))
        assert parts[-1].done and not any(p.done for p in parts[:-1]), parts
        text = "".join(p.message.content for p in parts)
        assert text == whole.message.content, (text, whole.message.content)
        assert parts[-1].eval_count == whole.eval_count, (parts[-1], whole)

    @check("generate answers a prompt as a chat turn, whole and streamed, and raw as it is")
    def _():
        whole = client.generate(model=MODEL, prompt="Write a haiku about the sea.", system="Be brief.",
                                options={**GREEDY, "num_predict": 8})
        chat = client.chat(model=MODEL, messages=MESSAGES, options={**GREEDY, "num_predict": 8})
        assert whole.response == chat.message.content, (whole.response, chat.message.content)
        parts = list(client.generate(model=MODEL, prompt="Write a haiku about the sea.", system="Be brief.",
                                     stream=True, options={**GREEDY, "num_predict": 8}))
        assert "".join(p.response for p in parts) == whole.response and parts[-1].done, parts
        raw = client.generate(model=MODEL, prompt="Once upon a time", raw=True, options={**GREEDY, "num_predict": 5})
        assert raw.done and raw.eval_count == 5 and raw.response, raw
        loaded = client.generate(model=MODEL, prompt="")
        assert loaded.done and loaded.done_reason == "load", loaded

    @check("a stop option ends the text before it")
    def _():
        whole = client.chat(model=MODEL, messages=MESSAGES, options={**GREEDY, "num_predict": 16}).message.content
        stop = whole[len(whole) // 2 :][:3]
        assert stop.strip(), whole
        r = client.chat(model=MODEL, messages=MESSAGES, options={**GREEDY, "num_predict": 16, "stop": [stop]})
        assert r.message.content == whole[: whole.index(stop)] and r.done_reason == "stop", (r, whole, stop)

    @check("format makes the answer follow a schema, or be JSON")
    def _():
        schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
                  "required": ["answer"], "additionalProperties": False}
        r = client.chat(model=MODEL, messages=MESSAGES, format=schema, options={**GREEDY, "num_predict": 32})
        assert json.loads(r.message.content)["answer"] in ("yes", "no"), r.message.content

    @check("a tool call comes back with object arguments, and its result is answered")
    def _():
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        # Ollama's API has no tool_choice; llama-server's field passes through to force the call.
        body = {"model": MODEL, "messages": ask, "tools": [WEATHER], "stream": False, "tool_choice": "required",
                "options": {**GREEDY, "num_predict": 64}}
        r = ollama.ChatResponse.model_validate(httpx.post(BASE + "/api/chat", json=body, timeout=120).json())
        calls = r.message.tool_calls
        assert calls and calls[0].function.name == "get_weather", r
        assert isinstance(calls[0].function.arguments["location"], str), calls
        again = client.chat(
            model=MODEL,
            messages=ask + [r.message, {"role": "tool", "tool_name": "get_weather", "content": "20 C"}],
            tools=[WEATHER],
            options={**GREEDY, "num_predict": 8},
        )
        assert again.done and again.prompt_eval_count > r.prompt_eval_count, again

    @check("list, show, ps and version describe the served model")
    def _():
        models = client.list().models
        assert len(models) == 1 and models[0].details.format == "gguf" and models[0].size > 0, models
        name = models[0].model
        shown = client.show(name)
        assert "completion" in shown.capabilities and shown.template and shown.modelinfo, shown
        assert shown.details.parameter_size and shown.details.quantization_level, shown.details
        running = client.ps().models
        assert running[0].model == name and running[0].context_length > 0, running
        version = httpx.get(BASE + "/api/version").json()["version"]
        assert version.count(".") == 2, version

    @check("bad requests and what minfer does not do get Ollama's error shape")
    def _():
        def refused(expect, f):
            try:
                f()
            except ollama.ResponseError as e:
                assert e.status_code in (400, 501) and expect in e.error, (expect, e.error)
                return
            raise AssertionError(f"not refused: {expect}")

        refused("options.num_experts", lambda: client.chat(model=MODEL, messages=MESSAGES, options={"num_experts": 2}))
        refused("image input is not supported",
                lambda: client.chat(model=MODEL, messages=[{"role": "user", "content": "x", "images": ["AAAA"]}]))
        bad = httpx.post(BASE + "/api/chat", json={"model": MODEL, "messages": MESSAGES, "format": "yaml"})
        assert bad.status_code == 400 and "format" in bad.json()["error"], bad.text
        refused("--embeddings", lambda: client.embed(model=MODEL, input="x"))
        refused("/api/pull", lambda: client.pull(MODEL))


def thinking():
    @check("a thinking model's reasoning is `thinking`, whole and streamed")
    def _():
        kw = dict(model=MODEL, messages=[{"role": "user", "content": "What is 2 + 2?"}], think=True,
                  options={**GREEDY, "num_predict": 24})
        r = client.chat(**kw)
        assert r.message.thinking and r.message.content, r
        parts = list(client.chat(stream=True, **kw))
        thinking = "".join(p.message.thinking or "" for p in parts)
        content = "".join(p.message.content for p in parts)
        assert thinking == r.message.thinking and content == r.message.content, (parts, r)


{"protocol": protocol, "thinking": thinking}[GROUP]()
