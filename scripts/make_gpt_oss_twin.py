#!/usr/bin/env python3
"""A random-weight gpt-oss model with gpt-oss-20b's layer shape, for speed tests where the real
13 GB file cannot travel (as scripts/make_moe_twin.py does for Qwen3-MoE). Outputs are
meaningless; the tensors, their sizes and types, the windowed/global layers, the sinks, the
biases and the routing are those of a gpt-oss-20b file in llama-quantize's MXFP4_MOE mixture:
experts MXFP4, every other matrix Q8_0, router, norms, biases and sinks F32.

Shape (arch `gpt-oss`): n_embd 2880, 64 query heads and 8 KV heads of 64, 32 experts of width
2880, 4 used, sliding window 128 on every other layer, YaRN (factor 32 over 4096, base 150000),
rms eps 1e-5, context 131072, the untied output, and SRC's tokenizer (e.g. the default model's
151936-token Qwen2.5 vocabulary: gpt-oss's own o200k has 201088 rows, so the real head is a
third larger). Only N_LAYER layers (default 8, not 24).

Weights are random bytes (numpy default_rng(SEED), default 31), written block by block without
a float copy: Q8_0 blocks with a scale giving each matrix an RMS of 1/sqrt(fan-in) (the
embedding 1), MXFP4 blocks with exponent byte 120 (RMS about 0.023 ~ 1/sqrt(2880)) and random
nibbles; the router N(0, 1) * 3/sqrt(2880) so tokens spread over the experts; biases and sinks
small N(0, 0.1) / N(0, 1); norms 1.

    .venv/bin/python scripts/make_gpt_oss_twin.py ~/.cache/minfer/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        ~/.cache/minfer/models/gpt-oss-20b-twin-MXFP4.gguf [N_LAYER [SEED]]
"""
import sys
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType as V
from gguf.constants import GGMLQuantizationType as T

src, dst = sys.argv[1], sys.argv[2]
n_layer = int(sys.argv[3]) if len(sys.argv) > 3 else 8
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 31
n_embd, n_head, n_head_kv, hd = 2880, 64, 8, 64
n_expert, n_used, n_ff_exp = 32, 4, 2880
arch = "gpt-oss"

r = GGUFReader(src)
n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
w = GGUFWriter(dst, arch)
w.add_name(f"gpt-oss-20b-twin-{n_layer}L")
w.add_type("model")
for k, v in [("block_count", n_layer), ("context_length", 131072), ("embedding_length", n_embd),
             ("feed_forward_length", n_ff_exp), ("attention.head_count", n_head),
             ("attention.head_count_kv", n_head_kv), ("attention.key_length", hd),
             ("attention.value_length", hd), ("expert_count", n_expert),
             ("expert_used_count", n_used), ("expert_feed_forward_length", n_ff_exp),
             ("attention.sliding_window", 128), ("rope.scaling.original_context_length", 4096)]:
    w.add_key_value(f"{arch}.{k}", v, V.UINT32)
for k, v in [("rope.freq_base", 150000.0), ("attention.layer_norm_rms_epsilon", 1e-5),
             ("rope.scaling.factor", 32.0)]:
    w.add_key_value(f"{arch}.{k}", v, V.FLOAT32)
w.add_key_value(f"{arch}.rope.scaling.type", "yarn", V.STRING)
w.add_file_type(38)  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE
for f in r.fields.values():
    if f.name.startswith("tokenizer."):
        vt = f.types[0]
        sub = f.types[1] if vt == V.ARRAY and len(f.types) > 1 else None
        w.add_key_value(f.name, f.contents(), vt, sub_type=sub)
w.add_quantization_version(2)

# (name, numpy shape, kind): q8 / mxfp4 random blocks, f32 N(0, std), "one" F32 ones.
plan = [("token_embd.weight", (n_vocab, n_embd), "q8", 1.0)]
q_out, kv_out = n_head * hd, n_head_kv * hd
for i in range(n_layer):
    p = f"blk.{i}."
    plan += [
        (p + "attn_norm.weight", (n_embd,), "one", 0),
        (p + "attn_q.weight", (q_out, n_embd), "q8", 1 / np.sqrt(n_embd)),
        (p + "attn_q.bias", (q_out,), "f32", 0.1),
        (p + "attn_k.weight", (kv_out, n_embd), "q8", 1 / np.sqrt(n_embd)),
        (p + "attn_k.bias", (kv_out,), "f32", 0.1),
        (p + "attn_v.weight", (kv_out, n_embd), "q8", 1 / np.sqrt(n_embd)),
        (p + "attn_v.bias", (kv_out,), "f32", 0.1),
        (p + "attn_output.weight", (n_embd, q_out), "q8", 1 / np.sqrt(q_out)),
        (p + "attn_output.bias", (n_embd,), "f32", 0.1),
        (p + "attn_sinks.weight", (n_head,), "f32", 1.0),
        (p + "post_attention_norm.weight", (n_embd,), "one", 0),
        (p + "ffn_gate_inp.weight", (n_expert, n_embd), "f32", 3 / np.sqrt(n_embd)),
        (p + "ffn_gate_inp.bias", (n_expert,), "f32", 0.1),
        (p + "ffn_gate_exps.weight", (n_expert, n_ff_exp, n_embd), "mxfp4", 0),
        (p + "ffn_gate_exps.bias", (n_expert, n_ff_exp), "f32", 0.1),
        (p + "ffn_up_exps.weight", (n_expert, n_ff_exp, n_embd), "mxfp4", 0),
        (p + "ffn_up_exps.bias", (n_expert, n_ff_exp), "f32", 0.1),
        (p + "ffn_down_exps.weight", (n_expert, n_embd, n_ff_exp), "mxfp4", 0),
        (p + "ffn_down_exps.bias", (n_expert, n_embd), "f32", 0.1),
    ]
plan += [("output_norm.weight", (n_embd,), "one", 0), ("output.weight", (n_vocab, n_embd), "q8", 1 / np.sqrt(n_embd))]

BLOCK = {"q8": (T.Q8_0, 34), "mxfp4": (T.MXFP4, 17)}
for name, shape, kind, _ in plan:
    n = int(np.prod(shape))
    if kind in BLOCK:
        qt, size = BLOCK[kind]
        byte_shape = (*shape[:-1], shape[-1] // 32 * size)
        w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), n // 32 * size, raw_dtype=qt)
    else:
        w.add_tensor_info(name, shape, np.dtype(np.float32), n * 4)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()

rng = np.random.default_rng(seed)
for name, shape, kind, std in plan:
    n = int(np.prod(shape))
    if kind == "one":
        w.write_tensor_data(np.ones(shape, np.float32))
    elif kind == "f32":
        w.write_tensor_data(rng.standard_normal(shape, dtype=np.float32) * np.float32(std))
    else:
        qt, size = BLOCK[kind]
        blocks = rng.integers(0, 256, (n // 32, size), dtype=np.uint8)
        if kind == "q8":
            # int8 uniform on [-128, 127] has RMS ~74: the f16 scale makes the block's RMS `std`.
            blocks[:, :2] = np.frombuffer(np.float16(std / 74).tobytes(), np.uint8)
        else:
            blocks[:, 0] = 120  # e8m0 exponent: 2^(120-128) times the e2m1 values (RMS ~5.9)
        w.write_tensor_data(blocks.reshape(*shape[:-1], shape[-1] // 32 * size))
    print(name, shape, kind, flush=True)
w.close()
print(dst)
