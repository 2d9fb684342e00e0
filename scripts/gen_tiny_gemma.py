#!/usr/bin/env python3
"""Write the tiny Gemma fixtures from the tiny qwen3 Q4_0 model's weights, which llama.cpp then
runs with its own Gemma graphs (GELU FFN, sqrt(n_embd) embedding scale, Q scaled by
1/sqrt(head_dim)):

- tests/fixtures/models/tiny-gemma3-Q4_0.gguf: the weights (their per-head Q/K norms included)
  as `gemma3`, with Gemma's post-attention and post-FFN norms added (random F32 around 1, seed
  3), a sliding window of 6 positions — shorter than most of the reference prompts, so the
  window is exercised — on every other layer (`attention.sliding_window_pattern` 2: layer 0
  local, layer 1 global) and the local layers' RoPE base `rope.freq_base_swa` 10000 beside the
  global 1000000.
- tests/fixtures/models/tiny-gemma2-Q4_0.gguf: as `gemma2` (no Q/K norms), the same post norms,
  a window of 6 on llama.cpp's default pattern for Gemma 2 (every other layer, layer 0 local),
  and soft-caps low enough to bend this model's numbers: attention 5, final logits 100.
- tests/fixtures/models/tiny-gemma-Q4_0.gguf: as `gemma` (Gemma 1: no Q/K norms, no post norms,
  no window, no soft-caps).

    .venv/bin/python scripts/gen_tiny_gemma.py
"""
from pathlib import Path
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType as VT

root = Path(__file__).resolve().parent.parent / "tests/fixtures/models"


def write(arch):
    r = GGUFReader(root / "tiny-qwen3-Q4_0.gguf")
    out = root / f"tiny-{arch}-Q4_0.gguf"
    w = GGUFWriter(out, arch)
    n_layer = n_embd = None
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        new = f"{arch}." + key[len("qwen3."):] if key.startswith("qwen3.") else key
        value = f"tiny-{arch}" if key == "general.name" else field.contents()
        if key == "qwen3.block_count":
            n_layer = value
        if key == "qwen3.embedding_length":
            n_embd = value
        if field.types[0] == VT.ARRAY:
            w.add_key_value(new, value, field.types[0], sub_type=field.types[1])
        else:
            w.add_key_value(new, value, field.types[0])
    if arch == "gemma3":
        w.add_key_value("gemma3.attention.sliding_window", 6, VT.UINT32)
        w.add_key_value("gemma3.attention.sliding_window_pattern", 2, VT.UINT32)
        w.add_key_value("gemma3.rope.freq_base_swa", 10000.0, VT.FLOAT32)
    if arch == "gemma2":
        w.add_key_value("gemma2.attention.sliding_window", 6, VT.UINT32)
        w.add_key_value("gemma2.attn_logit_softcapping", 5.0, VT.FLOAT32)
        w.add_key_value("gemma2.final_logit_softcapping", 100.0, VT.FLOAT32)
    rng = np.random.default_rng(3)
    if arch != "gemma":
        for il in range(n_layer):
            for name in ("post_attention_norm", "post_ffw_norm"):
                w.add_tensor(f"blk.{il}.{name}.weight", (1.0 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32))
    for t in r.tensors:
        if arch != "gemma3" and (t.name.endswith("attn_q_norm.weight") or t.name.endswith("attn_k_norm.weight")):
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out)


for arch in ("gemma3", "gemma2", "gemma"):
    write(arch)
