"""Drives a running `minfer serve` with the official anthropic client (Messages API).

Usage: python anthropic_client.py BASE_URL GROUP [API_KEY]
  GROUP protocol: shapes, streaming, count_tokens, a tool round trip, stop sequences, errors
                  (any model: greedy outputs are compared with each other, never judged)
  GROUP thinking: a server whose template opens the reasoning, with a reasoning budget: thinking
                  blocks whole and streamed
  GROUP auth:     a server started with --api-key API_KEY (the client sends it as X-Api-Key)

Prints one line per check; exits non-zero with the failing assertion. tests/server_apis.rs runs it.
"""

import json
import sys

import anthropic
from checks import check

BASE, GROUP = sys.argv[1], sys.argv[2]
KEY = sys.argv[3] if len(sys.argv) > 3 else "unused"
client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
MODEL = "served-model"
USER = [{"role": "user", "content": "Write a haiku about the sea."}]
# Sampling fields are not the current SDK's keywords; the server reads them from the body.
GREEDY = {"extra_body": {"temperature": 0, "top_k": 1}}
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"location": {"type": "string", "maxLength": 12}},
        "required": ["location"],
        "additionalProperties": False,
    },
}


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def protocol():
    @check("a message has Anthropic's shape and usage")
    def _():
        m = client.messages.create(model=MODEL, max_tokens=6, messages=USER, system="Be brief.", **GREEDY)
        assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), m
        assert m.content[0].type == "text", m.content
        assert m.stop_reason in ("max_tokens", "end_turn"), m.stop_reason
        assert m.usage.output_tokens <= 6 and m.usage.input_tokens > 0, m.usage
        assert m.usage.cache_read_input_tokens is not None, m.usage

    @check("a stream's text deltas add up to the message, and both equal the whole answer")
    def _():
        whole = client.messages.create(model=MODEL, max_tokens=12, messages=USER, **GREEDY)
        with client.messages.stream(model=MODEL, max_tokens=12, messages=USER, **GREEDY) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert streamed == text_of(final) == text_of(whole), (streamed, final, whole)
        assert final.stop_reason == whole.stop_reason, (final, whole)
        assert final.usage.output_tokens == whole.usage.output_tokens, (final.usage, whole.usage)

    @check("the raw event sequence is message_start, one block, message_delta, message_stop")
    def _():
        events = list(client.messages.create(model=MODEL, max_tokens=4, messages=USER, stream=True, **GREEDY))
        kinds = [e.type for e in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
        assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop", kinds
        assert events[0].message.usage.input_tokens > 0, events[0]
        assert events[-2].usage.output_tokens == 4, events[-2]

    @check("count_tokens counts the prompt a message reads")
    def _():
        counted = client.messages.count_tokens(model=MODEL, messages=USER, system="Be brief.")
        m = client.messages.create(model=MODEL, max_tokens=1, messages=USER, system="Be brief.", **GREEDY)
        assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens, (counted, m.usage)

    @check("a required tool is called with input that follows its schema, and its result answered")
    def _():
        m = client.messages.create(
            model=MODEL,
            max_tokens=64,
            tools=[WEATHER],
            tool_choice={"type": "any"},
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            **GREEDY,
        )
        calls = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and len(calls) >= 1, m
        call = calls[0]
        assert call.name == "get_weather" and isinstance(call.input["location"], str), call
        again = client.messages.create(
            model=MODEL,
            max_tokens=8,
            tools=[WEATHER],
            messages=[
                {"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": m.content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "20 C"}]},
            ],
            **GREEDY,
        )
        assert again.type == "message" and again.content, again

    @check("a streamed tool call is a tool_use block with its input as JSON deltas")
    def _():
        with client.messages.stream(
            model=MODEL,
            max_tokens=64,
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather"},
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            **GREEDY,
        ) as stream:
            final = stream.get_final_message()
        calls = [b for b in final.content if b.type == "tool_use"]
        assert final.stop_reason == "tool_use" and calls and "location" in calls[0].input, final

    @check("a stop sequence ends the text before it and is named")
    def _():
        whole = text_of(client.messages.create(model=MODEL, max_tokens=16, messages=USER, **GREEDY))
        stop = whole[len(whole) // 2 :][:3]
        assert stop.strip(), whole
        m = client.messages.create(model=MODEL, max_tokens=16, messages=USER, stop_sequences=["\x07", stop], **GREEDY)
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop, (m, stop)
        with client.messages.stream(model=MODEL, max_tokens=16, messages=USER, stop_sequences=["\x07", stop],
                                    **GREEDY) as s:
            streamed = s.get_final_message()
        assert streamed.stop_sequence == stop, (streamed, stop)
        assert text_of(m) == whole[: whole.index(stop)], (text_of(m), whole, stop)

    @check("output_config.format makes the answer follow its JSON schema")
    def _():
        schema = {
            "type": "object",
            "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
            "required": ["answer"],
            "additionalProperties": False,
        }
        m = client.messages.create(
            model=MODEL,
            max_tokens=32,
            messages=USER,
            output_config={"format": {"type": "json_schema", "schema": schema}},
            **GREEDY,
        )
        assert json.loads(text_of(m))["answer"] in ("yes", "no"), m

    @check("bad requests get Anthropic's error shape naming what is wrong")
    def _():
        def refused(expect, **kw):
            try:
                client.messages.create(model=MODEL, **kw)
            except anthropic.BadRequestError as e:
                assert e.status_code == 400, e
                assert e.body["type"] == "error", e.body
                assert e.body["error"]["type"] == "invalid_request_error", e.body
                assert expect in e.body["error"]["message"], (expect, e.body)
                return
            raise AssertionError(f"not refused: {kw}")

        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
        refused("image input is not supported", max_tokens=4, messages=[{"role": "user", "content": [image]}])
        refused("top_k", max_tokens=4, messages=USER, extra_body={"top_k": "x"})
        refused("messages[0].role", max_tokens=4, messages=[{"role": "robot", "content": "x"}])
        refused("tools[0]", max_tokens=4, messages=USER, tools=[{"type": "bash_20250124", "name": "bash"}])
        refused("messages[0].content[0].type", max_tokens=4, messages=[{"role": "user", "content": [{"type": "video"}]}])


def thinking():
    @check("a thinking model's reasoning is a thinking block, its answer a text block")
    def _():
        m = client.messages.create(
            model=MODEL,
            max_tokens=24,
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=[{"role": "user", "content": "What is 2 + 2?"}],
            extra_body={"reasoning_budget_tokens": 5, "temperature": 0, "top_k": 1},
        )
        kinds = [b.type for b in m.content]
        assert kinds[0] == "thinking" and "text" in kinds, m
        with client.messages.stream(
            model=MODEL,
            max_tokens=24,
            messages=[{"role": "user", "content": "What is 2 + 2?"}],
            extra_body={"reasoning_budget_tokens": 5, "temperature": 0, "top_k": 1},
        ) as stream:
            final = stream.get_final_message()
        assert [b.type for b in final.content] == kinds, (final, m)
        assert final.content[0].thinking == m.content[0].thinking, (final, m)
        assert text_of(final) == text_of(m), (final, m)


def auth():
    @check("the key is read from X-Api-Key")
    def _():
        m = client.messages.create(model=MODEL, max_tokens=2, messages=USER)
        assert m.type == "message"

    @check("a wrong key is an authentication_error in Anthropic's shape")
    def _():
        other = anthropic.Anthropic(base_url=BASE, api_key="wrong", max_retries=0)
        try:
            other.messages.create(model=MODEL, max_tokens=2, messages=USER)
        except anthropic.AuthenticationError as e:
            assert e.body["error"]["type"] == "authentication_error", e.body
            return
        raise AssertionError("a wrong key was accepted")


{"protocol": protocol, "thinking": thinking, "auth": auth}[GROUP]()
