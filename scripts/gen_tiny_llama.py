#!/usr/bin/env python3
"""Write the tiny `llama`, `granite` and `phi3` fixtures from the tiny qwen2 ones (their `qwen2.*`
keys renamed for the architecture; tokenizer, tensors and their bytes unchanged, but for phi3's
fused tensors). llama.cpp then runs them with its own graph for each, which is what they test.

- `tiny-llama-Q8_0.gguf`: from `tiny-qwen2-Q8_0.gguf`, nothing else changed.
- `tiny-llama3-Q4_0.gguf`: from `tiny-qwen2-Q4_0.gguf`, with Llama 3.1's RoPE scaling baked in
  as its converter does — `rope_freqs.weight`, the per-pair frequency divisors from Meta's
  formula (factor 8, low/high frequency factors 1 and 4, original context 4096) — at
  `rope.freq_base` 500000, and on top of it linear scaling (`rope.scaling.type = linear`,
  factor 2), so that one file exercises both of llama.cpp's ways of scaling a llama's RoPE; and
  the optional biases of the attention output and the FFN's three projections (random, seed 7).
- `tiny-granite-Q4_0.gguf`: from `tiny-qwen2-Q4_0.gguf` as Granite, with its four scales
  (embedding 12, residual 0.22, attention 1/64 where 1/sqrt(head_dim) would be 1/8, logits
  divided by 1.25).
- `tiny-phi3-Q4_0.gguf`: from `tiny-qwen2-Q4_0.gguf` as Phi-3: Q, K and V fused into
  `attn_qkv.weight` and gate and up into `ffn_up.weight` (their rows concatenated, which for a
  row-quantized type is concatenating their bytes), the biases dropped (Phi-3 has none), NeoX
  RoPE over 32 of the 64 dimensions of each head, LongRoPE factors (`rope_factors_long` and
  `_short`) with `original_context_length` 256 — below the reference's n_ctx 512, so the long
  ones apply — and `rope.scaling.attn_factor` 1.19, and Phi-3-mini's sliding window key.
- `tiny-llama-spm-Q4_0.gguf`: the tiny qwen2 Q4_0 model's layers as `llama` with a SentencePiece
  vocabulary: llama.cpp's `ggml-vocab-llama-spm.gguf` (32000 tokens, fetched by
  `scripts/fetch-llama-vocab.sh`; its `tokenizer.*` keys copied) and a new random token
  embedding of 32000 rows (Q4_0, seed 42, the scale of the qwen2 model's), which the head
  shares (no `output.weight`).

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
        rng = np.random.default_rng(7)
        n_ff = next(f.contents() for k, f in r.fields.items() if k == "qwen2.feed_forward_length")
        n_layer = next(f.contents() for k, f in r.fields.items() if k == "qwen2.block_count")
        for il in range(n_layer):
            for name, n in (("attn_output", n_embd), ("ffn_gate", n_ff), ("ffn_up", n_ff), ("ffn_down", n_embd)):
                w.add_tensor(f"blk.{il}.{name}.bias", (rng.standard_normal(n) * 0.1).astype(np.float32))
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(root / dst)


relabel("tiny-qwen2-Q8_0.gguf", "tiny-llama-Q8_0.gguf", "tiny-llama", llama3=False)
relabel("tiny-qwen2-Q4_0.gguf", "tiny-llama3-Q4_0.gguf", "tiny-llama3", llama3=True)
def phi3(src, dst):
    r = GGUFReader(root / src)
    w = GGUFWriter(root / dst, "phi3")
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        new = "phi3." + key[len("qwen2."):] if key.startswith("qwen2.") else key
        vtype = field.types[0]
        value = field.contents()
        if key == "general.name":
            # Not "phi3": llama.cpp gives the special tokens of a model so named Phi-3's
            # whitespace stripping, which needs tokens this vocabulary lacks.
            value = "tiny-p3"
        if key == "qwen2.context_length":
            value = 4096
        if vtype == VT.ARRAY:
            w.add_key_value(new, value, vtype, sub_type=field.types[1])
        else:
            w.add_key_value(new, value, vtype)
    w.add_key_value("phi3.rope.dimension_count", 32, VT.UINT32)
    w.add_key_value("phi3.rope.scaling.original_context_length", 256, VT.UINT32)
    w.add_key_value("phi3.rope.scaling.attn_factor", 1.19, VT.FLOAT32)
    w.add_key_value("phi3.attention.sliding_window", 2047, VT.UINT32)
    pairs = np.arange(16, dtype=np.float32)
    w.add_tensor("rope_factors_long.weight", (1.0 + pairs * 0.5).astype(np.float32))
    w.add_tensor("rope_factors_short.weight", (1.0 + pairs * 0.05).astype(np.float32))
    tensors = {t.name: t for t in r.tensors}
    for t in r.tensors:
        name = t.name
        if name.endswith(".bias") or name.endswith("attn_k.weight") or name.endswith("attn_v.weight") \
                or name.endswith("ffn_gate.weight"):
            continue
        data = np.asarray(t.data)
        if name.endswith("attn_q.weight"):
            blk = name[: -len("attn_q.weight")]
            name = blk + "attn_qkv.weight"
            data = np.concatenate([np.asarray(tensors[blk + s].data) for s in
                                   ("attn_q.weight", "attn_k.weight", "attn_v.weight")], axis=0)
        elif name.endswith("ffn_up.weight"):
            blk = name[: -len("ffn_up.weight")]
            data = np.concatenate([np.asarray(tensors[blk + s].data) for s in
                                   ("ffn_gate.weight", "ffn_up.weight")], axis=0)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(root / dst)


def llama_spm(src, dst):
    from gguf import GGMLQuantizationType as QT, quants
    vocab = Path.home() / ".cache/minfer/llama-vocab-0c1e570/ggml-vocab-llama-spm.gguf"
    v = GGUFReader(vocab)
    r = GGUFReader(root / src)
    w = GGUFWriter(root / dst, "llama")
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key.startswith("tokenizer."):
            continue
        new = "llama." + key[len("qwen2."):] if key.startswith("qwen2.") else key
        value = "tiny-llama-spm" if key == "general.name" else field.contents()
        if field.types[0] == VT.ARRAY:
            w.add_key_value(new, value, field.types[0], sub_type=field.types[1])
        else:
            w.add_key_value(new, value, field.types[0])
    for key, field in v.fields.items():
        if key.startswith("tokenizer."):
            if field.types[0] == VT.ARRAY:
                w.add_key_value(key, field.contents(), field.types[0], sub_type=field.types[1])
            else:
                w.add_key_value(key, field.contents(), field.types[0])
    n_vocab = len(v.fields["tokenizer.ggml.tokens"].contents())
    old = next(t for t in r.tensors if t.name == "token_embd.weight")
    scale = float(np.std(quants.dequantize(np.asarray(old.data), old.tensor_type)))
    rng = np.random.default_rng(42)
    embd = (rng.standard_normal((n_vocab, 256)) * scale).astype(np.float32)
    q = quants.quantize(embd, QT.Q4_0)
    w.add_tensor("token_embd.weight", q, raw_shape=q.shape, raw_dtype=QT.Q4_0)
    for t in r.tensors:
        if t.name in ("token_embd.weight", "output.weight"):
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(root / dst)


phi3("tiny-qwen2-Q4_0.gguf", "tiny-phi3-Q4_0.gguf")
llama_spm("tiny-qwen2-Q4_0.gguf", "tiny-llama-spm-Q4_0.gguf")
relabel("tiny-qwen2-Q4_0.gguf", "tiny-granite-Q4_0.gguf", "tiny-granite", llama3=False, arch="granite",
        extra=[("granite.embedding_scale", 12.0), ("granite.residual_scale", 0.22),
               ("granite.attention.scale", 0.015625), ("granite.logit_scale", 1.25)])
