#!/usr/bin/env python3
"""Extract llama.cpp's whole flag table from its `common/arg.cpp` (every `add_opt(common_arg(...))`):
each option's names and negated names, whether it takes a value (from its handler's parameter:
none, `bool value` for a `--x`/`--no-x` pair, or an int/float/string value) and the examples
(programs) it is set for. Writes JSON lines to stdout, one option a line, in arg.cpp's order:

    python3 scripts/llama_cpp_flags.py $LLAMA_CPP/common/arg.cpp > tests/fixtures/cli/llama_cpp_flags.jsonl

The flag table of `src/bin/minfer/cli/llama_flags.rs` is checked against this list by its tests
(every name there, none missing).
"""
import json
import re
import sys

src = open(sys.argv[1]).read()
out = []
for m in re.finditer(r"add_opt\(common_arg\(", src):
    i = m.end()
    # The option's whole call: up to the `);` closing add_opt, by parenthesis depth.
    depth, j = 2, i
    in_str = False
    while depth and j < len(src):
        c = src[j]
        if in_str:
            if c == "\\":
                j += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        j += 1
    # Comments inside the call say nothing about the option.
    call = re.sub(r"//[^\n]*", "", src[i:j])
    lists = re.match(r"\s*(\{[^}]*\})\s*,\s*(\{[^}]*\}\s*,)?", call)
    names = re.findall(r'"([^"]+)"', lists.group(1))
    negs = re.findall(r'"([^"]+)"', lists.group(2) or "")
    lam = re.search(r"\[\]\s*\(([^)]*)\)", call)
    params = lam.group(1) if lam else ""
    if "," not in params:
        kind = "flag"
    elif re.search(r",\s*bool\b", params):
        kind = "bool"
    else:
        kind = "value"
    value_hint = None
    if kind == "value":
        rest = call[lists.end():]
        hint = re.match(r'\s*"([^"]*)"\s*,', rest)
        value_hint = hint.group(1) if hint else None
    examples = re.findall(r"LLAMA_EXAMPLE_[A-Z_]+", " ".join(re.findall(r"set_examples\(\{([^}]*)\}\)", call)))
    excluded = re.findall(r"LLAMA_EXAMPLE_[A-Z_]+", " ".join(re.findall(r"set_excludes\(\{([^}]*)\}\)", call)))
    env = re.findall(r'set_env\("([^"]+)"\)', call)
    out.append({"names": names, "negated": negs, "kind": kind, "value": value_hint,
                "examples": [e[len("LLAMA_EXAMPLE_"):].lower() for e in examples],
                "excludes": [e[len("LLAMA_EXAMPLE_"):].lower() for e in excluded], "env": env})
for o in out:
    print(json.dumps(o))
