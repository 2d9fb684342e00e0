#!/usr/bin/env python3
"""Write the tiny `llama` and `granite` fixtures from the tiny qwen2 ones (their `qwen2.*` keys
renamed `llama.*` or `granite.*`; tokenizer, tensors and their bytes, the Q/K/V biases both take
as optional, unchanged). llama.cpp then runs them with adjacent-pair RoPE, which is what they
test.

- `tiny-llama-Q8_0.gguf`: from `tiny-qwen2-Q8_0.gguf`, nothing else changed.
- `tiny-llama3-Q4_0.gguf`: from `tiny-qwen2-Q4_0.gguf`, with Llama 3.1's RoPE scaling baked in
  as its converter does — `rope_freqs.weight`, the per-pair frequency divisors from Meta's
  formula (factor 8, low/high frequency factors 1 and 4, original context 4096) — at
  `rope.freq_base` 500000, and on top of it linear scaling (`rope.scaling.type = linear`,
  factor 2), so that one file exercises both of llama.cpp's ways of scaling a llama's RoPE.
- `tiny-granite-Q4_0.gguf`: from `tiny-qwen2-Q4_0.gguf` as Granite, with its four scales
  (embedding 12, residual 0.22, attention 1/64 where 1/sqrt(head_dim) would be 1/8, logits
  divided by 1.25).

    .venv/bin/python scripts/gen_tiny_llama.py
"""
import math
from pathlib import Path
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType as VT

root = Path(__file__).resolve().parent.parent / "tests/fixtures/models"


def llama3_factors(n_rot, base, factor=8.0, low=1.0, high=4.0, original=4096):
    """Meta's Llama 3.1 scaling as divisors of each pair's frequency (what convert_hf_to_gguf
    writes as rope_freqs)."""
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for i in range(n_rot // 2):
        wavelen = 2 * math.pi / (base ** (-2 * i / n_rot))
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def relabel(src, dst, name, llama3, arch="llama", extra=()):
    r = GGUFReader(root / src)
    w = GGUFWriter(root / dst, arch)
    n_embd = n_head = None
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        new = arch + "." + key[len("qwen2."):] if key.startswith("qwen2.") else key
        vtype = field.types[0]
        value = field.contents()
        if key == "qwen2.embedding_length":
            n_embd = value
        if key == "qwen2.attention.head_count":
            n_head = value
        if key == "general.name":
            value = name
        if llama3 and key == "qwen2.rope.freq_base":
            value = 500000.0
        if vtype == VT.ARRAY:
            w.add_key_value(new, value, vtype, sub_type=field.types[1])
        else:
            w.add_key_value(new, value, vtype)
    for key, value in extra:
        w.add_key_value(key, value, VT.FLOAT32)
    if llama3:
        w.add_key_value("llama.rope.scaling.type", "linear", VT.STRING)
        w.add_key_value("llama.rope.scaling.factor", 2.0, VT.FLOAT32)
        w.add_tensor("rope_freqs.weight", llama3_factors(n_embd // n_head, 500000.0))
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(root / dst)


relabel("tiny-qwen2-Q8_0.gguf", "tiny-llama-Q8_0.gguf", "tiny-llama", llama3=False)
relabel("tiny-qwen2-Q4_0.gguf", "tiny-llama3-Q4_0.gguf", "tiny-llama3", llama3=True)
relabel("tiny-qwen2-Q4_0.gguf", "tiny-granite-Q4_0.gguf", "tiny-granite", llama3=False, arch="granite",
        extra=[("granite.embedding_scale", 12.0), ("granite.residual_scale", 0.22),
               ("granite.attention.scale", 0.015625), ("granite.logit_scale", 1.25)])
