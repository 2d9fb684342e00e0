#!/usr/bin/env python3
"""Write tests/fixtures/models/tiny-llama-Q8_0.gguf: the tiny qwen2 Q8_0 fixture relabelled as
the `llama` architecture (`general.architecture = llama`, its `qwen2.*` keys renamed `llama.*`,
everything else — tokenizer, tensors and their bytes, the Q/K/V biases llama takes as optional —
unchanged). llama.cpp then runs it with adjacent-pair RoPE, which is what it tests.

    .venv/bin/python scripts/gen_tiny_llama.py
"""
from pathlib import Path
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType as VT

root = Path(__file__).resolve().parent.parent
src = root / "tests/fixtures/models/tiny-qwen2-Q8_0.gguf"
dst = root / "tests/fixtures/models/tiny-llama-Q8_0.gguf"
r = GGUFReader(src)
w = GGUFWriter(dst, "llama")
for key, field in r.fields.items():
    if key.startswith("GGUF.") or key == "general.architecture":
        continue
    name = "llama." + key[len("qwen2."):] if key.startswith("qwen2.") else key
    vtype = field.types[0]
    if key == "general.name":
        w.add_key_value(name, "tiny-llama", vtype)
    elif vtype == VT.ARRAY:
        w.add_key_value(name, field.contents(), vtype, sub_type=field.types[1])
    else:
        w.add_key_value(name, field.contents(), vtype)
for t in r.tensors:
    w.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(dst)
