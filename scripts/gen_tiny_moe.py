#!/usr/bin/env python3
"""Write the tiny mixture-of-experts fixtures from the tiny dense F32 models: tokenizer, token
embedding, output, attention tensors and norms kept (bytes unchanged), each layer's dense FFN
(`ffn_gate`/`ffn_up`/`ffn_down`) replaced by 8 experts of width 64, 2 used per token, with new
random F32 weights (numpy `default_rng`, one fixed seed per file):

- `tiny-qwen3moe-F32.gguf`: `tiny-qwen3-F32.gguf` as `qwen3moe` (its `qwen3.*` keys renamed;
  `feed_forward_length` 512 kept, as real Qwen3-MoE files carry it, but llama.cpp sizes the
  experts by `expert_feed_forward_length` 64), seed 101. Softmax router, top-2 weights
  renormalised to sum 1 (llama.cpp's qwen3moe graph).
- `tiny-qwen2moe-F32.gguf`: `tiny-qwen2-F32.gguf` (Q/K/V biases kept) as `qwen2moe`, seed 102,
  plus Qwen1.5-MoE's shared expert: `expert_shared_feed_forward_length` 96,
  `ffn_{gate,up,down}_shexp.weight` and its sigmoid gate `ffn_gate_inp_shexp.weight` (one row,
  GGUF shape [n_embd]). Top-2 weights not renormalised (llama.cpp's qwen2moe graph).
- `tiny-mixtral-F32.gguf`: `tiny-qwen2-F32.gguf` relabelled as `llama` like
  `gen_tiny_llama.py` does (Q/K/V biases kept — llama.cpp's llama graph reads them when present
  — and adjacent-pair RoPE instead of qwen2's NeoX halves), seed 103, in Mixtral's layout:
  `llama.expert_count` 8, `llama.expert_used_count` 2 and `llama.feed_forward_length` 64, the
  expert width (Mixtral has no `expert_feed_forward_length`). Top-2 weights renormalised.

Scales follow the dense model's weights (N(0, 1) times 3/sqrt(fan-in) for gate/up, 5/sqrt(fan-in)
for down), so each expert's output is the size of the dense FFN's; router rows `ffn_gate_inp`
(F32, GGUF shape [n_embd, n_expert], which llama-quantize never quantizes) are N(0, 1) times
3/sqrt(n_embd): on the unit-scale normed hidden state the 8 router logits spread with a standard
deviation of about 3, so tokens pick different experts. The shared expert's gate row is N(0, 1)
times 1/sqrt(n_embd) (gate logits around +-1, the sigmoid between about 0.25 and 0.75). Expert
tensors in GGUF order are [n_embd, n_ff_exp, n_expert] (gate, up) and [n_ff_exp, n_embd,
n_expert] (down); numpy arrays are the reverse.

After writing, each file's layer-0 routing of the tokens of a sample prompt is printed as a
sanity check (router on the rms-normed token embeddings alone, ignoring attention).

    .venv/bin/python scripts/gen_tiny_moe.py

The quantized variants are llama-quantize's (see tests/fixtures/models/README.md).
"""
from pathlib import Path
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType as VT

root = Path(__file__).resolve().parent.parent / "tests/fixtures/models"
N_EXPERT, N_USED, N_FF_EXP, N_FF_SHEXP = 8, 2, 64, 96


def normal(rng, shape, fan_in, k):
    return (rng.standard_normal(shape) * (k / np.sqrt(fan_in))).astype(np.float32)


def write(src, dst, arch, seed, shared=False, mixtral=False):
    r = GGUFReader(root / src)
    old = r.fields["general.architecture"].contents()
    w = GGUFWriter(root / dst, arch)
    hp = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        new = arch + "." + key[len(old) + 1:] if key.startswith(old + ".") else key
        value = field.contents()
        hp[new] = value
        if key == "general.name":
            value = dst[: -len("-F32.gguf")]
        if mixtral and key == old + ".feed_forward_length":
            value = N_FF_EXP
        if field.types[0] == VT.ARRAY:
            w.add_key_value(new, value, field.types[0], sub_type=field.types[1])
        else:
            w.add_key_value(new, value, field.types[0])
    w.add_key_value(f"{arch}.expert_count", N_EXPERT, VT.UINT32)
    w.add_key_value(f"{arch}.expert_used_count", N_USED, VT.UINT32)
    if not mixtral:
        w.add_key_value(f"{arch}.expert_feed_forward_length", N_FF_EXP, VT.UINT32)
    if shared:
        w.add_key_value(f"{arch}.expert_shared_feed_forward_length", N_FF_SHEXP, VT.UINT32)

    n_embd, n_layer = hp[f"{arch}.embedding_length"], hp[f"{arch}.block_count"]
    rng = np.random.default_rng(seed)
    moe = {}
    for il in range(n_layer):
        p = f"blk.{il}."
        moe[p + "ffn_gate_inp.weight"] = normal(rng, (N_EXPERT, n_embd), n_embd, 3)
        moe[p + "ffn_gate_exps.weight"] = normal(rng, (N_EXPERT, N_FF_EXP, n_embd), n_embd, 3)
        moe[p + "ffn_up_exps.weight"] = normal(rng, (N_EXPERT, N_FF_EXP, n_embd), n_embd, 3)
        moe[p + "ffn_down_exps.weight"] = normal(rng, (N_EXPERT, n_embd, N_FF_EXP), N_FF_EXP, 5)
        if shared:
            moe[p + "ffn_gate_inp_shexp.weight"] = normal(rng, (n_embd,), n_embd, 1)
            moe[p + "ffn_gate_shexp.weight"] = normal(rng, (N_FF_SHEXP, n_embd), n_embd, 3)
            moe[p + "ffn_up_shexp.weight"] = normal(rng, (N_FF_SHEXP, n_embd), n_embd, 3)
            moe[p + "ffn_down_shexp.weight"] = normal(rng, (n_embd, N_FF_SHEXP), N_FF_SHEXP, 5)

    tensors = {}
    for t in r.tensors:
        name = t.name
        if name.endswith((".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight")):
            if name.endswith(".ffn_gate.weight"):  # the layer's experts, where its FFN was
                blk = name[: -len("ffn_gate.weight")]
                for k, v in moe.items():
                    if k.startswith(blk):
                        w.add_tensor(k, v)
            continue
        tensors[name] = np.asarray(t.data)
        w.add_tensor(name, tensors[name], raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(root / dst)

    # Sanity check: layer-0 routing of a prompt's tokens (rms-normed embeddings only).
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    ids = {s: i for i, s in enumerate(tokens)}
    text = "The quick brown fox jumps over the lazy dog . def add ( a , b ): return a + b 1 2 3 4 5"
    toks = [ids[s] for s in (("Ġ" + x) if j else x for j, x in enumerate(text.split())) if s in ids]
    x = tensors["token_embd.weight"][toks]
    x = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * tensors["blk.0.ffn_norm.weight"]
    logits = x @ moe["blk.0.ffn_gate_inp.weight"].T
    top = np.argsort(-logits, -1)[:, :N_USED]
    counts = np.bincount(top.ravel(), minlength=N_EXPERT)
    spread = logits.max(-1) - logits.min(-1)
    print(f"  layer-0 routing of {len(toks)} tokens: experts picked {counts.tolist()}, "
          f"{len({tuple(sorted(t)) for t in top})} distinct pairs, router logit std "
          f"{logits.std():.2f}, max-min per token {spread.mean():.2f} on average")


write("tiny-qwen3-F32.gguf", "tiny-qwen3moe-F32.gguf", "qwen3moe", 101)
write("tiny-qwen2-F32.gguf", "tiny-qwen2moe-F32.gguf", "qwen2moe", 102, shared=True)
write("tiny-qwen2-F32.gguf", "tiny-mixtral-F32.gguf", "llama", 103, mixtral=True)
