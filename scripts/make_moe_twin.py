#!/usr/bin/env python3
"""A random-weight Qwen3-MoE model with Qwen3-30B-A3B's layer shape, for speed tests of the MoE
path where the real 18 GB file cannot travel (imitates /work/shared/reference/twins/make_twin.py,
which makes constant-weight dense Qwen2 twins). Outputs are meaningless, but the tensors, their
sizes and types and the routing are those of a real Qwen3-30B-A3B Q4_K_M file: weights are
random (not one repeated block) so the router spreads the tokens over the experts, as a trained
router does, and a prompt batch touches most of the 128 experts of each layer.

Shape (arch `qwen3moe`): n_embd 2048, 32 query heads, 4 KV heads, head_dim 128 (key_length =
value_length = 128, Q/K norms), 128 experts of width 768 (`expert_feed_forward_length`), 8 used,
`feed_forward_length` 6144 (as the real file), rope base 1e6, rms eps 1e-6, context 40960, the
untied output, and the 151936-token Qwen2.5 tokenizer (every `tokenizer.*` key of SRC, e.g. the
default model qwen2.5-coder-0.5b-instruct-q4_k_m.gguf). Only N_LAYER layers (default 8, not 48):
enough that the layers, not the 151936-row output head, carry most of a decoded token's bytes.

Weights (numpy default_rng(SEED), default 30): N(0, 1) times 1/sqrt(fan-in) for every matrix,
3/sqrt(2048) for the router (router logits spread with a standard deviation of ~3), N(0, 1) for
the token embedding, norms 1. Written as BF16 (norms and router F32), tensor by tensor, so
memory stays around 1 GB; then llama.cpp's quantizer makes the Q4_K_M file with its usual
mixture (Q4_K; Q6_K for the output, and for ffn_down_exps / attn_v of some layers):

    .venv/bin/python scripts/make_moe_twin.py ~/.cache/minfer/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        /tmp/qwen3moe-twin-BF16.gguf [N_LAYER [SEED]]
    llama-quantize /tmp/qwen3moe-twin-BF16.gguf \\
        ~/.cache/minfer/models/qwen3moe-30b-a3b-twin-Q4_K_M.gguf Q4_K_M 2
"""
import sys
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType as V
from gguf.constants import GGMLQuantizationType as T

src, dst = sys.argv[1], sys.argv[2]
n_layer = int(sys.argv[3]) if len(sys.argv) > 3 else 8
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 30
n_embd, n_head, n_head_kv, hd = 2048, 32, 4, 128
n_expert, n_used, n_ff_exp = 128, 8, 768
arch = "qwen3moe"

r = GGUFReader(src)
n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
w = GGUFWriter(dst, arch)
w.add_name(f"qwen3moe-30b-a3b-twin-{n_layer}L")
w.add_type("model")
w.add_block_count(n_layer)
w.add_context_length(40960)
w.add_embedding_length(n_embd)
w.add_feed_forward_length(6144)
w.add_head_count(n_head)
w.add_head_count_kv(n_head_kv)
w.add_rope_freq_base(1e6)
w.add_layer_norm_rms_eps(1e-6)
w.add_expert_used_count(n_used)
w.add_key_length(hd)
w.add_value_length(hd)
w.add_expert_count(n_expert)
w.add_expert_feed_forward_length(n_ff_exp)
w.add_file_type(32)  # LLAMA_FTYPE_MOSTLY_BF16
for f in r.fields.values():
    if f.name.startswith("tokenizer."):
        vt = f.types[0]
        sub = f.types[1] if vt == V.ARRAY and len(f.types) > 1 else None
        w.add_key_value(f.name, f.contents(), vt, sub_type=sub)
w.add_quantization_version(2)

# (name, numpy shape, kind): kind "bf16" random matrix, "router" F32 random, "one" F32 ones
plan = [("token_embd.weight", (n_vocab, n_embd), "embd")]
for i in range(n_layer):
    p = f"blk.{i}."
    plan += [
        (p + "attn_norm.weight", (n_embd,), "one"),
        (p + "attn_q.weight", (n_head * hd, n_embd), "bf16"),
        (p + "attn_k.weight", (n_head_kv * hd, n_embd), "bf16"),
        (p + "attn_v.weight", (n_head_kv * hd, n_embd), "bf16"),
        (p + "attn_output.weight", (n_embd, n_head * hd), "bf16"),
        (p + "attn_q_norm.weight", (hd,), "one"),
        (p + "attn_k_norm.weight", (hd,), "one"),
        (p + "ffn_norm.weight", (n_embd,), "one"),
        (p + "ffn_gate_inp.weight", (n_expert, n_embd), "router"),
        (p + "ffn_gate_exps.weight", (n_expert, n_ff_exp, n_embd), "bf16"),
        (p + "ffn_up_exps.weight", (n_expert, n_ff_exp, n_embd), "bf16"),
        (p + "ffn_down_exps.weight", (n_expert, n_embd, n_ff_exp), "bf16"),
    ]
plan += [("output_norm.weight", (n_embd,), "one"), ("output.weight", (n_vocab, n_embd), "bf16")]

for name, shape, kind in plan:
    n = int(np.prod(shape))
    if kind in ("one", "router"):
        w.add_tensor_info(name, shape, np.dtype(np.float32), n * 4)
    else:
        w.add_tensor_info(name, shape, np.dtype(np.uint16), n * 2, raw_dtype=T.BF16)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()

rng = np.random.default_rng(seed)


def bf16(x):
    """float32 -> bf16 bits, round to nearest even (no NaNs here)."""
    u = x.view(np.uint32)
    u += 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


for name, shape, kind in plan:
    if kind == "one":
        w.write_tensor_data(np.ones(shape, np.float32))
    elif kind == "router":
        w.write_tensor_data(rng.standard_normal(shape, dtype=np.float32) * np.float32(3 / np.sqrt(shape[-1])))
    else:
        scale = np.float32(1.0 if kind == "embd" else 1 / np.sqrt(shape[-1]))
        out = np.empty(shape, np.uint16)
        flat, rows = out.reshape(-1, shape[-1]), int(np.prod(shape[:-1]))
        step = max(1, (1 << 24) // shape[-1])
        for r0 in range(0, rows, step):
            x = rng.standard_normal((min(step, rows - r0), shape[-1]), dtype=np.float32)
            x *= scale
            flat[r0:r0 + len(x)] = bf16(x)
        w.write_tensor_data(out)
    print(name, shape, kind, flush=True)
w.close()
print(dst)
