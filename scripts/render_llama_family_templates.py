#!/usr/bin/env python3
"""Render the chat templates of the llama and gemma families (as collected in llama.cpp 0c1e570's
`models/templates/`) with Hugging Face transformers, for tests/chat_template.rs: the seven
conversations of tests/fixtures/chat/chat_templates.jsonl, each template, the output or
transformers' error, written to tests/fixtures/chat/chat_templates_llama.jsonl; the templates are
copied to tests/fixtures/chat/templates/.

    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install transformers==5.24.0
    /tmp/tv/bin/python scripts/render_llama_family_templates.py LLAMA_CPP/models/templates

Special tokens render as nothing, as in the existing set. `date_string` is passed ("26 Jul 2024")
so that Llama 3.x's templates print a fixed date; a template that reads the clock itself
(`strftime_now`) is rendered at two frozen instants and, where the outputs differ, its cases are
marked `"date_dependent": true` (the tests then require only that minfer renders them, or fails
as transformers does).
"""
import json, shutil, sys
from pathlib import Path
from datetime import datetime
import transformers.utils.chat_template_utils as ctu

TEMPLATES = [
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "meta-llama-Llama-3.3-70B-Instruct.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja",
    "unsloth-mistral-Devstral-Small-2507.jinja",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
    "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "ibm-granite-granite-4.0.jinja",
    "HuggingFaceTB-SmolLM3-3B.jinja",
    "fireworks-ai-llama-3-firefunction-v2.jinja",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "meetkai-functionary-medium-v3.1.jinja",
    # Gemma's turn format (Gemma 2's, which Gemma 3 shares): a system prompt folded into the
    # first user turn, raise_exception on roles that do not alternate.
    "google-gemma-2-2b-it.jinja",
]

root = Path(__file__).resolve().parent.parent
src_dir = Path(sys.argv[1])
chat = root / "tests/fixtures/chat"
conversations = []
seen = set()
for line in open(chat / "chat_templates.jsonl"):
    c = json.loads(line)
    if c["name"] not in seen:
        seen.add(c["name"])
        conversations.append(c)

def render(source, c, when):
    # transformers' strftime_now calls its module's `datetime.now()` at render time.
    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return when
    ctu.datetime = Frozen
    extra = dict(c["extra"] or {})
    extra["date_string"] = "26 Jul 2024"
    try:
        out = ctu.render_jinja_template(
            conversations=[c["messages"]], tools=c["tools"], chat_template=source,
            add_generation_prompt=c["add_generation_prompt"], bos_token="", eos_token="", **extra)
        out = out[0] if isinstance(out, tuple) else out
        return (out[0] if isinstance(out, list) else out), None
    except Exception as e:
        return None, str(e)

with open(chat / "chat_templates_llama.jsonl", "w") as f:
    for name in TEMPLATES:
        source = (src_dir / name).read_text()
        shutil.copy(src_dir / name, chat / "templates" / name)
        for c in conversations:
            a = render(source, c, datetime(2025, 3, 14, 9, 26, 53))
            b = render(source, c, datetime(2026, 11, 2, 17, 5, 9))
            extra = dict(c["extra"] or {})
            extra["date_string"] = "26 Jul 2024"
            f.write(json.dumps({
                "template": name, "name": c["name"], "messages": c["messages"], "tools": c["tools"],
                "add_generation_prompt": c["add_generation_prompt"], "extra": extra,
                "rendered": a[0], "error": a[1], "date_dependent": a != b,
            }, ensure_ascii=False) + "\n")
print("wrote", chat / "chat_templates_llama.jsonl")
