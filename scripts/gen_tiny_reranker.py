#!/usr/bin/env python3
"""Write tests/fixtures/models/tiny-qwen3-reranker-Q8_0.gguf: the tiny random-weight qwen3 fixture
turned into a Qwen3-Reranker the way llama.cpp's convert_hf_to_gguf.py (conversion/qwen.py,
class Qwen3Model, commit 0c1e570) writes one, so that llama.cpp runs it with `--pooling rank`.

The copy is tiny-qwen3-Q8_0.gguf unchanged (every key, every tensor's bytes, same order) plus:

- tensor `cls.output.weight`, F32, GGUF shape [256, 2] (numpy (2, 256)): row 0 the "yes" row,
  row 1 the "no" row of the output head — this model has no `output.weight` (tied embeddings), so
  of `token_embd.weight`, dequantized from Q8_0. The converter takes the rows of the tokens "yes"
  and "no"; this 4003-token vocabulary has "no" (id 2152) but no "yes", so the "yes" row is that
  of "y" (id 88), the first piece "yes" tokenizes into here (y + es);
- `qwen3.pooling_type` = 4 (uint32, LLAMA_POOLING_TYPE_RANK);
- `qwen3.classifier.output_labels` = ["yes", "no"] (the converter writes it too; llama.cpp sizes
  `cls.output.weight` as [n_embd, number of labels] and would reject a 2-row head without it);
- `tokenizer.chat_template.rerank` = the converter's Qwen3-Reranker template (RERANK_TEMPLATE
  below, verbatim), and `tokenizer.chat_templates` = ["rerank"], which gguf-py's
  `add_chat_template` writes with it.

llama.cpp's rank pooling for qwen3 takes the last token's normed hidden state, multiplies it by
`cls.output.weight` and soft-maxes the two logits; the rerank score is the "yes" probability.

    .venv/bin/python scripts/gen_tiny_reranker.py [<llama.cpp source dir>]

It imports gguf-py from the llama.cpp source tree (default: the one below).
"""
import sys
from pathlib import Path

LLAMA_CPP = Path(sys.argv[1] if len(sys.argv) > 1 else
                 "/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp")
sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))

import numpy as np  # noqa: E402
from gguf import GGUFReader, GGUFWriter, GGUFValueType as VT, PoolingType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

# conversion/qwen.py, Qwen3Model.set_gguf_parameters (commit 0c1e570), verbatim
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)

root = Path(__file__).resolve().parent.parent / "tests/fixtures/models"
src = root / "tiny-qwen3-Q8_0.gguf"
dst = root / "tiny-qwen3-reranker-Q8_0.gguf"

r = GGUFReader(src)
arch = r.fields["general.architecture"].contents()
assert arch == "qwen3"

tokens = [bytes(r.fields["tokenizer.ggml.tokens"].parts[i]).decode()
          for i in r.fields["tokenizer.ggml.tokens"].data]


def token_id(*candidates):
    for c in candidates:
        if c in tokens:
            return tokens.index(c), c
    raise KeyError(candidates)


yes_id, yes_piece = token_id("yes", "y")
no_id, no_piece = token_id("no")
assert (yes_id, no_id) == (88, 2152), (yes_id, no_id)

w = GGUFWriter(dst, arch)
for key, field in r.fields.items():
    if key.startswith("GGUF.") or key == "general.architecture":
        continue
    if field.types[0] == VT.ARRAY:
        w.add_key_value(key, field.contents(), field.types[0], sub_type=field.types[1])
    else:
        w.add_key_value(key, field.contents(), field.types[0])
w.add_pooling_type(PoolingType.RANK)
w.add_classifier_output_labels(["yes", "no"])
w.add_chat_template([{"name": "rerank", "template": RERANK_TEMPLATE}])

names = [t.name for t in r.tensors]
head = next(t for t in r.tensors
            if t.name == ("output.weight" if "output.weight" in names else "token_embd.weight"))
rows = dequantize(np.asarray(head.data), head.tensor_type).astype(np.float32)
cls_out = np.stack([rows[yes_id], rows[no_id]]).astype(np.float32)
assert cls_out.shape == (2, 256)

for t in r.tensors:
    w.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
w.add_tensor("cls.output.weight", cls_out)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(dst, f"head {head.name}: yes row {yes_id} ({yes_piece!r}), no row {no_id} ({no_piece!r})")
