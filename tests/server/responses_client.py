"""Drives a running `minfer serve` with the official openai client's Responses API.

Usage: python responses_client.py BASE_URL GROUP
  GROUP protocol: plain and streamed responses, a function call round trip, structured output,
                  llama-server's telemetry, errors (any model: greedy outputs are compared with
                  each other, never judged)
  GROUP thinking: a server whose template opens the reasoning: a reasoning item, whole and
                  streamed

Prints one line per check; exits non-zero with the failing assertion. tests/server_apis.rs runs it.
"""

import json
import sys

import openai
from openai import OpenAI
from checks import check

BASE, GROUP = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)
MODEL = "served-model"
INPUT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write a haiku about the sea."}]
GREEDY = {"temperature": 0, "extra_body": {"top_k": 1}}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string", "maxLength": 12}},
        "required": ["location"],
        "additionalProperties": False,
    },
}


def protocol():
    @check("a response has OpenAI's shape, its output text and usage")
    def _():
        r = client.responses.create(model=MODEL, input=INPUT, max_output_tokens=6, **GREEDY)
        assert r.id.startswith("resp_") and r.object == "response", r
        assert r.output[0].type == "message" and r.output[0].id.startswith("msg_"), r.output
        assert r.output_text == r.output[0].content[0].text, r
        # Six tokens were all it could say: incomplete, as OpenAI reports it.
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
        assert r.usage.output_tokens == 6 and r.usage.input_tokens > 0, r.usage
        plain = client.responses.create(model=MODEL, input="Hello", max_output_tokens=2, **GREEDY)
        assert plain.output_text is not None, plain

    @check("a stream's typed events add up to the response it completes with")
    def _():
        whole = client.responses.create(model=MODEL, input=INPUT, max_output_tokens=12, **GREEDY)
        events = list(client.responses.create(model=MODEL, input=INPUT, max_output_tokens=12, stream=True, **GREEDY))
        kinds = [e.type for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"], kinds
        assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
        assert [e.sequence_number for e in events] == list(range(len(events))), events
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        final = events[-1].response
        assert text == final.output_text == whole.output_text, (text, final.output_text, whole.output_text)
        added = next(e for e in events if e.type == "response.output_item.added")
        assert all(e.item_id == added.item.id for e in events if e.type == "response.output_text.delta"), events
        # The SDK's stream helper reads the same events (its get_final_response wants
        # response.completed, which a reply cut by max_output_tokens is not, as with OpenAI).
        with client.responses.stream(model=MODEL, input=INPUT, max_output_tokens=12, **GREEDY) as stream:
            seen = list(stream)
        assert seen[-1].type == "response.incomplete", seen[-1]
        assert seen[-1].response.output_text == whole.output_text, (seen[-1], whole)

    @check("a required function is called, and its output answered")
    def _():
        r = client.responses.create(
            model=MODEL,
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
            max_output_tokens=64,
            **GREEDY,
        )
        calls = [o for o in r.output if o.type == "function_call"]
        assert calls and calls[0].name == "get_weather", r.output
        args = json.loads(calls[0].arguments)
        assert isinstance(args["location"], str), args
        again = client.responses.create(
            model=MODEL,
            input=[
                {"role": "user", "content": "What is the weather in Paris?"},
                {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": "20 C"},
            ],
            tools=[WEATHER],
            max_output_tokens=8,
            **GREEDY,
        )
        assert again.output and again.usage.input_tokens > r.usage.input_tokens, again

    @check("a streamed function call is an item with its arguments as deltas")
    def _():
        events = list(
            client.responses.create(
                model=MODEL,
                input="Weather in Oslo?",
                tools=[WEATHER],
                tool_choice={"type": "function", "name": "get_weather"},
                max_output_tokens=64,
                stream=True,
                **GREEDY,
            )
        )
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
        assert done and done[0].arguments == deltas and "location" in json.loads(deltas), events

    @check("text.format json_schema makes the output follow the schema")
    def _():
        schema = {
            "type": "object",
            "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
            "required": ["answer"],
            "additionalProperties": False,
        }
        r = client.responses.create(
            model=MODEL,
            input=INPUT,
            text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
            max_output_tokens=32,
            **GREEDY,
        )
        assert json.loads(r.output_text)["answer"] in ("yes", "no"), r.output_text

    @check("llama-server's telemetry rides on the events when asked for")
    def _():
        events = list(
            client.responses.create(
                model=MODEL,
                input="This is a test " * 10,
                max_output_tokens=4,
                stream=True,
                extra_body={"timings_per_token": True, "return_progress": True},
            )
        )
        progress = [e for e in events if getattr(e, "prompt_progress", None)]
        assert progress and all(e.type == "response.in_progress" for e in progress), events
        assert any(e.type == "response.output_text.delta" and getattr(e, "timings", None) for e in events), events
        assert getattr(events[-1], "timings", None), events[-1]

    @check("what minfer does not do is refused by name, in OpenAI's error shape")
    def _():
        def refused(expect, **kw):
            try:
                client.responses.create(model=MODEL, **kw)
            except openai.BadRequestError as e:
                assert e.status_code == 400 and expect in e.body["message"], (expect, e.body)
                return
            raise AssertionError(f"not refused: {kw}")

        refused("previous_response_id", input="x", previous_response_id="resp_1")
        refused("web_search", input="x", tools=[{"type": "web_search"}])
        refused("input_image", input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}])
        refused("input", input=12)


def thinking():
    @check("a thinking model's reasoning is a reasoning item before the message")
    def _():
        kw = dict(model=MODEL, input="What is 2 + 2?", max_output_tokens=24, temperature=0,
                  extra_body={"top_k": 1, "reasoning_budget_tokens": 5})
        r = client.responses.create(**kw)
        kinds = [o.type for o in r.output]
        assert kinds == ["reasoning", "message"], r.output
        events = list(client.responses.create(stream=True, **kw))
        reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert reasoning == r.output[0].content[0].text and text == r.output_text, (events, r)


{"protocol": protocol, "thinking": thinking}[GROUP]()
