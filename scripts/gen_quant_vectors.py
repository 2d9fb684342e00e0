#!/usr/bin/env python3
"""Generate reference vectors for minfer's quantizers from gguf-py + numpy.

Run with the pinned virtualenv:

    scripts/python-env.sh
    .venv/bin/python scripts/gen_quant_vectors.py

Everything written to tests/fixtures/quant/ is a pure function of the pinned
package versions (see scripts/python-env.sh) and the seeds below, so running
the script again reproduces the files byte for byte.

Files (all little-endian, no header):

  <T>.input.f32            64 x 256 float32 input, identical for every T below
  <T>.quant.bin            gguf.quants.quantize(input, T), rows concatenated
  <T>.dequant.f32          gguf.quants.dequantize(quant, T) as float32
      for T in F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0

  F16.special.* / BF16.special.*
                           same triple for a 1-D vector of special values
                           (+-0, +-inf, NaN, subnormals, ties, extremes)

  <T>.blocks.bin           64 super-blocks of random bytes with sane f16 scales
  <T>.dequant.f32          gguf.quants.dequantize(blocks, T) as float32
      for T in Q2_K Q3_K Q4_K Q5_K Q6_K (gguf-py 0.19.0 cannot quantize these)
      and IQ4_NL IQ4_XS MXFP4 TQ1_0 TQ2_0 and the codebook i-quants IQ2_XXS IQ2_XS
      IQ2_S IQ3_XXS IQ3_S IQ1_S IQ1_M (as many blocks as make 64 x 256 values)
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "tests" / "fixtures" / "quant"

ROWS = 64
COLS = 256
BLOCK = 32  # block size of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0

INPUT_SEED = 20240601
KQUANT_SEEDS = {QT.Q2_K: 2002, QT.Q3_K: 3003, QT.Q4_K: 4004, QT.Q5_K: 5005, QT.Q6_K: 6006,
                QT.IQ4_NL: 4104, QT.IQ4_XS: 4204, QT.MXFP4: 4304, QT.TQ1_0: 1001, QT.TQ2_0: 2020,
                QT.IQ2_XXS: 2201, QT.IQ2_XS: 2202, QT.IQ2_S: 2203, QT.IQ3_XXS: 3301, QT.IQ3_S: 3302,
                QT.IQ1_S: 1101, QT.IQ1_M: 1102}

QUANTIZABLE = [QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0]
DEQUANT_ONLY = [QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_NL, QT.IQ4_XS, QT.MXFP4, QT.TQ1_0, QT.TQ2_0,
                QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S, QT.IQ1_S, QT.IQ1_M]
# The codebook i-quants whose f16 super-scale is their first two bytes.
IQ_D_FIRST = [QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S, QT.IQ1_S]

F32_LE = np.dtype("<f4")
U32_LE = np.dtype("<u4")


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def bits_to_f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=U32_LE).view(F32_LE)


# --------------------------------------------------------------------------
# Input for the block quantizers (and F16 / BF16)
# --------------------------------------------------------------------------

def edge_blocks(rng: np.random.Generator) -> list[np.ndarray]:
    """Hand-made 32-value blocks covering the interesting corner cases."""
    blocks: list[np.ndarray] = []

    def add(values) -> None:
        v = f32(values)
        assert v.shape == (BLOCK,), v.shape
        assert np.all(np.isfinite(v))
        blocks.append(v)

    # 0: all zero (d == 0 -> id == 0 path)
    add(np.zeros(BLOCK))

    # 1: absolute maximum is negative (Q4_0/Q5_0 take the signed max)
    v = np.clip(rng.normal(0.0, 1.0, BLOCK), -3.9, 3.9)
    v[5] = -4.0
    add(v)

    # 2: one large positive outlier among small values
    v = rng.normal(0.0, 0.01, BLOCK)
    v[17] = 50.0
    add(v)

    # 3: one large negative outlier among small values
    v = rng.normal(0.0, 0.01, BLOCK)
    v[0] = -75.0
    add(v)

    # 4, 5: identical values (Q4_1/Q5_1: max == min -> d == 0)
    add(np.full(BLOCK, 0.7))
    add(np.full(BLOCK, -3.25))

    # 6: tiny values ~1e-8 (scales underflow to 0 in f16)
    add(rng.normal(0.0, 1e-8, BLOCK))

    # 7: tiny positive values ~1e-8 (Q4_1/Q5_1 min > 0, underflows)
    add(np.abs(rng.normal(0.0, 1e-8, BLOCK)) + 1e-9)

    # 8: f16-subnormal range ~1e-6 (f16 min normal is 6.1e-5)
    mag = rng.uniform(1e-7, 6e-6, BLOCK)
    add(np.where(rng.random(BLOCK) < 0.5, -mag, mag))

    # 9: Q4_0 ties: max-abs is -8 so d == 1, id == 1 and x + 8.5 is exact;
    #    every other value is a multiple of 0.5 (x.5 values sit exactly on a
    #    rounding boundary)
    add([-8.0] + [k / 2.0 for k in range(-15, 16)])

    # 10: Q5_0 ties: max-abs is -16 so d == 1
    add([-16.0] + [k + 0.5 for k in range(-16, 15)])

    # 11: Q8_0 ties: max-abs is 127 so d == 1; round-half-away-from-zero
    add([127.0] + [k + 0.5 for k in range(-16, 15)])

    # 12: Q4_1 ties: min 0, max 15 so d == 1
    add([0.0, 15.0] + [k + 0.5 for k in range(15)] + [float(k) for k in range(1, 15)] + [7.25])

    # 13: Q5_1 ties: min 0, max 31 so d == 1
    add([0.0, 31.0] + [k + 0.5 for k in range(30)])

    # 14: Q4_1/Q5_1 ties with a negative minimum: min -4, max 11 -> d == 1
    add([-4.0, 11.0] + [k + 0.5 for k in range(-4, 11)] + [k + 0.25 for k in range(-4, 11)])

    # 15: max-abs tie, positive first (argmax picks the first occurrence)
    v = rng.uniform(-2.0, 2.0, BLOCK)
    v[3] = 3.0
    v[20] = -3.0
    add(v)

    # 16: max-abs tie, negative first
    v = rng.uniform(-2.0, 2.0, BLOCK)
    v[3] = -3.0
    v[20] = 3.0
    add(v)

    # 17: f16 / bf16 round-to-nearest-even cases at moderate magnitude
    ties = [
        1.0 + 2.0**-11,              # f16 tie -> 1.0 (even)
        1.0 + 3 * 2.0**-11,          # f16 tie -> 1 + 2^-9 (even)
        1.0 + 2.0**-11 + 2.0**-23,   # just above f16 tie -> rounds up
        1.0 + 2.0**-11 - 2.0**-23,   # just below f16 tie -> rounds down
        -(1.0 + 2.0**-11),
        -(1.0 + 3 * 2.0**-11),
        2049.0,                      # f16 tie -> 2048
        2051.0,                      # f16 tie -> 2052
        -2049.0,
        1.0 + 2.0**-8,               # bf16 tie -> 1.0
        1.0 + 3 * 2.0**-8,           # bf16 tie -> 1 + 2^-6
        1.0 + 2.0**-8 + 2.0**-23,    # just above bf16 tie
        257.0,                       # bf16 tie -> 256
        259.0,                       # bf16 tie -> 260
        -257.0,
        -259.0,
        0.1, -0.1, 1.0 / 3.0, 2.0 / 3.0, 1e-3, 1000.0,
    ]
    add(ties + list(rng.normal(0.0, 100.0, BLOCK - len(ties))))

    # 18: f16 range limits (F16 overflow -> inf; still finite f32 input)
    #     NOTE: Q4_1/Q5_1 store min = -1e5 as f16 -inf for this block.
    limits = [
        65504.0, -65504.0,
        65519.0,                     # < 65520 -> 65504
        65520.0,                     # f16 tie with "65536" -> +inf
        -65520.0,
        70000.0, -100000.0,
        2.0**-14,                    # f16 min normal
        -(2.0**-14),
        2.0**-14 - 2.0**-24,         # f16 max subnormal
        2.0**-14 - 2.0**-25,         # tie between max subnormal and min normal
        2.0**-24,                    # f16 min subnormal
        2.0**-25,                    # tie -> 0
        3 * 2.0**-25,                # tie -> 2^-23
        2.0**-25 + 2.0**-40,         # just above tie -> 2^-24
        -(2.0**-25),                 # tie -> -0
        1e-10,                       # underflow to 0
        -1e-10,
    ]
    add(limits + list(rng.normal(0.0, 1000.0, BLOCK - len(limits))))

    # 19: f32 min-normal / subnormal inputs mixed with O(1) values (values
    #     far beyond the f16 range are left to F16/BF16.special: they would
    #     make the f16 block scales overflow to inf and dequantize to NaN)
    big = [
        1.0e-38, -1.0e-38,           # near f32 min normal
        float(bits_to_f32(0x00018000)),   # f32 subnormal, bf16 tie -> round up
        float(bits_to_f32(0x00008000)),   # f32 subnormal, bf16 tie -> 0
        float(bits_to_f32(0x00000001)),   # f32 min subnormal
    ]
    add(big + list(rng.normal(0.0, 1.0, BLOCK - len(big))))

    # 20: integers in a wide range
    add(rng.integers(-10000, 10001, BLOCK).astype(np.float32))

    # 21: all values identical except one
    v = np.full(BLOCK, 2.5)
    v[31] = 2.5 + 1e-3
    add(v)

    # 22: one non-zero value in a zero block, positive and negative
    v = np.zeros(BLOCK)
    v[9] = -0.03125
    add(v)
    v = np.zeros(BLOCK)
    v[30] = 123.456
    add(v)

    # 24: a negative zero among zeros
    v = np.zeros(BLOCK)
    v[1] = -0.0
    add(v)

    return blocks


def make_input() -> np.ndarray:
    rng = np.random.default_rng(INPUT_SEED)
    n_blocks = ROWS * COLS // BLOCK
    special = edge_blocks(rng)

    blocks = []
    for i in range(n_blocks - len(special)):
        # ordinary N(mean, s^2) blocks with s log-uniform in [1e-3, 1e3]
        s = 10.0 ** rng.uniform(-3.0, 3.0)
        mean = 0.0 if i % 4 else s * rng.uniform(-2.0, 2.0)
        blocks.append(f32(rng.normal(mean, s, BLOCK)))

    # Put the hand-made blocks at the start of the first rows and spread a
    # few copies across the tensor so every 32-row group sees some of them.
    out = special + blocks
    out[len(special) * 5] = special[0]
    out[n_blocks - 1] = special[9]
    out[n_blocks - 2] = special[18]
    data = np.stack(out).reshape(ROWS, COLS).astype(np.float32)
    assert np.all(np.isfinite(data))
    return data


# --------------------------------------------------------------------------
# Special values for F16 / BF16 (non-finite allowed)
# --------------------------------------------------------------------------

def f16_special() -> np.ndarray:
    vals = [
        0.0, -0.0, np.inf, -np.inf,
        65504.0, -65504.0,               # f16 max / min normal finite
        65519.0, 65520.0, -65520.0,      # below / at overflow tie
        70000.0, -100000.0, 3.0e38,      # overflow -> inf
        2.0**-14, -(2.0**-14),           # f16 min positive normal
        2.0**-14 - 2.0**-24,             # f16 max subnormal
        2.0**-14 - 2.0**-25,             # tie -> min normal (even)
        2.0**-24, -(2.0**-24),           # f16 min subnormal
        2.0**-25, -(2.0**-25),           # tie -> +-0
        3 * 2.0**-25,                    # tie -> 2^-23
        5 * 2.0**-25,                    # tie -> 2^-23 (even), not 3 * 2^-24
        2.0**-25 + 2.0**-48,             # just above tie
        2.0**-26,                        # below half min subnormal -> 0
        1e-45, -1e-45, 1e-40,            # f32 subnormals -> +-0
        1.0, -1.0, 2.0, 0.5,
        1.0 + 2.0**-11,                  # tie -> 1
        1.0 + 3 * 2.0**-11,              # tie -> 1 + 2^-9
        1.0 + 2.0**-11 + 2.0**-23,       # above tie
        -(1.0 + 2.0**-11),
        2049.0, 2051.0, 4097.0, 4098.0, 4099.0, 4101.0,
        32767.0, 32769.0, 32784.0, 32800.0,
        0.1, -0.1, 1.0 / 3.0, 3.14159265,
        1e-3, 1e-5, 6e-8, 5.9e-8,
    ]
    v = f32(vals)
    # quiet NaNs given as bit patterns (signalling NaNs are left out on
    # purpose: their f16 conversion differs between numpy's software path
    # and the F16C instruction)
    nans = bits_to_f32([0x7FC00000, 0xFFC00000])
    v = np.concatenate([v, nans])
    pad = (-len(v)) % 16
    return np.concatenate([v, f32(np.linspace(-2.0, 2.0, pad))]) if pad else v


def bf16_special() -> np.ndarray:
    bits = [
        0x00000000, 0x80000000,          # +-0
        0x7F800000, 0xFF800000,          # +-inf
        0x7FC00000, 0xFFC00000,          # quiet NaNs
        0x7F800001, 0xFF800001,          # signalling NaNs -> quiet
        0x7FA12345, 0x7F80FFFF,          # NaN payloads (upper half kept, bit 6 set)
        0x7F7FFFFF, 0xFF7FFFFF,          # f32 max -> +-inf (rounds over)
        0x7F7F0000,                      # bf16 max finite
        0x7F7F7FFF,                      # just below tie -> bf16 max
        0x7F7F8000,                      # tie, odd -> rounds up to inf
        0x7F7E8000,                      # tie, even -> stays
        0x00800000, 0x80800000,          # f32 min normal
        0x00010000,                      # bf16 min subnormal
        0x007F0000,                      # bf16 max subnormal
        0x007FFFFF,                      # f32 max subnormal -> min normal
        0x00000001, 0x80000001,          # f32 min subnormal -> +-0
        0x00008000,                      # subnormal tie -> 0 (even)
        0x00018000,                      # subnormal tie -> 0x0002 (even)
        0x00007FFF,                      # below tie -> 0
        0x00008001,                      # above tie -> 0x0001
        0x3F800000, 0xBF800000,          # +-1
        0x3F808000,                      # 1 + 2^-8 tie -> 1.0
        0x3F818000,                      # 1 + 3*2^-8 tie -> 1 + 2^-6
        0x3F808001,                      # above tie
        0x3F807FFF,                      # below tie
        0xBF808000, 0xBF818000,          # negative ties
        0x43808000,                      # 257 -> 256
        0x43818000,                      # 259 -> 260
        0x3DCCCCCD,                      # 0.1
        0x3EAAAAAB,                      # 1/3
        0x40490FDB,                      # pi
        0x477FE000,                      # 65504
        0x47800000,                      # 65536
    ]
    v = bits_to_f32(bits)
    pad = (-len(v)) % 16
    return np.concatenate([v, f32(np.linspace(-2.0, 2.0, pad))]) if pad else v


# --------------------------------------------------------------------------
# Random super-blocks for Q4_K / Q5_K / Q6_K
# --------------------------------------------------------------------------

def random_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    mag = 10.0 ** rng.uniform(-4.0, 0.0, n)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    h = (sign * mag).astype(np.float16)
    assert np.all(np.isfinite(h)) and np.all(h != 0)
    return h


def kquant_blocks(qtype: QT) -> np.ndarray:
    rng = np.random.default_rng(KQUANT_SEEDS[qtype])
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n = 64 * 256 // block_size
    raw = rng.integers(0, 256, size=(n, type_size), dtype=np.uint8)
    if qtype == QT.MXFP4:  # e (E8M0 @ 0) qs[16]
        # any exponent whose half scale times 12 stays finite, and the two subnormal ones
        raw[:, 0] = rng.integers(0, 250, size=n, dtype=np.uint8)
        raw[1, 0], raw[2, 0] = 0, 1
        return raw
    d = random_f16(rng, n)
    d[3] = 0.0                       # d == 0
    d[7] = np.float16(2.0**-20)      # f16 subnormal scale
    d[11] = np.float16(1.0)
    d[12] = np.float16(-1.0)
    if qtype in (QT.Q4_K, QT.Q5_K):
        dmin = random_f16(rng, n)
        dmin[5] = 0.0                # dmin == 0
        dmin[9] = 0.0                # both zero
        d[9] = 0.0
        dmin[13] = np.float16(-(2.0**-22))  # negative subnormal min scale
        raw[:, 0:2] = d.astype("<f2").reshape(n, 1).view(np.uint8)
        raw[:, 2:4] = dmin.astype("<f2").reshape(n, 1).view(np.uint8)
        # block 15: all scale / min fields at their maximum 63
        raw[15, 4:16] = 0xFF
    elif qtype == QT.Q2_K:  # scales[16] (scale | min << 4) qs[64] d (f16 @ 80) dmin (f16 @ 82)
        dmin = random_f16(rng, n)
        dmin[5] = 0.0                # dmin == 0
        raw[:, 80:82] = d.astype("<f2").reshape(n, 1).view(np.uint8)
        raw[:, 82:84] = dmin.astype("<f2").reshape(n, 1).view(np.uint8)
        # block 15: every scale and min at 15
        raw[15, 0:16] = 0xFF
    elif qtype == QT.TQ1_0:  # qs[48] qh[4] d (f16 @ 52)
        raw[:, 52:54] = d.astype("<f2").reshape(n, 1).view(np.uint8)
    elif qtype in IQ_D_FIRST:  # d (f16 @ 0), then grid indices, signs and scales
        raw[:, 0:2] = d.astype("<f2").reshape(n, 1).view(np.uint8)
        # block 15: every index, sign and scale bit set; block 16: all clear
        raw[15, 2:] = 0xFF
        raw[16, 2:] = 0x00
    elif qtype == QT.IQ1_M:  # qs[32] qh[16] scales[8]: d in the top nibbles of the four u16 scales
        bits = d.astype("<f2").view(np.uint16)
        for k in range(4):
            nibble = ((bits >> (4 * k)) & 0xF).astype(np.uint8)
            raw[:, 48 + 2 * k + 1] = (raw[:, 48 + 2 * k + 1] & 0x0F) | (nibble << 4)
        # block 15: every index, shift and scale bit set (keeping d); block 16: all clear
        raw[15, 0:48] = 0xFF
        raw[15, 48:56] |= np.array([0xFF, 0x0F] * 4, dtype=np.uint8)
        raw[16, 0:48] = 0x00
        raw[16, 48:56] &= np.array([0x00, 0xF0] * 4, dtype=np.uint8)
    elif qtype == QT.TQ2_0:  # qs[64] d (f16 @ 64)
        raw[:, 64:66] = d.astype("<f2").reshape(n, 1).view(np.uint8)
    elif qtype == QT.IQ4_NL:  # d (f16 @ 0) qs[16]
        raw[:, 0:2] = d.astype("<f2").reshape(n, 1).view(np.uint8)
    elif qtype == QT.IQ4_XS:  # d (f16 @ 0) scales_h (u16 @ 2) scales_l[4] qs[128]
        raw[:, 0:2] = d.astype("<f2").reshape(n, 1).view(np.uint8)
        # block 15: every scale at 63 (+31 once unbiased); block 16: every scale at 0 (-32)
        raw[15, 2:8] = 0xFF
        raw[16, 2:8] = 0x00
    elif qtype == QT.Q3_K:  # hmask[32] qs[64] scales[12] (6-bit, packed) d (f16 @ 108)
        raw[:, 108:110] = d.astype("<f2").reshape(n, 1).view(np.uint8)
        # block 15: every scale at 63 (+31 once unbiased); block 16: every scale at 0 (-32)
        raw[15, 96:108] = 0xFF
        raw[16, 96:108] = 0x00
    else:  # Q6_K: ql[128] qh[64] scales[16] (int8) d (f16 @ 208)
        raw[:, 208:210] = d.astype("<f2").reshape(n, 1).view(np.uint8)
        # block 15: extreme int8 scales
        raw[15, 192:208] = np.array([-128, 127] * 8, dtype=np.int8).view(np.uint8)
    return raw


# --------------------------------------------------------------------------

def quant_bytes(x: np.ndarray, qtype: QT) -> bytes:
    # overflow to +-inf in the f32 -> f16 casts is expected (and wanted) for
    # the out-of-range inputs; keep numpy from warning about it
    with np.errstate(over="ignore"):
        q = gguf.quants.quantize(x, qtype)
    if qtype == QT.F16:
        assert q.dtype == np.float16
        return q.astype("<f2").tobytes()
    assert q.dtype == np.uint8
    return q.tobytes()


def dequant(qbytes: bytes, qtype: QT, rows: int) -> np.ndarray:
    q = np.frombuffer(qbytes, dtype=np.uint8).reshape(rows, -1)
    out = gguf.quants.dequantize(q, qtype)
    assert out.dtype == np.float32
    return np.ascontiguousarray(out)


def write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    print(f"wrote {path.relative_to(REPO_ROOT)} ({len(data)} bytes)", file=sys.stderr)


def main() -> int:
    if sys.byteorder != "little":
        print("this script assumes a little-endian host", file=sys.stderr)
        return 1
    OUT_DIR.mkdir(parents=True, exist_ok=True)

    x = make_input()
    assert x.shape == (ROWS, COLS) and x.dtype == np.float32
    xin = x.astype(F32_LE).tobytes()

    for qtype in QUANTIZABLE:
        name = qtype.name
        qb = quant_bytes(x, qtype)
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        assert len(qb) == ROWS * COLS // block_size * type_size
        deq = dequant(qb, qtype, ROWS)
        assert deq.shape == (ROWS, COLS)
        write(OUT_DIR / f"{name}.input.f32", xin)
        write(OUT_DIR / f"{name}.quant.bin", qb)
        write(OUT_DIR / f"{name}.dequant.f32", deq.astype(F32_LE).tobytes())

    for qtype, special in ((QT.F16, f16_special()), (QT.BF16, bf16_special())):
        name = qtype.name
        qb = quant_bytes(special, qtype)
        assert len(qb) == 2 * special.size
        deq = dequant(qb, qtype, 1).reshape(-1)
        write(OUT_DIR / f"{name}.special.input.f32", special.astype(F32_LE).tobytes())
        write(OUT_DIR / f"{name}.special.quant.bin", qb)
        write(OUT_DIR / f"{name}.special.dequant.f32", deq.astype(F32_LE).tobytes())

    for qtype in DEQUANT_ONLY:
        name = qtype.name
        raw = kquant_blocks(qtype)
        deq = dequant(raw.tobytes(), qtype, raw.shape[0])
        deq = deq.reshape(64, 256)
        assert np.all(np.isfinite(deq))
        write(OUT_DIR / f"{name}.blocks.bin", raw.tobytes())
        write(OUT_DIR / f"{name}.dequant.f32", deq.astype(F32_LE).tobytes())

    print(f"gguf {metadata.version('gguf')}, numpy {np.__version__}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
