#!/usr/bin/env python3
"""Dump a GGUF file as one JSON document, using gguf-py's GGUFReader.

Usage: .venv/bin/python scripts/gguf_dump.py FILE.gguf > FILE.json

Output:

  {"version": 3,
   "metadata": [{"key": ..., "type": "UINT32", "value": 7}, ...],
   "tensors":  [{"name": ..., "type": "Q4_0", "shape": [ne0, ne1, ...],
                 "offset": 0, "sha256": "..."}, ...]}

* metadata is in file order and leaves out the GGUF.version,
  GGUF.tensor_count and GGUF.kv_count pseudo-fields that GGUFReader adds;
* "type" is the GGUFValueType name; an array's value is
  {"type": <element type name>, "items": [...]}, recursively for arrays of
  arrays;
* integers and floats are JSON numbers (floats are the exact f32/f64 value as
  a Python float), bools are JSON booleans, strings are JSON strings;
* a tensor's "shape" is in GGUF/ggml order (ne0 first, as stored in the file),
  "type" is the GGMLQuantizationType name, "offset" is the stored offset
  relative to the start of the data section, "sha256" is the hash of the
  tensor's raw bytes in the file.

GGUFReader in gguf-py 0.19.0 flattens arrays of arrays in
ReaderField.contents() (and records only the first element's nested types),
so values are rebuilt here from the field's raw parts instead, which keep the
full structure. For flat values the result is cross-checked against
contents().
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGMLQuantizationType

SYNTHETIC_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


def _scalar(part: np.ndarray, vtype: GGUFValueType) -> Any:
    assert part.shape == (1,), (vtype, part.shape)
    v = part[0]
    if vtype == GGUFValueType.BOOL:
        return bool(v)
    if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        f = float(v)
        if not math.isfinite(f):
            raise ValueError(f"non-finite float {f!r} cannot be written as JSON")
        return f
    return int(v)


def _decode(parts: list[np.ndarray], pos: int, vtype: GGUFValueType) -> tuple[Any, int]:
    """Decode one value of type vtype from parts[pos:]; return (value, next pos).

    The part layout follows GGUFReader._get_field_parts: a scalar is one part,
    a string is (length, bytes), an array is (element type, length) followed
    by the parts of each element in turn.
    """
    if vtype == GGUFValueType.STRING:
        length, data = parts[pos], parts[pos + 1]
        assert int(length[0]) == data.size
        return bytes(data).decode("utf-8"), pos + 2
    if vtype == GGUFValueType.ARRAY:
        itype = GGUFValueType(int(parts[pos][0]))
        count = int(parts[pos + 1][0])
        pos += 2
        items = []
        for _ in range(count):
            item, pos = _decode(parts, pos, itype)
            items.append(item)
        return {"type": itype.name, "items": items}, pos
    return _scalar(parts[pos], vtype), pos + 1


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, dict):
        out: list[Any] = []
        for item in value["items"]:
            out.extend(_flatten(item))
        return out
    return [value]


def decode_field(field) -> dict[str, Any]:
    # parts: [key length, key bytes, value type, <value parts...>]
    assert bytes(field.parts[1]).decode("utf-8") == field.name
    vtype = GGUFValueType(int(field.parts[2][0]))
    value, end = _decode(field.parts, 3, vtype)
    if end != len(field.parts):
        raise ValueError(f"{field.name}: {len(field.parts) - end} unconsumed parts")
    assert field.types and field.types[0] == vtype

    # cross-check against GGUFReader's own decoding: contents() is exact for
    # scalars and flat arrays, and gives the flattened leaves of nested arrays
    # (when their first element fixes the leaf type)
    if vtype != GGUFValueType.ARRAY:
        expected = field.contents()
        if value != expected:
            raise ValueError(f"{field.name}: decoded {value!r} != contents() {expected!r}")
    elif value["items"] and field.types[-1] != GGUFValueType.ARRAY:
        leaves = _flatten(value)
        expected = list(field.contents())
        if leaves != expected:
            raise ValueError(f"{field.name}: decoded leaves {leaves!r} != contents() {expected!r}")
    return {"key": field.name, "type": vtype.name, "value": value}


def dump(path: str) -> dict[str, Any]:
    reader = GGUFReader(path, "r")
    version = int(reader.fields["GGUF.version"].parts[0][0])

    metadata = [
        decode_field(field)
        for name, field in reader.fields.items()
        if name not in SYNTHETIC_FIELDS
    ]
    kv_count = int(reader.fields["GGUF.kv_count"].parts[0][0])
    if len(metadata) != kv_count:
        raise ValueError(f"kv_count says {kv_count}, decoded {len(metadata)}")

    raw = reader.data  # memmap of the whole file
    tensors = []
    for t in reader.tensors:
        # field parts: [name length, name, n_dims, dims, type, offset]
        n_dims = int(t.field.parts[2][0])
        dims = [int(d) for d in t.field.parts[3]]
        assert len(dims) == n_dims
        stored_offset = int(t.field.parts[5][0])
        assert t.data_offset == reader.data_offset + stored_offset
        ggml_type = GGMLQuantizationType(int(t.field.parts[4][0]))
        assert ggml_type == t.tensor_type
        data = bytes(raw[t.data_offset:t.data_offset + t.n_bytes])
        assert len(data) == t.n_bytes
        tensors.append({
            "name": t.name,
            "type": ggml_type.name,
            "shape": dims,
            "offset": stored_offset,
            "sha256": hashlib.sha256(data).hexdigest(),
        })
    return {"version": version, "metadata": metadata, "tensors": tensors}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} FILE.gguf", file=sys.stderr)
        return 2
    doc = dump(argv[1])
    text = json.dumps(doc, ensure_ascii=False, indent=2, allow_nan=False) + "\n"
    sys.stdout.buffer.write(text.encode("utf-8"))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
