#!/usr/bin/env python3
"""Write tests/fixtures/models/tiny-gemma3-Q4_0.gguf: the tiny qwen3 Q4_0 model's weights (its
per-head Q/K norms included) as the `gemma3` architecture, with Gemma's post-attention and
post-FFN norms added (random F32 around 1, seed 3), a sliding window of 6 positions — shorter
than most of the reference prompts, so the window is exercised — on every other layer
(`attention.sliding_window_pattern` 2: layer 0 local, layer 1 global) and the local layers'
RoPE base `rope.freq_base_swa` 10000 beside the global 1000000. llama.cpp then runs it with its
own Gemma 3 graph (GELU FFN, sqrt(n_embd) embedding scale, Q scaled by 1/sqrt(head_dim)).

    .venv/bin/python scripts/gen_tiny_gemma.py
"""
from pathlib import Path
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType as VT

root = Path(__file__).resolve().parent.parent / "tests/fixtures/models"
r = GGUFReader(root / "tiny-qwen3-Q4_0.gguf")
w = GGUFWriter(root / "tiny-gemma3-Q4_0.gguf", "gemma3")
n_layer = n_embd = None
for key, field in r.fields.items():
    if key.startswith("GGUF.") or key == "general.architecture":
        continue
    new = "gemma3." + key[len("qwen3."):] if key.startswith("qwen3.") else key
    value = "tiny-gemma3" if key == "general.name" else field.contents()
    if key == "qwen3.block_count":
        n_layer = value
    if key == "qwen3.embedding_length":
        n_embd = value
    if field.types[0] == VT.ARRAY:
        w.add_key_value(new, value, field.types[0], sub_type=field.types[1])
    else:
        w.add_key_value(new, value, field.types[0])
w.add_key_value("gemma3.attention.sliding_window", 6, VT.UINT32)
w.add_key_value("gemma3.attention.sliding_window_pattern", 2, VT.UINT32)
w.add_key_value("gemma3.rope.freq_base_swa", 10000.0, VT.FLOAT32)
rng = np.random.default_rng(3)
for il in range(n_layer):
    for name in ("post_attention_norm", "post_ffw_norm"):
        w.add_tensor(f"blk.{il}.{name}.weight", (1.0 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32))
for t in r.tensors:
    w.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(root / "tiny-gemma3-Q4_0.gguf")
