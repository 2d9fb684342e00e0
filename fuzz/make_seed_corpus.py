#!/usr/bin/env python3
"""Write the seed corpus of the `gguf_reader` fuzz target to fuzz/corpus/gguf_reader/.

Seeds: the gguf-py-written fixture, the first 64 KiB of a few tiny models (their tensor data is
cut off, so they exercise the metadata and tensor-table parser up to the bounds check), and
small hand-made files, most of them valid, covering every value type, nested arrays, every
supported tensor type and the edge cases of alignment and shapes.

Deterministic; rerunning rewrites the same files. Standard library only.
"""

import os
import random
import struct
import sys

FUZZ = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(FUZZ)
OUT = os.path.join(FUZZ, "corpus", "gguf_reader")

# Value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
# ggml types: id -> (block size, bytes per block).
GGML = {
    "F32": (0, 1, 4),
    "F16": (1, 1, 2),
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
    "Q8_K": (15, 256, 292),
    "BF16": (30, 1, 2),
    "Q2_K": (10, 256, 84),  # not supported by minfer: parsed, never dequantized
}
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
       BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(ty, v):
    if ty == STRING:
        return gstr(v)
    if ty == ARRAY:
        elem_ty, items = v
        out = struct.pack("<IQ", elem_ty, len(items))
        for item in items:
            out += value(elem_ty, item)
        return out
    return struct.pack(FMT[ty], v)


def gguf(kvs=(), tensors=(), version=3, alignment=32, data=b"", n_tensors=None, n_kv=None):
    """kvs: (key, type, value); tensors: (name, type name, shape, offset)."""
    out = b"GGUF" + struct.pack("<I", version)
    out += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors,
                       len(kvs) if n_kv is None else n_kv)
    for key, ty, v in kvs:
        out += gstr(key) + struct.pack("<I", ty) + value(ty, v)
    for name, ty, shape, offset in tensors:
        out += gstr(name) + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", GGML[ty][0], offset)
    out += b"\0" * (-len(out) % alignment)
    return out + data


def tensor_bytes(ty, shape):
    _, block, size = GGML[ty]
    n = 1
    for d in shape:
        n *= d
    return n // block * size


def with_tensors(specs, kvs=(), alignment=32, seed=0):
    """One file holding `specs` (name, type, shape), laid out with random data."""
    rng = random.Random(seed)
    tensors, data = [], b""
    for name, ty, shape in specs:
        data += b"\0" * (-len(data) % alignment)
        tensors.append((name, ty, shape, len(data)))
        blob = bytearray(rng.randbytes(tensor_bytes(ty, shape)))
        if ty in ("F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"):
            # Keep the f16 scales finite most of the time (bit 14 of the high byte clear).
            for i in range(1, len(blob), 2):
                blob[i] &= 0x3B
        data += bytes(blob)
    kvs = list(kvs)
    if alignment != 32:
        kvs.insert(0, ("general.alignment", U32, alignment))
    return gguf(kvs, tensors, alignment=alignment, data=data)


def seeds():
    yield "empty_v3", gguf()
    yield "empty_v2", gguf(version=2)
    yield "arch_and_alignment", gguf([
        ("general.architecture", STRING, "llama"),
        ("general.alignment", U32, 64),
        ("general.name", STRING, "tiny \u00e9\U0001F600"),
    ], alignment=64)
    yield "every_scalar_type", gguf([
        ("u8", U8, 200), ("i8", I8, -5), ("u16", U16, 60000), ("i16", I16, -3000),
        ("u32", U32, 4000000000), ("i32", I32, -7), ("f32", F32, 0.5), ("bool", BOOL, True),
        ("str", STRING, ""), ("u64", U64, 2**64 - 1), ("i64", I64, -(2**53 + 1)),
        ("f64", F64, 1e300),
    ])
    yield "tokenizer", gguf([
        ("general.architecture", STRING, "qwen2"),
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, ["<s>", "</s>", "a", "b", "ab", ""])),
        ("tokenizer.ggml.scores", ARRAY, (F32, [0.0, 0.0, -1.0, -1.0, -2.0, -3.0])),
        ("tokenizer.ggml.token_type", ARRAY, (I32, [3, 3, 1, 1, 1, 1])),
        ("tokenizer.ggml.merges", ARRAY, (STRING, ["a b"])),
        ("tokenizer.ggml.bos_token_id", U32, 0),
    ])
    yield "nested_arrays", gguf([
        ("nested.u32", ARRAY, (ARRAY, [(U32, [1, 2]), (U32, []), (U32, [3])])),
        ("nested.str", ARRAY, (ARRAY, [(STRING, ["x", "yz"]), (STRING, [])])),
        ("nested.deep", ARRAY, (ARRAY, [(ARRAY, [(ARRAY, [(BOOL, [True, False])])])])),
        ("every_array", ARRAY, (U8, [1, 2, 3])),
        ("a.i8", ARRAY, (I8, [-1])), ("a.u16", ARRAY, (U16, [1])), ("a.i16", ARRAY, (I16, [-1])),
        ("a.u64", ARRAY, (U64, [2**40])), ("a.i64", ARRAY, (I64, [-1])),
        ("a.f64", ARRAY, (F64, [0.25])), ("a.bool", ARRAY, (BOOL, [True])),
    ])
    yield "split_part", gguf([
        ("split.no", U16, 0), ("split.count", U16, 2), ("split.tensors.count", I32, 1),
    ])
    yield "f32_tensor", with_tensors([("output_norm.weight", "F32", [4])])
    yield "scalar_and_empty_tensors", with_tensors([
        ("scalar", "F32", []), ("empty", "Q4_0", [32, 0]), ("after", "F16", [3]),
    ])
    yield "align_1", with_tensors([("a", "Q8_0", [32]), ("b", "F16", [1])], alignment=1)
    yield "align_256", with_tensors([("a", "Q4_1", [64]), ("b", "BF16", [5, 2])], alignment=256)
    # One tensor of every type minfer reads, plus one it only parses.
    specs = []
    for ty, (_, block, _) in GGML.items():
        shape = [block * 2, 2] if block > 1 else [8, 3]
        specs.append((f"blk.0.{ty.lower()}.weight", ty, shape))
    yield "every_tensor_type", with_tensors(specs, [("general.architecture", STRING, "llama")])
    for ty, (_, block, _) in GGML.items():
        shape = [block] if block > 1 else [16]
        yield f"tensor_{ty.lower()}", with_tensors([("t", ty, shape)], seed=GGML[ty][0])
    # Invalid on purpose, each stopping the parser at a different check.
    yield "bad_count", gguf(n_kv=2**62)
    yield "truncated_tensor", gguf(tensors=[("w", "F32", [1024], 0)], data=b"\0" * 64)


def main():
    os.makedirs(OUT, exist_ok=True)
    n = 0
    for name, data in seeds():
        with open(os.path.join(OUT, f"hand_{name}.gguf"), "wb") as f:
            f.write(data)
        n += 1
    copies = [("tests/fixtures/gguf/pywritten.gguf", None)]
    for model in ("tiny-qwen2-Q4_K", "tiny-qwen3-Q8_0", "tiny-qwen3-BF16"):
        copies.append((f"tests/fixtures/models/{model}.gguf", 64 * 1024))
    for rel, limit in copies:
        path = os.path.join(ROOT, rel)
        if not os.path.exists(path):
            print(f"skipping missing {rel}", file=sys.stderr)
            continue
        with open(path, "rb") as f:
            data = f.read() if limit is None else f.read(limit)
        name = os.path.basename(rel).removesuffix(".gguf")
        suffix = "" if limit is None else "_first64k"
        with open(os.path.join(OUT, f"fixture_{name}{suffix}.gguf"), "wb") as f:
            f.write(data)
        n += 1
    print(f"wrote {n} seeds to {OUT}")


if __name__ == "__main__":
    main()
