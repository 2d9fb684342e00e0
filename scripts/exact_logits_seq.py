#!/usr/bin/env python3
"""The exact last-position logits of a prompt on a qwen2 or llama GGUF model: the weights
dequantized by gguf-py, the whole causal forward in f64 (numpy) — RMSNorm, Q/K/V (with the biases
the file has), RoPE in the architecture's pairing (NeoX halves for qwen2, adjacent pairs for
llama), softmax attention over every earlier position with grouped KV heads, SwiGLU — nothing
quantized on the way. An independent reference where llama.cpp and minfer (both quantizing the
activations to Q8 and the KV cache to f16) sit at comparable distances from each other.

    .venv/bin/python scripts/exact_logits_seq.py MODEL.gguf OUT.f32 TOKEN_ID...

Used for the SmolLM2 bounds in docs/testing.md (tests/fixtures/smollm2-exact/).
"""
import numpy as np, sys
from gguf import GGUFReader, quants

r = GGUFReader(sys.argv[1])
out = sys.argv[2]
toks = [int(t) for t in sys.argv[3:]]
T = {t.name: t for t in r.tensors}

def W(name):
    t = T[name]
    a = quants.dequantize(t.data, t.tensor_type).astype(np.float64)
    return a.reshape([int(x) for x in t.shape][::-1])

def f(key, default=None):
    if key not in r.fields:
        return default
    fl = r.fields[key]
    return fl.parts[fl.data[0]][0]

arch = bytes(r.fields['general.architecture'].parts[-1]).decode()
neox = {'qwen2': True, 'llama': False}[arch]
n_layer = int(f(f'{arch}.block_count'))
eps = float(f(f'{arch}.attention.layer_norm_rms_epsilon'))
n_head = int(f(f'{arch}.attention.head_count'))
n_kv = int(f(f'{arch}.attention.head_count_kv'))
base = float(f(f'{arch}.rope.freq_base', 10000.0))
emb = W('token_embd.weight')
n = len(toks)
x = emb[toks]  # [n, n_embd]

def rms(v, w):
    return v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + eps) * w

def lin(h, p, name):
    y = h @ W(p + name + '.weight').T
    if p + name + '.bias' in T:
        y = y + W(p + name + '.bias')
    return y

def rope(v, hd):  # v: [n, heads, hd]
    pos = np.arange(n)[:, None]
    inv = base ** (-np.arange(0, hd, 2) / hd)  # [hd/2]
    ang = pos * inv[None, :]  # [n, hd/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if neox:
        a, b = v[..., : hd // 2], v[..., hd // 2 :]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
    a, b = v[..., 0::2], v[..., 1::2]
    o = np.empty_like(v)
    o[..., 0::2], o[..., 1::2] = a * c - b * s, a * s + b * c
    return o

for l in range(n_layer):
    p = f'blk.{l}.'
    h = rms(x, W(p + 'attn_norm.weight'))
    q, k, v = lin(h, p, 'attn_q'), lin(h, p, 'attn_k'), lin(h, p, 'attn_v')
    hd = q.shape[1] // n_head
    q = rope(q.reshape(n, n_head, hd), hd)
    k = rope(k.reshape(n, n_kv, hd), hd)
    v = v.reshape(n, n_kv, hd)
    rep = n_head // n_kv
    att = np.empty((n, n_head, hd))
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for hh in range(n_head):
        s = q[:, hh, :] @ k[:, hh // rep, :].T / np.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=1, keepdims=True))
        att[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, hh // rep, :]
    x = x + att.reshape(n, n_head * hd) @ W(p + 'attn_output.weight').T
    h = rms(x, W(p + 'ffn_norm.weight'))
    g, u = lin(h, p, 'ffn_gate'), lin(h, p, 'ffn_up')
    x = x + (g / (1 + np.exp(-g)) * u) @ W(p + 'ffn_down.weight').T
h = rms(x[-1], W('output_norm.weight'))
head = W('output.weight') if 'output.weight' in T else emb
(head @ h).astype('<f4').tofile(out)
