"""Structured output against a running `minfer serve`, judged by independent validators.

Usage: python structured_outputs.py BASE_URL GROUP [options]
  GROUP schemas: JSON schemas of growing difficulty x seeds at temperature 0.8 through
                 response_format json_schema; every reply that finishes must validate with the
                 jsonschema package (formats checked). --schemas N and --seeds N choose the
                 share (all 20 x 5 by default), --compare also asks without the constraint (the
                 schema only in the prompt) and reports how many of those replies fail.
  GROUP helper:  the openai client's own structured-output helper (chat.completions.parse with
                 a pydantic model), which sends a strict json_schema and parses the reply.
  GROUP tools:   --requests N (default 50) requests with tool_choice "required" against three
                 tools: every call's arguments must parse and validate against its tool's schema.
  GROUP gbnf:    GBNF grammars (arithmetic expressions, a small CSV) through /completion's
                 `grammar` field: every output must parse (checked by a parser written here).

Prints one line per check and a summary; exits non-zero on the first failure. tests/structured_output.rs
runs a share in CI; the full sweep is `python structured_outputs.py URL schemas --compare`.
"""

import argparse
import json
import re
import sys
import urllib.request

import jsonschema
from openai import OpenAI

parser = argparse.ArgumentParser()
parser.add_argument("base")
parser.add_argument("group", choices=["schemas", "helper", "tools", "gbnf"])
parser.add_argument("--schemas", type=int, default=20)
parser.add_argument("--seeds", type=int, default=5)
parser.add_argument("--requests", type=int, default=50)
parser.add_argument("--max-tokens", type=int, default=400)
parser.add_argument("--compare", action="store_true")
args = parser.parse_args()

client = OpenAI(base_url=args.base + "/v1", api_key="unused", max_retries=0, timeout=600)
MODEL = client.models.list().data[0].id

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
    "required": ["name", "age"],
    "additionalProperties": False,
}

# (what to ask for, schema), easiest first.
SCHEMAS = [
    ("a yes/no answer to: is water wet?", {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]}),
    ("a person", PERSON),
    ("a colour", {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"], "additionalProperties": False}),
    ("a temperature reading", {"type": "object", "properties": {"celsius": {"type": "number", "minimum": -90, "maximum": 60}, "city": {"type": "string", "maxLength": 40}}, "required": ["celsius", "city"], "additionalProperties": False}),
    ("a shopping list", {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 2, "maxItems": 5}}, "required": ["items"], "additionalProperties": False}),
    ("a book", {"type": "object", "properties": {"title": {"type": "string"}, "year": {"type": "integer", "minimum": 1450, "maximum": 2030}, "isbn": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{10}$"}}, "required": ["title", "year", "isbn"], "additionalProperties": False}),
    ("a user account", {"type": "object", "properties": {"email": {"type": "string", "format": "email"}, "id": {"type": "string", "format": "uuid"}}, "required": ["email", "id"], "additionalProperties": False}),
    ("an event", {"type": "object", "properties": {"name": {"type": "string", "maxLength": 60}, "date": {"type": "string", "format": "date"}, "attendees": {"type": "integer", "minimum": 1, "maximum": 1000}}, "required": ["name", "date", "attendees"], "additionalProperties": False}),
    ("a server", {"type": "object", "properties": {"host": {"type": "string", "format": "ipv4"}, "port": {"type": "integer", "minimum": 1, "maximum": 65535}, "tls": {"type": "boolean"}}, "required": ["host", "port"], "additionalProperties": False}),
    ("a product with optional fields", {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{4}$"}, "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 10000}, "discount": {"type": "number", "minimum": 0, "maximum": 1}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}}, "required": ["sku", "price"], "additionalProperties": False}),
    ("a point in 3D", {"type": "object", "properties": {"point": {"type": "array", "items": {"type": "number"}, "minItems": 3, "maxItems": 3}}, "required": ["point"], "additionalProperties": False}),
    ("a team of people", {"type": "object", "properties": {"team": {"type": "string", "maxLength": 40}, "members": {"type": "array", "items": PERSON, "minItems": 1, "maxItems": 3}}, "required": ["team", "members"], "additionalProperties": False}),
    ("an address", {"type": "object", "properties": {"street": {"type": "string", "maxLength": 60}, "city": {"type": "string", "maxLength": 40}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "country": {"enum": ["US", "FR", "DE", "JP"]}}, "required": ["street", "city", "zip", "country"], "additionalProperties": False}),
    ("a company with an address", {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "founded": {"type": "integer", "minimum": 1800, "maximum": 2026}, "hq": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}, "country": {"type": "string", "maxLength": 40}}, "required": ["city", "country"], "additionalProperties": False}}, "required": ["name", "founded", "hq"], "additionalProperties": False}),
    ("a shape (a circle or a rectangle)", {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0}}, "required": ["kind", "radius"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "rectangle"}, "width": {"type": "number", "minimum": 0}, "height": {"type": "number", "minimum": 0}}, "required": ["kind", "width", "height"], "additionalProperties": False}]}),
    ("a family tree node with references", {"$defs": {"person": PERSON}, "type": "object", "properties": {"parent": {"$ref": "#/$defs/person"}, "children": {"type": "array", "items": {"$ref": "#/$defs/person"}, "maxItems": 3}}, "required": ["parent", "children"], "additionalProperties": False}),
    ("an HTTP response", {"type": "object", "properties": {"status": {"type": "integer", "enum": [200, 201, 400, 404, 500]}, "headers": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 60}, "maxProperties": 4}, "body": {"type": ["string", "null"], "maxLength": 80}}, "required": ["status", "headers", "body"], "additionalProperties": False}),
    ("a matrix of small integers", {"type": "object", "properties": {"rows": {"type": "array", "minItems": 2, "maxItems": 3, "items": {"type": "array", "minItems": 2, "maxItems": 3, "items": {"type": "integer", "minimum": -9, "maximum": 9}}}}, "required": ["rows"], "additionalProperties": False}),
    ("a recursive comment thread", {"$defs": {"comment": {"type": "object", "properties": {"author": {"type": "string", "maxLength": 20}, "text": {"type": "string", "maxLength": 80}, "replies": {"type": "array", "items": {"$ref": "#/$defs/comment"}, "maxItems": 2}}, "required": ["author", "text", "replies"], "additionalProperties": False}}, "$ref": "#/$defs/comment"}),
    ("an order", {"type": "object", "properties": {
        "order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
        "customer": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "email": {"type": "string", "format": "email"}}, "required": ["name", "email"], "additionalProperties": False},
        "lines": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{4}$"}, "qty": {"type": "integer", "minimum": 1, "maximum": 99}, "unit_price": {"type": "number", "minimum": 0}}, "required": ["sku", "qty", "unit_price"], "additionalProperties": False}},
        "status": {"enum": ["pending", "paid", "shipped"]},
        "placed": {"type": "string", "format": "date"}},
        "required": ["order_id", "customer", "lines", "status", "placed"], "additionalProperties": False}),
]


def validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def ask(what, schema, seed, constrained):
    messages = [{"role": "user", "content": f"Write {what} as JSON following this JSON schema, and nothing else:\n{json.dumps(schema)}"}]
    extra = {}
    if constrained:
        extra["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": schema}}
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0.8, seed=seed,
                                       max_tokens=args.max_tokens, **extra)
    return r.choices[0]


def judge(text, schema):
    """None when `text` is a JSON document valid under `schema`, else why not."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not JSON: {e}"
    errors = sorted(validator(schema).iter_errors(value), key=str)
    return errors[0].message if errors else None


def schemas():
    counts = {True: {"finished": 0, "valid": 0, "truncated": 0}, False: {"finished": 0, "valid": 0, "truncated": 0}}
    modes = [True, False] if args.compare else [True]
    for i, (what, schema) in enumerate(SCHEMAS[: args.schemas]):
        validator(schema).check_schema(schema)
        for seed in range(args.seeds):
            for constrained in modes:
                c = ask(what, schema, seed, constrained)
                tally = counts[constrained]
                if c.finish_reason == "length":
                    tally["truncated"] += 1
                    continue
                tally["finished"] += 1
                why = judge(c.message.content, schema)
                if why is None:
                    tally["valid"] += 1
                elif constrained:
                    sys.exit(f"FAIL schema {i} ({what}) seed {seed}: {why}\n{c.message.content}")
        print(f"ok: schema {i} ({what})", flush=True)
    runs = args.schemas * args.seeds
    c = counts[True]
    print(f"constrained: {runs} runs, {c['finished']} finished, {c['valid']} valid, {c['truncated']} hit max_tokens ({100 * c['truncated'] / runs:.1f} %)")
    if args.compare:
        u = counts[False]
        print(f"unconstrained: {runs} runs, {u['finished']} finished, {u['valid']} valid, "
              f"{u['finished'] - u['valid']} invalid, {u['truncated']} hit max_tokens")
    if c["truncated"] * 20 > runs:
        sys.exit(f"FAIL: {c['truncated']} of {runs} constrained runs hit max_tokens (5 % allowed)")


def helper():
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str
        population: int

    r = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Describe Paris as JSON with name, country and population."}],
                                      response_format=City, temperature=0.8, seed=1, max_tokens=args.max_tokens)
    city = r.choices[0].message.parsed
    assert isinstance(city, City), r
    print(f"ok: the openai client's parse helper gets a valid City: {city!r}")

    # Streamed, the pieces join into a valid document.
    what, schema = SCHEMAS[5]
    chunks = client.chat.completions.create(
        model=MODEL, stream=True, temperature=0.8, seed=2, max_tokens=args.max_tokens,
        messages=[{"role": "user", "content": f"Write {what} as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "book", "schema": schema}})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    why = judge(text, schema)
    assert why is None, f"streamed: {why}: {text}"
    print("ok: a streamed json_schema reply validates")

    # The legacy completions endpoint takes response_format too.
    what, schema = SCHEMAS[3]
    r = client.completions.create(model=MODEL, prompt=f"Write {what} as JSON: ", temperature=0.8, seed=3,
                                  max_tokens=args.max_tokens,
                                  extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}})
    assert r.choices[0].finish_reason == "stop", r
    why = judge(r.choices[0].text, schema)
    assert why is None, f"completions: {why}: {r.choices[0].text}"
    print("ok: /v1/completions with json_schema gives a valid document")


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "convert_currency", "description": "Convert an amount between currencies",
     "parameters": {"type": "object", "properties": {"amount": {"type": "number", "minimum": 0}, "from": {"type": "string", "pattern": "^[A-Z]{3}$"}, "to": {"type": "string", "pattern": "^[A-Z]{3}$"}},
                    "required": ["amount", "from", "to"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "schedule_meeting", "description": "Put a meeting in the calendar",
     "parameters": {"type": "object", "properties": {"title": {"type": "string", "maxLength": 60}, "date": {"type": "string", "format": "date"}, "attendees": {"type": "array", "items": {"type": "string", "format": "email"}, "minItems": 1, "maxItems": 4}},
                    "required": ["title", "date", "attendees"], "additionalProperties": False}}},
]
QUESTIONS = ["How warm is it in Lisbon?", "Turn 120 dollars into euros.", "Set up a call with ana@example.com next Monday.",
             "Tell me a joke.", "What is 2 + 2?"]


def tools():
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    used = {}
    for i in range(args.requests):
        q = QUESTIONS[i % len(QUESTIONS)]
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": q}], tools=TOOLS,
                                           tool_choice="required", temperature=0.8, seed=i, max_tokens=args.max_tokens)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls, f"request {i}: {c}"
        for call in c.message.tool_calls:
            name = call.function.name
            assert name in schemas, f"request {i}: unknown tool {name}"
            why = judge(call.function.arguments, schemas[name])
            assert why is None, f"request {i}: {name}({call.function.arguments}): {why}"
            used[name] = used.get(name, 0) + 1
    print(f"ok: {args.requests} forced tool calls, every arguments string valid; calls per tool: {used}")


def arithmetic_parses(text):
    """A recursive-descent parser of the grammar below, independent of it."""
    pos = 0

    def expr():
        nonlocal pos
        term()
        while pos < len(text) and text[pos] in "+-*/":
            pos += 1
            term()

    def term():
        nonlocal pos
        if pos < len(text) and text[pos] == "(":
            pos += 1
            expr()
            assert pos < len(text) and text[pos] == ")", f"expected ) at {pos}"
            pos += 1
            return
        start = pos
        while pos < len(text) and text[pos].isdigit():
            pos += 1
        assert 1 <= pos - start <= 4, f"expected a number at {start}"

    expr()
    assert pos == len(text), f"trailing text at {pos}"


ARITHMETIC = 'root ::= expr\nexpr ::= term ([-+*/] term){0,6}\nterm ::= [0-9]{1,4} | "(" expr ")"\n'
CSV = 'root ::= header row{1,3}\nheader ::= "name,qty,price\\n"\nrow ::= name "," [0-9]{1,3} "," [0-9]{1,4} "." [0-9]{2} "\\n"\nname ::= [a-z]{1,12}\n'
CSV_ROW = re.compile(r"^[a-z]{1,12},[0-9]{1,3},[0-9]{1,4}\.[0-9]{2}$")


def completion(prompt, grammar, seed):
    body = json.dumps({"prompt": prompt, "grammar": grammar, "temperature": 0.8, "seed": seed, "n_predict": args.max_tokens}).encode()
    req = urllib.request.Request(args.base + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def gbnf():
    for seed in range(args.seeds):
        r = completion("Write an arithmetic expression: ", ARITHMETIC, seed)
        assert r["stop_type"] == "eos", r
        arithmetic_parses(r["content"])
        r = completion("A CSV of groceries with a header:\n", CSV, seed)
        assert r["stop_type"] == "eos", r
        lines = r["content"].split("\n")
        assert lines[0] == "name,qty,price" and lines[-1] == "", r["content"]
        assert all(CSV_ROW.match(line) for line in lines[1:-1]), r["content"]
    print(f"ok: {args.seeds} arithmetic expressions and {args.seeds} CSV tables parse")


{"schemas": schemas, "helper": helper, "tools": tools, "gbnf": gbnf}[args.group]()
