#!/usr/bin/env python3
"""Write `tests/fixtures/models/tiny-gpt-oss-F32.gguf`, a tiny random `gpt-oss` model, from the
tiny dense qwen2 F32 fixture: its attention weights and Q/K/V biases, embedding, output and norms
(bytes unchanged), relabelled and completed into gpt-oss's layout (llama.cpp's
`LLM_ARCH_OPENAI_MOE`):

- keys: `gpt-oss.*` from `qwen2.*`, plus `attention.key_length`/`value_length` 64 (as the
  converter writes them), `attention.sliding_window` 6 (gpt-oss's is 128; 6 lets the prompts
  run past it; llama.cpp's default pattern 2 makes layer 0 windowed, layer 1 global),
  `rope.freq_base` 150000 and gpt-oss's YaRN: `rope.scaling.type` yarn, `factor` 32,
  `original_context_length` 4096, `context_length` 131072; 8 experts of width 64, 4 used per token
  (gpt-oss-20b: 32 of width 2880, 4 used).
- tensors: `ffn_norm` renamed `post_attention_norm`; per layer new `attn_output.bias` (N(0, 0.1)),
  `attn_sinks.weight` (one logit per head, N(0, 2): some heads give the sink a sizeable share),
  the router `ffn_gate_inp.weight` (N(0,1) * 3/sqrt(n_embd)) and its bias (N(0, 0.5)), experts
  `ffn_{gate,up}_exps.weight` (N(0,1) * 4/sqrt(n_embd): gate values reach past the clamp 7) and
  `ffn_down_exps.weight` (N(0,1) * 2/sqrt(64)) with F32 biases `ffn_{gate,up,down}_exps.bias`
  (N(0, 0.5)); seed 104.
- tokenizer: qwen2's fixture vocabulary plus harmony's special tokens appended as CONTROL
  tokens (`<|start|>` 4003, `<|channel|>` 4004, `<|message|>` 4005, `<|end|>` 4006, `<|return|>`
  4007, `<|call|>` 4008, `<|constrain|>` 4009), with random rows for them in the embedding and
  output (N(0, 0.02) as the others are); `eos` = `<|return|>`; the chat template is llama.cpp's
  `models/templates/openai-gpt-oss-120b.jinja` (given as the first argument).

    .venv/bin/python scripts/gen_tiny_gpt_oss.py $LLAMA_CPP/models/templates/openai-gpt-oss-120b.jinja

`tiny-gpt-oss-MXFP4.gguf` is llama-quantize's `MXFP4_MOE` of it (experts MXFP4, other matrices
Q8_0), see tests/fixtures/models/README.md.
"""
import sys
from pathlib import Path
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType as VT

root = Path(__file__).resolve().parent.parent / "tests/fixtures/models"
N_EXPERT, N_USED, N_FF_EXP = 8, 4, 64
HARMONY = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
template = open(sys.argv[1]).read()


def normal(rng, shape, std):
    return (rng.standard_normal(shape) * std).astype(np.float32)


r = GGUFReader(root / "tiny-qwen2-F32.gguf")
arch = "gpt-oss"
w = GGUFWriter(root / "tiny-gpt-oss-F32.gguf", arch)
hp = {}
tokens = list(r.fields["tokenizer.ggml.tokens"].contents())
n_old_vocab = len(tokens)
for key, field in r.fields.items():
    if key.startswith("GGUF.") or key == "general.architecture":
        continue
    new = arch + "." + key[len("qwen2") + 1:] if key.startswith("qwen2.") else key
    value = field.contents()
    hp[new] = value
    if key == "general.name":
        value = "tiny-gpt-oss"
    elif new == f"{arch}.rope.freq_base":
        value = 150000.0
    elif new == f"{arch}.context_length":
        value = 131072
    elif key == "tokenizer.ggml.tokens":
        value = tokens + HARMONY
    elif key == "tokenizer.ggml.token_type":
        value = list(value) + [3] * len(HARMONY)
    elif key == "tokenizer.ggml.eos_token_id":
        value = n_old_vocab + HARMONY.index("<|return|>")
    elif key == "tokenizer.chat_template":
        value = template
    if field.types[0] == VT.ARRAY:
        w.add_key_value(new, value, field.types[0], sub_type=field.types[1])
    else:
        w.add_key_value(new, value, field.types[0])
n_embd, n_layer = hp[f"{arch}.embedding_length"], hp[f"{arch}.block_count"]
n_head = hp[f"{arch}.attention.head_count"]
head_dim = n_embd // n_head
for k, v in [("attention.key_length", head_dim), ("attention.value_length", head_dim),
             ("attention.sliding_window", 6), ("expert_count", N_EXPERT),
             ("expert_used_count", N_USED), ("expert_feed_forward_length", N_FF_EXP),
             ("rope.scaling.original_context_length", 4096)]:
    w.add_key_value(f"{arch}.{k}", v, VT.UINT32)
w.add_key_value(f"{arch}.rope.scaling.type", "yarn", VT.STRING)
w.add_key_value(f"{arch}.rope.scaling.factor", 32.0, VT.FLOAT32)

rng = np.random.default_rng(104)
extra = {}
for il in range(n_layer):
    p = f"blk.{il}."
    extra[p + "attn_output.bias"] = normal(rng, (n_embd,), 0.1)
    extra[p + "attn_sinks.weight"] = normal(rng, (n_head,), 2.0)
    extra[p + "ffn_gate_inp.weight"] = normal(rng, (N_EXPERT, n_embd), 3 / np.sqrt(n_embd))
    extra[p + "ffn_gate_inp.bias"] = normal(rng, (N_EXPERT,), 0.5)
    extra[p + "ffn_gate_exps.weight"] = normal(rng, (N_EXPERT, N_FF_EXP, n_embd), 4 / np.sqrt(n_embd))
    extra[p + "ffn_gate_exps.bias"] = normal(rng, (N_EXPERT, N_FF_EXP), 0.5)
    extra[p + "ffn_up_exps.weight"] = normal(rng, (N_EXPERT, N_FF_EXP, n_embd), 4 / np.sqrt(n_embd))
    extra[p + "ffn_up_exps.bias"] = normal(rng, (N_EXPERT, N_FF_EXP), 0.5)
    extra[p + "ffn_down_exps.weight"] = normal(rng, (N_EXPERT, n_embd, N_FF_EXP), 2 / np.sqrt(N_FF_EXP))
    extra[p + "ffn_down_exps.bias"] = normal(rng, (N_EXPERT, n_embd), 0.5)

for t in r.tensors:
    name = t.name
    data = np.asarray(t.data)
    if name.endswith((".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight")):
        if name.endswith(".ffn_gate.weight"):  # the layer's experts, where its FFN was
            blk = name[: -len("ffn_gate.weight")]
            for k, v in extra.items():
                if k.startswith(blk):
                    w.add_tensor(k, v)
        continue
    if name.endswith(".ffn_norm.weight"):
        name = name.replace(".ffn_norm.weight", ".post_attention_norm.weight")
    if name in ("token_embd.weight", "output.weight"):
        data = np.concatenate([data, normal(rng, (len(HARMONY), n_embd), 0.02)])
    w.add_tensor(name, data.astype(np.float32))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(root / "tiny-gpt-oss-F32.gguf")
