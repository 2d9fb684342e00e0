"""Drives a running `minfer serve` with the official openai client and asserts the API's shape.

Usage: python openai_client.py BASE_URL GROUP [API_KEY]
  GROUP protocol: fast checks of every endpoint's shape (any model; outputs are not judged)
  GROUP real:     tool calls and multi-turn prefix reuse, with Qwen2.5-Coder-0.5B-Instruct
  GROUP auth:     a server started with --api-key API_KEY

Prints one line per check; exits non-zero with the failing assertion. tests/server.rs runs it.
"""

import json
import sys
import time

import openai
from openai import OpenAI
from checks import check

BASE, GROUP = sys.argv[1], sys.argv[2]
KEY = sys.argv[3] if len(sys.argv) > 3 else "unused"
client = OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id if GROUP != "auth" else "any"
USER = [{"role": "user", "content": "Write a haiku about the sea."}]


def stream_chat(**kw):
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, **kw))
    return chunks


def expect_error(cls, status, field, f):
    try:
        f()
    except cls as e:
        assert e.status_code == status, (e.status_code, e)
        body = e.body if isinstance(e.body, dict) else {}
        message = body.get("message", "") if body else str(e)
        assert field in message, (field, message)
        assert body.get("type"), body
        return
    raise AssertionError(f"expected {cls.__name__} ({status}) about {field}")


def protocol():
    @check("models lists the served model")
    def _():
        models = client.models.list().data
        assert len(models) == 1 and models[0].object == "model", models

    @check("a chat completion has OpenAI's shape and usage")
    def _():
        r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, temperature=0)
        assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
        c = r.choices[0]
        assert c.index == 0 and c.message.role == "assistant" and isinstance(c.message.content, str)
        assert c.finish_reason in ("stop", "length"), c.finish_reason
        assert 1 <= r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 5
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        if c.finish_reason == "length":
            assert r.usage.completion_tokens == 8

    @check("every role and the array-of-text-parts content form are accepted")
    def _():
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Answer in English."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            {"role": "user", "content": "Thanks"},
        ]
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
        assert r.choices[0].message.role == "assistant"

    @check("streaming sends the role, content deltas, the finish reason, usage, then [DONE]")
    def _():
        whole = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=12, temperature=0)
        chunks = stream_chat(messages=USER, max_tokens=12, temperature=0, stream_options={"include_usage": True})
        assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == [whole.choices[0].finish_reason], finishes
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
        assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)
        plain = stream_chat(messages=USER, max_tokens=3, temperature=0)
        assert all(c.usage is None for c in plain) and plain[-1].choices[0].finish_reason

    @check("max_completion_tokens limits the completion like max_tokens")
    def _():
        r = client.chat.completions.create(model=MODEL, messages=USER, max_completion_tokens=3, temperature=0)
        assert r.usage.completion_tokens <= 3

    @check("n gives n indexed choices, and a seed makes sampling repeatable")
    def _():
        kw = dict(model=MODEL, messages=USER, max_tokens=6, temperature=1.0, top_p=0.9, seed=7, n=3, extra_body={"top_k": 50})
        a = client.chat.completions.create(**kw)
        b = client.chat.completions.create(**kw)
        assert [c.index for c in a.choices] == [0, 1, 2]
        assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
        chunks = stream_chat(messages=USER, max_tokens=4, temperature=1.0, seed=7, n=2)
        assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}

    @check("the sampling fields are accepted")
    def _():
        client.chat.completions.create(
            model=MODEL, messages=USER, max_tokens=4, temperature=0.7, top_p=0.5, frequency_penalty=0.5,
            presence_penalty=0.5, seed=1, extra_body={"top_k": 5, "repeat_penalty": 1.2})

    @check("a stop string ends the completion before it")
    def _():
        whole = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=16, temperature=0)
        text = whole.choices[0].message.content
        if len(text) >= 4:
            stop = text[len(text) // 2:len(text) // 2 + 2]
            r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=16, temperature=0, stop=[stop, "zzz"])
            assert r.choices[0].message.content == text[:text.index(stop)], (r.choices[0].message.content, stop)
            assert r.choices[0].finish_reason == "stop"

    @check("logprobs report the chosen token and sorted alternatives")
    def _():
        r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        assert len(content) == r.usage.completion_tokens or r.choices[0].finish_reason == "stop"
        for t in content:
            tops = [x.logprob for x in t.top_logprobs]
            assert len(tops) == 3 and tops == sorted(tops, reverse=True) and t.logprob <= 0
            # Greedy: the chosen token is the most likely one.
            assert abs(t.logprob - tops[0]) < 1e-6, (t.logprob, tops)
        chunks = stream_chat(messages=USER, max_tokens=4, temperature=0, logprobs=True, top_logprobs=1)
        streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
        assert len(streamed) >= 1

    @check("completions take a prompt string or list, stream, and report legacy logprobs")
    def _():
        r = client.completions.create(model=MODEL, prompt="def fib(n):", max_tokens=6, temperature=0)
        assert r.object == "text_completion" and r.choices[0].finish_reason in ("stop", "length")
        many = client.completions.create(model=MODEL, prompt=["a", "b c"], max_tokens=3, temperature=0, n=2)
        assert [c.index for c in many.choices] == [0, 1, 2, 3]
        ids = client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=2, temperature=0)
        assert ids.usage.prompt_tokens == 3
        chunks = list(client.completions.create(model=MODEL, prompt="def fib(n):", max_tokens=6, temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
        lp = client.completions.create(model=MODEL, prompt="x = ", max_tokens=3, temperature=0, logprobs=2)
        assert len(lp.choices[0].logprobs.tokens) == lp.usage.completion_tokens
        assert all(len(t) <= 2 for t in lp.choices[0].logprobs.top_logprobs)

    @check("bad requests are 400s in OpenAI's error shape, naming the field")
    def _():
        create = client.chat.completions.create
        expect_error(openai.BadRequestError, 400, "messages[0].role",
                     lambda: create(model=MODEL, messages=[{"role": "wizard", "content": "x"}]))
        expect_error(openai.BadRequestError, 400, "temperature",
                     lambda: create(model=MODEL, messages=USER, temperature="hot"))
        expect_error(openai.BadRequestError, 400, "messages",
                     lambda: create(model=MODEL, messages=[]))
        expect_error(openai.BadRequestError, 400, "messages[0].content",
                     lambda: create(model=MODEL, messages=[{"role": "user", "content": 5}]))
        # A prompt past the context is llama-server's exceed_context_size_error.
        expect_error(openai.BadRequestError, 400, "exceeds the available context size",
                     lambda: create(model=MODEL, messages=[{"role": "user", "content": "word " * 5000}]))
        try:
            create(model=MODEL, messages=[{"role": "user", "content": "word " * 5000}])
        except openai.BadRequestError as e:
            assert e.body["type"] == "exceed_context_size_error", e.body
            assert e.body["n_prompt_tokens"] >= e.body["n_ctx"], e.body
        expect_error(openai.BadRequestError, 400, "prompt",
                     lambda: client.completions.create(model=MODEL, prompt=[10**9]))

    @check("prefix reuse: a follow-up sharing the conversation prefills only its new tokens")
    def _():
        first = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, temperature=0)
        follow = USER + [{"role": "assistant", "content": first.choices[0].message.content},
                         {"role": "user", "content": "Another one."}]
        second = client.chat.completions.create(model=MODEL, messages=follow, max_tokens=4, temperature=0)
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached >= first.usage.prompt_tokens - 1, (cached, first.usage.prompt_tokens)


def real():
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    ask = [{"role": "system", "content": "You are a helpful assistant."},
           {"role": "user", "content": "What's the weather like in Paris today? Call the tool."}]

    @check("a tool call comes back as tool_calls with finish_reason tool_calls")
    def _():
        r = client.chat.completions.create(model=MODEL, messages=ask, tools=tools, max_tokens=40, temperature=0)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        call = c.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}

        # The call and its result go back through the template; the model answers in text.
        follow = ask + [c.message.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": call.id, "content": "{\"temperature_c\": 21}"}]
        r2 = client.chat.completions.create(model=MODEL, messages=follow, tools=tools, max_tokens=24, temperature=0)
        assert r2.choices[0].message.content, r2

    @check("a streamed tool call arrives as tool-call deltas")
    def _():
        chunks = stream_chat(messages=ask, tools=tools, max_tokens=40, temperature=0)
        deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert deltas and deltas[0].function.name == "get_weather", chunks
        args = "".join(d.function.arguments or "" for d in deltas)
        assert json.loads(args) == {"city": "Paris"}
        assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # A question the model would answer in text: only tool_choice makes it call.
    chat_only = [{"role": "user", "content": "What is 2+2? Answer with a number."}]
    more_tools = tools + [{"type": "function", "function": {
        "name": "translate", "description": "Translate text into a language",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}, "language": {"type": "string"}},
                       "required": ["text", "language"]}}}]

    def forced_calls(tool_choice, messages):
        r = client.chat.completions.create(model=MODEL, messages=messages, tools=more_tools, tool_choice=tool_choice,
                                           max_tokens=48, temperature=0)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls, c
        chunks = stream_chat(messages=messages, tools=more_tools, tool_choice=tool_choice, max_tokens=48, temperature=0)
        deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
        assert deltas and chunks[-1].choices[0].finish_reason == "tool_calls", chunks
        streamed = [(d.function.name, json.loads(d.function.arguments)) for d in deltas]
        whole = [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls]
        assert streamed == whole, (streamed, whole)
        assert all(isinstance(args, dict) for _, args in whole), whole
        return whole

    @check("tool_choice required makes a call where the model would have answered in text")
    def _():
        free = client.chat.completions.create(model=MODEL, messages=chat_only, tools=more_tools, max_tokens=24, temperature=0)
        assert free.choices[0].finish_reason != "tool_calls", free
        calls = forced_calls("required", chat_only)
        assert calls[0][0] in ("get_weather", "translate"), calls
        print(f"    required: {calls}", flush=True)

    @check("tool_choice naming a function makes a call to that function, streamed and not")
    def _():
        calls = forced_calls({"type": "function", "function": {"name": "get_weather"}}, chat_only)
        assert calls[0][0] == "get_weather", calls
        print(f"    named: {calls}", flush=True)
        calls = forced_calls({"type": "function", "function": {"name": "translate"}}, ask)
        assert calls[0][0] == "translate", calls

    @check("tool_choice naming an unknown function is a 400 naming it")
    def _():
        expect_error(openai.BadRequestError, 400, "'rm_rf'",
                     lambda: client.chat.completions.create(
                         model=MODEL, messages=chat_only, tools=tools, max_tokens=4,
                         tool_choice={"type": "function", "function": {"name": "rm_rf"}}))

    @check("tool_choice none leaves the tools out")
    def _():
        r = client.chat.completions.create(model=MODEL, messages=ask, tools=tools, tool_choice="none", max_tokens=4, temperature=0)
        assert r.usage.prompt_tokens < 60, r.usage

    @check("a multi-turn chat reuses the slot's KV: time to first token with and without reuse")
    def _():
        conversation = [{"role": "system", "content": "You are a helpful assistant. " * 40},
                        {"role": "user", "content": "Name a prime number."}]

        def ttft(messages):
            start = time.perf_counter()
            first = None
            text = ""
            usage = None
            for c in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}):
                if c.choices and c.choices[0].delta.content and first is None:
                    first = time.perf_counter() - start
                if c.choices:
                    text += c.choices[0].delta.content or ""
                usage = c.usage or usage
            return first, text, usage

        cold, text, u1 = ttft(conversation)
        conversation += [{"role": "assistant", "content": text}, {"role": "user", "content": "And another?"}]
        warm, _, u2 = ttft(conversation)
        cached = u2.prompt_tokens_details.cached_tokens
        print(f"    prompt {u1.prompt_tokens} tokens cold: ttft {cold:.3f} s; follow-up prompt {u2.prompt_tokens} "
              f"tokens, {cached} cached: ttft {warm:.3f} s", flush=True)
        assert cached >= u1.prompt_tokens - 1, (cached, u1)
        assert warm < cold, (warm, cold)


def auth():
    bad = OpenAI(base_url=BASE + "/v1", api_key="wrong", max_retries=0)
    expect_error(openai.AuthenticationError, 401, "API key",
                 lambda: bad.chat.completions.create(model="m", messages=USER, max_tokens=1))
    print("ok: a wrong API key is a 401")
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=2)
    assert r.choices
    print("ok: the right API key is accepted")


{"protocol": protocol, "real": real, "auth": auth}[GROUP]()
print("all ok")
