#!/usr/bin/env python3
"""Check the tiny MoE fixtures (scripts/gen_tiny_moe.py) against llama.cpp's references: a plain
numpy forward pass (float64) of each F32 file over the reference prompts' tokens, its logits
compared with `tests/fixtures/tiny-reference/<stem>/<i>.f32`, and how often each expert of each
layer was picked (so a degenerate router, one expert for every token, would show).

    .venv/bin/python scripts/check_tiny_moe.py
"""
import json
from pathlib import Path
import numpy as np
from gguf import GGUFReader

base = Path(__file__).resolve().parent.parent / "tests/fixtures"


def forward(path, tokens, counts):
    r = GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    kv = lambda k, d=None: r.fields[f"{arch}.{k}"].contents() if f"{arch}.{k}" in r.fields else d
    T = {t.name: np.asarray(t.data).astype(np.float64) for t in r.tensors}
    n_layer, n_head, n_kv = kv("block_count"), kv("attention.head_count"), kv("attention.head_count_kv")
    eps, theta, n_used = kv("attention.layer_norm_rms_epsilon"), kv("rope.freq_base"), kv("expert_used_count")
    n_embd = kv("embedding_length")
    hd = kv("attention.key_length", n_embd // n_head)
    neox = arch != "llama"
    norm_w = arch != "qwen2moe"
    rms = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
    silu = lambda x: x / (1 + np.exp(-x))

    def rope(x):  # x: (n, heads, hd)
        pos = np.arange(x.shape[0])[:, None, None]
        freq = theta ** (-np.arange(0, hd, 2) / hd)
        ang = pos * freq
        c, s = np.cos(ang), np.sin(ang)
        if neox:
            a, b = x[..., : hd // 2], x[..., hd // 2:]
            return np.concatenate([a * c - b * s, a * s + b * c], -1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
        return out

    x = T["token_embd.weight"][tokens]
    n = len(tokens)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for il in range(n_layer):
        p = lambda s: T[f"blk.{il}.{s}"]
        g = lambda s: T.get(f"blk.{il}.{s}")
        h = rms(x, p("attn_norm.weight"))
        q, k, v = (h @ p(f"attn_{c}.weight").T for c in "qkv")
        if g("attn_q.bias") is not None:
            q, k, v = q + p("attn_q.bias"), k + p("attn_k.bias"), v + p("attn_v.bias")
        q, k, v = q.reshape(n, n_head, hd), k.reshape(n, n_kv, hd), v.reshape(n, n_kv, hd)
        if g("attn_q_norm.weight") is not None:
            q, k = rms(q, p("attn_q_norm.weight")), rms(k, p("attn_k_norm.weight"))
        q, k = rope(q), rope(k)
        rep = n_head // n_kv
        k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
        sc = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        sc /= sc.sum(-1, keepdims=True)
        att = np.einsum("hqk,khd->qhd", sc, v).reshape(n, n_head * hd)
        x = x + att @ p("attn_output.weight").T
        h = rms(x, p("ffn_norm.weight"))
        logits = h @ p("ffn_gate_inp.weight").T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        top = np.argsort(-probs, -1, kind="stable")[:, :n_used]
        counts[il] += np.bincount(top.ravel(), minlength=probs.shape[1])
        wts = np.take_along_axis(probs, top, -1)
        if norm_w:
            wts /= wts.sum(-1, keepdims=True)
        out = np.zeros_like(x)
        G, U, D = p("ffn_gate_exps.weight"), p("ffn_up_exps.weight"), p("ffn_down_exps.weight")
        for t in range(n):
            for e, wt in zip(top[t], wts[t]):
                out[t] += wt * (D[e] @ (silu(G[e] @ h[t]) * (U[e] @ h[t])))
        if g("ffn_gate_inp_shexp.weight") is not None:
            sg = 1 / (1 + np.exp(-(h @ p("ffn_gate_inp_shexp.weight"))))
            sh = (silu(h @ p("ffn_gate_shexp.weight").T) * (h @ p("ffn_up_shexp.weight").T)) @ p("ffn_down_shexp.weight").T
            out += sg[:, None] * sh
        x = x + out
    x = rms(x, T["output_norm.weight"])
    return x @ T.get("output.weight", T["token_embd.weight"]).T


for stem in ("tiny-qwen3moe-F32", "tiny-qwen2moe-F32", "tiny-mixtral-F32"):
    ref = base / "tiny-reference" / stem
    counts = None
    worst = 0.0
    agree = total = 0
    for line in open(ref / "prompts.jsonl", encoding="utf-8"):
        rec = json.loads(line)
        if counts is None:
            counts = np.zeros((2, 8), dtype=int)
        ours = forward(base / "models" / f"{stem}.gguf", rec["tokens"], counts)
        if rec["logits_file"]:
            theirs = np.fromfile(ref / rec["logits_file"], dtype="<f4").reshape(len(rec["tokens"]), -1)
            worst = max(worst, float(np.abs(ours - theirs).max()))
            agree += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
            total += len(rec["tokens"])
        assert ours[-1].argmax() == rec["top20_last"][0][0] or \
            rec["top20_last"][0][1] - rec["top20_last"][1][1] < 1e-2, (stem, rec["index"])
    print(f"{stem}: max |numpy - llama.cpp| logit {worst:.4f}, argmax agrees at {agree}/{total} "
          f"positions; experts picked per layer {counts.tolist()}")
