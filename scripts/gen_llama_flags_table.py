#!/usr/bin/env python3
"""Write src/bin/minfer/cli/llama_flags_table.rs: what minfer makes of every flag of llama.cpp's
common/arg.cpp (llama-cli's and llama-server's), from tests/fixtures/cli/llama_cpp_flags.jsonl
(scripts/llama_cpp_flags.py's extraction). Each option's names — and its negated names, which
may act differently — get one action:

- `To("--x")`: minfer's own flag `--x` does what llama.cpp's does; the name is rewritten to it.
- `HfRepo`: `-hf REPO[:QUANT]` becomes the model `hf:REPO[:QUANT]`.
- `Ignore("why")`: accepted with a one-line notice, because minfer already behaves as asked.
- `Refuse("why")`: an error naming the flag and the reason.

The decisions are the tables below; an option they do not name is refused with the reason of
the llama.cpp program it belongs to. Run after changing them:

    python3 scripts/gen_llama_flags_table.py > src/bin/minfer/cli/llama_flags_table.rs
"""
import json
from pathlib import Path

root = Path(__file__).resolve().parent.parent
opts = [json.loads(l) for l in open(root / "tests/fixtures/cli/llama_cpp_flags.jsonl")]

TO, IGNORE, REFUSE, HF = "To", "Ignore", "Refuse", "HfRepo"

# Positive names -> action, keyed by any one of the option's names.
POS = {
    "--help": (TO, "--help"), "--version": (TO, "--version"),
    "--reasoning-format": (TO, "--reasoning-format"),
    "--reasoning-budget": (TO, "--reasoning-budget"),
    "--reasoning-budget-message": (TO, "--reasoning-budget-message"),
    "-t": (TO, "--threads"), "-c": (TO, "--ctx-size"), "-n": (TO, "--n-predict"),
    "-b": (TO, "--batch-size"), "-ub": (TO, "--ubatch-size"), "--keep": (TO, "--keep"),
    "--swa-full": (TO, "--swa-full"), "-fa": (TO, "--flash-attn"), "-p": (TO, "--prompt"),
    "-sys": (TO, "--system-prompt"), "-sysf": (TO, "--system-prompt-file"), "-f": (TO, "--file"),
    "-e": (TO, "--escape"), "--prompt-cache": (TO, "--session"), "-r": (TO, "--stop"),
    "-sp": (TO, "--special"), "-cnv": (TO, "--cnv"), "-st": (TO, "--single-turn"),
    "-co": (TO, "--color"), "--samplers": (TO, "--samplers"), "-s": (TO, "--seed"),
    "--ignore-eos": (TO, "--ignore-eos"), "--temp": (TO, "--temp"), "--top-k": (TO, "--top-k"),
    "--top-p": (TO, "--top-p"), "--min-p": (TO, "--min-p"), "--top-nsigma": (TO, "--top-n-sigma"),
    "--xtc-probability": (TO, "--xtc-probability"), "--xtc-threshold": (TO, "--xtc-threshold"),
    "--typical": (TO, "--typical"), "--repeat-last-n": (TO, "--repeat-last-n"),
    "--repeat-penalty": (TO, "--repeat-penalty"), "--presence-penalty": (TO, "--presence-penalty"),
    "--frequency-penalty": (TO, "--frequency-penalty"), "--dry-multiplier": (TO, "--dry-multiplier"),
    "--dry-base": (TO, "--dry-base"), "--dry-allowed-length": (TO, "--dry-allowed-length"),
    "--dry-penalty-last-n": (TO, "--dry-penalty-last-n"),
    "--dry-sequence-breaker": (TO, "--dry-sequence-breaker"), "--mirostat": (TO, "--mirostat"),
    "--mirostat-lr": (TO, "--mirostat-lr"), "--mirostat-ent": (TO, "--mirostat-ent"),
    "--grammar": (TO, "--grammar"), "--grammar-file": (TO, "--grammar-file"),
    "-j": (TO, "--json-schema"), "-jf": (TO, "--json-schema-file"),
    "-ctk": (TO, "--cache-type-k"), "-ctv": (TO, "--cache-type-v"), "-np": (TO, "--parallel"),
    "-ngl": (TO, "--n-gpu-layers"), "-a": (TO, "--alias"), "-m": (TO, "--model"), "-hf": (HF, None),
    "--host": (TO, "--host"), "--port": (TO, "--port"), "--cors-origins": (TO, "--cors-origin"),
    "--embedding": (TO, "--embeddings"), "--api-key": (TO, "--api-key"),
    "--rerank": (TO, "--reranking"), "--pooling": (TO, "--pooling"),
    "--embd-normalize": (TO, "--embd-normalize"), "--embd-output-format": (TO, "--embd-output-format"),
    "--api-key-file": (TO, "--api-key-file"), "-to": (TO, "--timeout"), "--slots": (TO, "--slots"),
    "--jinja": (TO, "--jinja"), "--chat-template-file": (TO, "--chat-template-file"),
    "--chat-template": (TO, "--chat-template"),
    "--log-disable": (TO, "--log-disable"), "-md": (TO, "--model-draft"), "--draft": (TO, "--draft-max"),
    "--draft-min": (TO, "--draft-min"), "--spec-draft-p-min": (TO, "--draft-p-min"),
    "--spec-type": (TO, "--spec-type"), "--spec-ngram-simple-size-n": (TO, "--spec-ngram-simple-size-n"),
    "--spec-ngram-simple-size-m": (TO, "--spec-ngram-simple-size-m"),
    "--context-shift": (TO, "--context-shift"),
    "--warmup": (IGNORE, "minfer has no warm-up pass to turn on or off"),
    "--perf": (IGNORE, "minfer always prints its timing line (--log-disable hides it)"),
    "--show-timings": (IGNORE, "minfer always prints its timing line (--log-disable hides it)"),
    "--display-prompt": (IGNORE, "minfer never echoes the prompt"),
    "--verbose-prompt": (IGNORE, "minfer never echoes the prompt"),
    "-cb": (IGNORE, "minfer's server always batches its slots continuously"),
    "--cache-prompt": (IGNORE, "each slot always reuses its cached prompt prefix"),
    "--metrics": (IGNORE, "minfer's server always serves /metrics"),
    "--ui": (IGNORE, "the chat page is served unless --no-webui is given"),
    "--repack": (IGNORE, "minfer repacks weights for its kernels by default (MINFER_NO_REPACK=1 turns it off)"),
    "-bs": (IGNORE, "minfer samples on the CPU"),
    "-dt": (IGNORE, "minfer's KV cache needs no defragmentation"),
    "--check-tensors": (IGNORE, "minfer checks every tensor's shape and type, and its norms and biases, at load"),
    "--simple-io": (IGNORE, "minfer's line editor falls back to plain lines without a terminal"),
    "--prio": (IGNORE, "minfer leaves thread priorities to the system"),
    "--poll": (IGNORE, "minfer's threads wait on a condition, not by polling"),
    "--offline": (IGNORE, "minfer fetches only a model its cache lacks"),
    "-v": (IGNORE, "minfer has no verbose log"), "-lv": (IGNORE, "minfer has no log levels"),
    "--log-colors": (IGNORE, "minfer's log lines are plain"), "--log-prefix": (IGNORE, "minfer's log lines are plain"),
    "--log-timestamps": (IGNORE, "minfer's log lines are plain"), "--threads-http": (IGNORE, "minfer's HTTP threads are its own"),
    "--prefill-assistant": (IGNORE, "a last assistant message is continued, as llama-server does by default"),
    "--no-host": (IGNORE, "minfer has no host buffer type to bypass"),
    "--op-offload": (IGNORE, "minfer runs each node where its backend fence puts it"),
    "-kvo": (IGNORE, "a layer's KV cache lives with the layer"),
    "-tb": (REFUSE, "minfer uses one thread count for prefill and decode (-t)"),
    "-mli": (REFUSE, "end a line with \\\\ to go on on the next one"),
}
# Negated names -> action, keyed by any one of the negated names.
NEG = {
    "-no-cnv": (TO, "--no-cnv"), "--no-context-shift": (TO, "--no-context-shift"),
    "--no-escape": (TO, "--no-escape"), "--no-webui": (TO, "--no-webui"),
    "--no-jinja": (REFUSE, "minfer always renders the model's chat template with Jinja"),
    "--no-slots": (IGNORE, "GET /slots answers only with --slots"),
    "--no-warmup": (IGNORE, "minfer has no warm-up pass to turn off"),
    "--no-perf": (IGNORE, "--log-disable hides minfer's timing line"),
    "--no-show-timings": (IGNORE, "--log-disable hides minfer's timing line"),
    "--no-display-prompt": (IGNORE, "minfer never echoes the prompt"),
    "-nocb": (REFUSE, "minfer's server always batches its slots continuously"),
    "--no-cache-prompt": (REFUSE, "a slot always reuses its cached prompt prefix"),
    "-nr": (REFUSE, "set MINFER_NO_REPACK=1 to keep the file's layout"),
    "--no-log-prefix": (IGNORE, "minfer's log lines are plain"),
    "--no-log-timestamps": (IGNORE, "minfer's log lines are plain"),
    "--no-prefill-assistant": (REFUSE, "a last assistant message is always continued"),
    "-nkvo": (REFUSE, "a layer's KV cache lives with the layer (-ngl places both)"),
    "--no-op-offload": (REFUSE, "minfer runs each node where its backend fence puts it"),
}
# Refusals by subject, keyed by name prefix or exact name, checked in order.
SUBJECT = [
    (("-mm", "--mmproj", "--image", "--audio", "--video", "--mtmd"), "minfer has no multimodal (vision or audio) support"),
    (("--lora",), "minfer does not apply LoRA adapters"),
    (("--control-vector",), "minfer does not apply control vectors"),
    (("--rope-", "--yarn-"), "minfer takes RoPE scaling from the model file"),
    (("-C", "--cpu-", "--prio-", "--poll-"), "minfer leaves thread placement to the system"),
    (("--rpc", "-dev", "--device", "--list-devices", "-sm", "-ts", "-mg", "-ot", "-cmoe", "-ncmoe", "-ncffn", "--numa", "-fit"),
     "minfer picks its devices with --backend and -ngl only"),
    (("--spec-", "-hfd", "-ngld", "-td", "-tbd", "-devd", "-ctkd", "-ctvd", "-otd", "-cmoed", "-ncmoed", "-Cd", "-Crd", "-Cbd"),
     "minfer's speculative decoding takes --model-draft, --draft-max, --draft-min, --draft-p-min and --spec-type"),
    (("--reasoning", "-rea"), "of the reasoning flags minfer takes --reasoning-format and --reasoning-budget, and on minfer serve -rea; effort and preserving are not supported yet"),
    (("--models-",), "minfer serve takes --models-dir and --models-max (models load on first use); presets and turning autoload off are not supported"),
    (("--ssl-",), "minfer serves plain HTTP: put a TLS proxy in front of it (docs/server.md)"),
    (("--log-file", "--log-jsonl", "--log-prompts-dir"), "minfer logs only to standard error"),
    (("-lm", "-lzm", "--override-kv", "-kvu", "--kv-unified", "-ctxcp", "-cms", "-cram", "--cache-idle-slots", "--cache-reuse", "-lcs", "-lcd", "-sps", "--slot-save-path"),
     "minfer's KV cache has no such setting"),
    (("-bf",), "give the prompt as text (-p or -f)"),
    (("-ptc",), "minfer prints no token counts while generating"),
    (("--prompt-cache-",), "--session saves the cache after the prompt (after each turn with -cnv)"),
    (("-i", "-if", "--in-prefix", "--in-suffix"), "minfer's interactive mode is the conversation (-cnv)"),
    (("--spm-infill",), "minfer's /infill puts the FIM tokens in the model's usual order"),
    (("--sampler-seq",), "name the samplers with --samplers"),
    (("--adaptive-", "--dynatemp-"), "minfer has no such sampler"),
    (("-l",), "logit bias is the server's request field logit_bias"),
    (("-gan", "-gaw"), "minfer has no self-extend (group attention)"),
    (("--tags", "--lora-init-without-apply"), "minfer's server serves one model"),
    (("--reuse-port", "--path", "--cors-methods", "--cors-headers", "--cors-credentials", "--no-cors-credentials",
      "--api-prefix", "--sse-ping-interval", "--sleep-idle-seconds", "--media-path", "--skip-chat-parsing",
      "--no-skip-chat-parsing", "--chat-template-kwargs", "--props"),
     "minfer's server has no such setting"),
    (("--ui-", "--no-ui-", "--tools", "--mcp-", "-ag", "-no-ag"), "minfer's server runs no tools or agents of its own"),
    (("--fim-qwen-", "--gpt-oss-", "--vision-gemma-", "--spec-default", "--embd-gemma-default"),
     "minfer has no preset bundles: give the model (e.g. hf:REPO:QUANT) and its flags"),
    (("-mu", "-dr", "-hff", "-hft", "-cl", "--completion-bash", "--server-base"), "minfer fetches models as hf:OWNER/REPO[:QUANT] or ollama:NAME[:TAG] (-hf REPO[:QUANT] works)"),
]
BY_EXAMPLE = {
    "perplexity": "minfer has no perplexity tool", "imatrix": "give imatrix's flags after `minfer imatrix`",
    "finetune": "minfer does not train", "diffusion": "minfer runs no diffusion models",
    "tts": "minfer has no text-to-speech", "cvector_generator": "minfer does not make control vectors",
    "export_lora": "minfer does not apply LoRA adapters", "retrieval": "minfer has no retrieval tool",
    "passkey": "minfer has no passkey test", "debug": "minfer has no debug tool (see --trace)",
    "results": "minfer has no results tool", "export_graph_ops": "see --dump-graph-json",
    "embedding": "minfer embed reads one input per TEXT argument or per line of -f FILE", "tokenize": "use `minfer tokenize`",
    "parallel": "use `minfer serve` for parallel sequences", "bench": "use `minfer batched-bench`",
    "lookup": "minfer's lookup decoding is --spec-type ngram-simple", "download": "use `minfer pull`",
    "fit_params": "minfer fits nothing", "mtmd": "minfer has no multimodal support",
}
DEFAULT = "not supported by minfer"


def action(names, table, examples):
    for n in names:
        if n in table:
            return table[n]
    for prefixes, why in SUBJECT:
        if any(n == p or (n.startswith(p) and len(p) > 2) for n in names for p in prefixes):
            return (REFUSE, why)
    for e in examples:
        if e in BY_EXAMPLE:
            return (REFUSE, BY_EXAMPLE[e])
    return (REFUSE, DEFAULT)


def rust(a):
    kind, arg = a
    if kind == HF:
        return "Action::HfRepo"
    return f'Action::{kind}("{arg}")'


rows, seen = [], set()
for o in opts:
    # An option listed twice (llama.cpp registers `-np` for two programs) is written once.
    key = tuple(o["names"] + o["negated"])
    if key in seen:
        continue
    seen.add(key)
    value = "true" if o["kind"] == "value" else "false"
    names = ", ".join(f'"{n}"' for n in o["names"])
    rows.append(f"    Flag {{ names: &[{names}], value: {value}, action: {rust(action(o['names'], POS, o['examples']))} }},")
    if o["negated"]:
        negs = ", ".join(f'"{n}"' for n in o["negated"])
        neg = next((NEG[n] for n in o["negated"] if n in NEG), None)
        if neg is None:
            # Turning off what minfer refuses to turn on is refused for the same reason.
            pos = action(o["names"], POS, o["examples"])
            neg = pos if pos[0] == REFUSE else (REFUSE, DEFAULT)
        rows.append(f"    Flag {{ names: &[{negs}], value: false, action: {rust(neg)} }},")

print("""//! Generated by scripts/gen_llama_flags_table.py from llama.cpp 0c1e570's common/arg.cpp
//! (tests/fixtures/cli/llama_cpp_flags.jsonl): what minfer makes of each of its flags. Edit the
//! generator's decisions, not this file.

use super::llama_flags::{Action, Flag};

/// Every flag of llama.cpp's common/arg.cpp, in its order.
#[rustfmt::skip]
pub const TABLE: &[Flag] = &[""")
print("\n".join(rows))
print("];")
