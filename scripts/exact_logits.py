#!/usr/bin/env python3
"""The exact logits of a one-token prompt on a Qwen2 GGUF model: the weights dequantized by
gguf-py, every product in f64 (numpy), nothing quantized on the way. An independent reference
for backends that multiply in floating point (wgpu): llama.cpp's CPU, and minfer's, quantize
the activations to Q8 for their dot products and so sit measurably away from it.

At position 0 attention over one token is that token's V (RoPE leaves position 0 unchanged and
the softmax of one score is 1), so the forward is norms, products and SwiGLU only.

    .venv/bin/python scripts/exact_logits.py MODEL.gguf TOKEN_ID OUT.f32

Made tests/fixtures/qwen25-exact/hello.f32 (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, token 9707,
"Hello").
"""
import numpy as np, sys
from gguf import GGUFReader, quants
r = GGUFReader(sys.argv[1])
T = {t.name: t for t in r.tensors}
def W(name):
    t = T[name]
    a = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    shape = [int(x) for x in t.shape][::-1]  # rows last
    return a.reshape(shape)
def f(key):
    return r.fields[key].parts[r.fields[key].data[0]][0]
n_layer = int(f('qwen2.block_count')); eps = float(f('qwen2.attention.layer_norm_rms_epsilon'))
n_head = int(f('qwen2.attention.head_count')); n_kv = int(f('qwen2.attention.head_count_kv'))
tok = int(sys.argv[2])
emb = W('token_embd.weight')
x = emb[tok].astype(np.float64)
def rms(v, w): return v / np.sqrt((v*v).mean() + eps) * w
for l in range(n_layer):
    p = f'blk.{l}.'
    h = rms(x, W(p+'attn_norm.weight'))
    v = W(p+'attn_v.weight') @ h + W(p+'attn_v.bias')
    hd = v.shape[0] // n_kv
    # one token: softmax over one position = its V; GQA repeats the kv heads
    rep = n_head // n_kv
    attn = np.concatenate([v[(i // rep)*hd:(i // rep + 1)*hd] for i in range(n_head)])
    x = x + W(p+'attn_output.weight') @ attn
    h = rms(x, W(p+'ffn_norm.weight'))
    g = W(p+'ffn_gate.weight') @ h; u = W(p+'ffn_up.weight') @ h
    x = x + W(p+'ffn_down.weight') @ (g / (1 + np.exp(-g)) * u)
x = rms(x, W('output_norm.weight'))
out = W('output.weight') if 'output.weight' in T else emb
(out @ x).astype(np.float32).tofile(sys.argv[3])
