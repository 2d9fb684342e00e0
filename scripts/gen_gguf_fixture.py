#!/usr/bin/env python3
"""Write tests/fixtures/gguf/pywritten.gguf with gguf-py's GGUFWriter and dump
it to tests/fixtures/gguf/pywritten.json with scripts/gguf_dump.py.

Run with the pinned virtualenv:

    scripts/python-env.sh
    .venv/bin/python scripts/gen_gguf_fixture.py

The file is a pure function of the pinned package versions and SEED, so
running the script again reproduces both files byte for byte.

GGUFWriter in gguf-py 0.19.0 refuses to write an empty array (add_array()
silently drops it, the packer raises) and packs the elements of an inner
array with an inferred type (int -> INT32), so it cannot write an array of
arrays of UINT32. FixtureWriter below only adds those two cases, through an
explicitly typed TypedArray value; everything else goes through the stock
writer. add_string() also silently drops empty strings, so the empty string
goes through add_key_value() directly.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "tests" / "fixtures" / "gguf"
GGUF_PATH = OUT_DIR / "pywritten.gguf"
JSON_PATH = OUT_DIR / "pywritten.json"
DUMP_SCRIPT = REPO_ROOT / "scripts" / "gguf_dump.py"

ARCH = "tiny-test"
ALIGNMENT = 64
SEED = 7070


@dataclass(frozen=True)
class TypedArray:
    """A GGUF array value with an explicit element type (may be empty)."""
    itype: VT
    items: tuple[Any, ...]


class FixtureWriter(gguf.GGUFWriter):
    def _pack_val(self, val: Any, vtype: VT, add_vtype: bool, sub_type: VT | None = None) -> bytes:
        if vtype == VT.ARRAY and isinstance(val, TypedArray):
            out = bytearray()
            if add_vtype:
                out += self._pack("I", vtype)
            out += self._pack("I", val.itype)
            out += self._pack("Q", len(val.items))
            for item in val.items:
                out += self._pack_val(item, val.itype, add_vtype=False)
            return bytes(out)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype("<f2").reshape(-1, 1).view(np.uint8)


def random_kquant(rng: np.random.Generator, qtype: QT, n_blocks: int) -> np.ndarray:
    """Random super-blocks with finite f16 scale fields at sane magnitudes."""
    _, type_size = gguf.constants.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    d = (rng.uniform(1e-3, 1e-1, n_blocks) * np.where(rng.random(n_blocks) < 0.5, -1, 1)).astype(np.float16)
    if qtype == QT.Q4_K:       # d @0, dmin @2, scales[12] @4, qs[128] @16
        dmin = rng.uniform(1e-3, 1e-1, n_blocks).astype(np.float16)
        raw[:, 0:2] = f16_bytes(d)
        raw[:, 2:4] = f16_bytes(dmin)
    elif qtype == QT.Q6_K:     # ql[128] @0, qh[64] @128, scales[16] @192, d @208
        raw[:, 208:210] = f16_bytes(d)
    else:
        raise ValueError(qtype)
    return raw


def add_metadata(w: FixtureWriter) -> None:
    # general.architecture is added by the GGUFWriter constructor (first key)
    w.add_name("minfer gguf-py fixture")
    w.add_custom_alignment(ALIGNMENT)            # general.alignment, UINT32
    w.add_context_length(128)                    # tiny-test.context_length
    w.add_embedding_length(64)                   # tiny-test.embedding_length

    # one of every scalar type
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.1)               # stored as the f32 nearest 0.1
    w.add_float32("test.f32_exact", -1.25)
    w.add_bool("test.bool_true", True)
    w.add_bool("test.bool_false", False)
    w.add_string("test.string", "hello, GGUF")
    w.add_string("test.string_utf8", "h\u00e9llo w\u00f6rld \u2014 \u65e5\u672c\u8a9e \U0001F680")
    w.add_key_value("test.string_empty", "", VT.STRING)
    w.add_uint64("test.u64", (1 << 40) + 12345)
    w.add_uint64("test.u64_max", (1 << 64) - 1)
    w.add_int64("test.i64", -(1 << 53) - 1)     # not representable as f64
    w.add_float64("test.f64", 2.718281828459045)
    w.add_float64("test.f64_small", -1.0e-300)

    # arrays through the stock writer
    w.add_array("test.arr_u8", bytes([0, 1, 127, 128, 255]))                   # UINT8
    w.add_array("test.arr_i32", [0, -1, 2147483647, -2147483648, 42])          # INT32
    w.add_array("test.arr_f32", [0.0, -1.5, 0.1, 1e-8, 3.0e38])                # FLOAT32
    w.add_array("test.arr_str", ["", "a", "\u00fcn\u00efc\u00f6d\u00e9", "with space", "tab\tnl\n"])
    w.add_array("test.arr_bool", [True, False, True])                          # BOOL
    w.add_key_value("test.arr_u64", [0, (1 << 63) + 1], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("test.arr_f64", [0.5, -1e-10], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_key_value("test.arr_i16", [-32768, 32767], VT.ARRAY, sub_type=VT.INT16)
    # array of arrays of strings: the stock writer infers STRING for the inner items
    w.add_key_value("test.nested_str", [["a", "b"], ["c"], ["\u65e5\u672c", "", "d"]],
                    VT.ARRAY, sub_type=VT.ARRAY)

    # cases the stock writer cannot express (see module docstring)
    w.add_key_value("test.arr_empty", TypedArray(VT.UINT32, ()), VT.ARRAY)
    w.add_key_value("test.arr_empty_str", TypedArray(VT.STRING, ()), VT.ARRAY)
    w.add_key_value("test.nested_u32", TypedArray(VT.ARRAY, (
        TypedArray(VT.UINT32, (1, 2, 3)),
        TypedArray(VT.UINT32, ()),
        TypedArray(VT.UINT32, (4294967295,)),
    )), VT.ARRAY)


def add_tensors(w: FixtureWriter) -> None:
    rng = np.random.default_rng(SEED)

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 1.0, shape).astype(np.float32)

    # numpy shapes are (..., ne1, ne0); the file stores ne0 first
    w.add_tensor("token_embd.weight", normal(4, 10))                      # F32 2-D, 160 B
    w.add_tensor("output_norm.weight", normal(7))                         # F32 1-D, 28 B
    w.add_tensor("blk.0.attn_q.weight", normal(3, 16).astype(np.float16))  # F16 2-D
    w.add_tensor("blk.0.attn_k.weight",                                   # BF16 3-D
                 gguf.quants.quantize(normal(2, 3, 8), QT.BF16), raw_dtype=QT.BF16)
    w.add_tensor("blk.0.ffn_up.weight",                                   # Q4_0 2-D
                 gguf.quants.quantize(normal(4, 64), QT.Q4_0), raw_dtype=QT.Q4_0)
    w.add_tensor("blk.0.ffn_down.weight",                                 # Q8_0 3-D
                 gguf.quants.quantize(normal(2, 2, 32), QT.Q8_0), raw_dtype=QT.Q8_0)
    w.add_tensor("blk.0.ffn_gate.weight",                                 # Q4_K 2-D
                 random_kquant(rng, QT.Q4_K, 2), raw_dtype=QT.Q4_K)
    w.add_tensor("output.weight",                                         # Q6_K 1-D
                 random_kquant(rng, QT.Q6_K, 1).reshape(-1), raw_dtype=QT.Q6_K)


def main() -> int:
    if sys.byteorder != "little":
        print("this script assumes a little-endian host", file=sys.stderr)
        return 1
    OUT_DIR.mkdir(parents=True, exist_ok=True)

    w = FixtureWriter(GGUF_PATH, ARCH)
    add_metadata(w)
    add_tensors(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {GGUF_PATH.relative_to(REPO_ROOT)} ({GGUF_PATH.stat().st_size} bytes)", file=sys.stderr)

    dumped = subprocess.run([sys.executable, str(DUMP_SCRIPT), str(GGUF_PATH)],
                            check=True, stdout=subprocess.PIPE).stdout
    JSON_PATH.write_bytes(dumped)
    print(f"wrote {JSON_PATH.relative_to(REPO_ROOT)} ({len(dumped)} bytes)", file=sys.stderr)
    print(f"gguf {metadata.version('gguf')}, numpy {np.__version__}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
