"""Device-side code decoders shared by the scores and decode-attention kernels: packed code -> fp16 centroid.

A kernel picks one with the ``DECODE`` constexpr (host option ``decoder``):

``"table"``   ``c[idx]`` gathered from the 2^b-entry fp16 table in global memory (L1-resident): one load per code.
``"select"``  a register codebook, portable (runs in the interpreter): the Lloyd-Max codebook is symmetric,
              ``c[2^b - 1 - i] = -c[i]`` (Eq. 4 for a symmetric density), so with ``h = 2^(b-1)`` and the
              magnitudes ``m_j = c[h + j]`` (j < h, increasing),

                  c[i] = m_{i - h}              for i >= h  (sign bit set),
                  c[i] = -m_{(h - 1) - i}       for i < h,

              i.e. sign bit + (b-1)-bit magnitude index. The h magnitudes are loaded once as scalars and picked by
              a branch-free select tree on the index bits (h - 1 selects); no memory access per code.
``"prmt"``    the same register codebook for 4-bit codes as inline PTX (GPU only, :func:`nibble_pair_values`):
              per 32-bit word of 8 codes, 4 ops for the magnitude indices, 4 byte permutes (``prmt``) looking up
              the low / high bytes of the 8 fp16 magnitudes held in 4 registers, 4 ``prmt`` that interleave them
              into fp16 pairs and 8 ops that set the sign bits: ~2.5 instructions per code. Other widths use
              ``"table"`` (cheaper than ``"select"`` by instruction count: ``benchmarks/NOTES.md``, Session 5).
``"none"``    the raw code as fp16 (wrong values; the benchmark's attribution of time to the lookup).

The register decoders need the symmetric codebook (``check_symmetric``); every Lloyd-Max codebook of the library
is symmetric to the last bit (``lloyd_max_codebook``).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

DECODERS = ("table", "select", "prmt")


def check_decoder(decoder: str, symmetric: Callable[[], bool]) -> None:
    """ValueError unless ``decoder`` is one of :data:`DECODERS` and, for a register decoder, ``symmetric()`` says
    the codebooks are sorted and symmetric (:func:`turboquant.codebook.symmetric_codebook`; only asked then, since
    it may read the codebook back from the device)."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    if decoder != "table" and not symmetric():
        raise ValueError(f"decoder {decoder!r} needs sorted symmetric codebooks (c[2^b-1-i] = -c[i], the Lloyd-Max "
                         "codebook); this one is not: use decoder='table'")


@triton.jit
def _select2(bit, table_ptr, i: tl.constexpr):
    """``table[i + 1]`` where ``bit`` else ``table[i]`` (two scalar loads, one select per element)."""
    return tl.where(bit, tl.load(table_ptr + i + 1), tl.load(table_ptr + i))


@triton.jit
def _magnitudes(j, table_ptr, BITS: tl.constexpr):
    """``table[h + j]`` for magnitude indices ``j < h = 2^(BITS-1)`` by a select tree on the bits of j."""
    HALF: tl.constexpr = 1 << (BITS - 1)
    base = table_ptr + HALF
    if BITS == 1:
        mag = tl.zeros(j.shape, dtype=tl.float16) + tl.load(base)
    else:
        bit0 = (j & 1) != 0
        if BITS == 2:
            mag = _select2(bit0, base, 0)
        else:
            bit1 = (j & 2) != 0
            low = tl.where(bit1, _select2(bit0, base, 2), _select2(bit0, base, 0))
            if BITS == 3:
                mag = low
            else:
                high = tl.where(bit1, _select2(bit0, base, 6), _select2(bit0, base, 4))
                mag = tl.where((j & 4) != 0, high, low)
    return mag


@triton.jit
def register_values(codes, table_ptr, BITS: tl.constexpr):
    """fp16 ``c[codes]`` of a symmetric codebook without a gather (module docstring, ``"select"``); any shape."""
    HALF: tl.constexpr = 1 << (BITS - 1)
    positive = codes >= HALF
    mag = _magnitudes(tl.where(positive, codes - HALF, (HALF - 1) - codes), table_ptr, BITS)
    return tl.where(positive, mag, -mag)


@triton.jit
def code_values(words, shift, table_ptr, BITS: tl.constexpr, DECODE: tl.constexpr):
    """fp16 centroid values of the ``BITS``-bit codes at bit ``shift`` of int32 ``words`` (any shape)."""
    codes = (words >> shift) & ((1 << BITS) - 1)
    if DECODE == "table" or DECODE == "prmt":  # prmt covers 4-bit byte pairs only (nibble_pair_values)
        values = tl.load(table_ptr + codes)
    elif DECODE == "none":
        values = codes.to(tl.float16)
    else:
        values = register_values(codes, table_ptr, BITS)
    return values


@triton.jit
def _byte_tables(table_ptr):
    """The 8 fp16 magnitudes ``table[8 + j]`` of a 4-bit codebook as 4 int32 byte tables: low bytes of m_0..m_3,
    of m_4..m_7, high bytes of m_0..m_3, of m_4..m_7 (``prmt`` indexes 8 bytes of two registers)."""
    lo0 = tl.zeros((), dtype=tl.int32)
    lo1 = tl.zeros((), dtype=tl.int32)
    hi0 = tl.zeros((), dtype=tl.int32)
    hi1 = tl.zeros((), dtype=tl.int32)
    for j in tl.static_range(8):
        bits = tl.load(table_ptr + 8 + j).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        if j < 4:
            lo0 = lo0 | ((bits & 255) << (8 * j))
            hi0 = hi0 | ((bits >> 8) << (8 * j))
        else:
            lo1 = lo1 | ((bits & 255) << (8 * (j - 4)))
            hi1 = hi1 | ((bits >> 8) << (8 * (j - 4)))
    return lo0, lo1, hi0, hi1


# One invocation: 4 code bytes in $4 (byte k: even code in the low nibble, odd code in the high nibble) -> even
# values of bytes 0-3 as fp16 pairs in $0, $1, odd values in $2, $3. $5/$9/$13/$17: the byte tables of
# _byte_tables (each input is passed 4 times, once per packed element). Magnitude index per nibble:
# j = (n & 7) ^ (7 if the sign bit n & 8 is clear). Sign bits: byte 1 / 3 of s = bytes 0 / 1 (2 / 3) of the codes
# puts the odd codes' sign bits at bits 15 / 31, and s << 4 the even codes'.
_PRMT_DECODE4 = tl.constexpr("""
{
.reg .b32 t, j, lo, hi, s, e0, e1, o0, o1;
not.b32 t, $4;
shr.u32 t, t, 3;
and.b32 t, t, 0x11111111;
mul.lo.u32 t, t, 7;
and.b32 j, $4, 0x77777777;
xor.b32 j, j, t;
prmt.b32 lo, $5, $9, j;
prmt.b32 hi, $13, $17, j;
prmt.b32 e0, lo, hi, 0x6240;
prmt.b32 o0, lo, hi, 0x7351;
shr.u32 j, j, 16;
prmt.b32 lo, $5, $9, j;
prmt.b32 hi, $13, $17, j;
prmt.b32 e1, lo, hi, 0x6240;
prmt.b32 o1, lo, hi, 0x7351;
prmt.b32 s, $4, 0, 0x1404;
not.b32 t, s;
and.b32 t, t, 0x80008000;
or.b32 o0, o0, t;
shl.b32 t, s, 4;
not.b32 t, t;
and.b32 t, t, 0x80008000;
or.b32 e0, e0, t;
prmt.b32 s, $4, 0, 0x3424;
not.b32 t, s;
and.b32 t, t, 0x80008000;
or.b32 o1, o1, t;
shl.b32 t, s, 4;
not.b32 t, t;
and.b32 t, t, 0x80008000;
or.b32 e1, e1, t;
mov.b32 $0, e0;
mov.b32 $1, e1;
mov.b32 $2, o0;
mov.b32 $3, o1;
}
""")
_PRMT_CONSTRAINTS = tl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 17))  # 4 outputs, 1 + 4 x 4 inputs


@triton.jit
def nibble_pair_values(words, table_ptr, DECODE: tl.constexpr):
    """(even, odd) fp16 values of the low / high 4-bit code of each byte ``words & 255`` (int32, any shape): the
    two codes of a 4-bit group. ``DECODE="prmt"`` runs :data:`_PRMT_DECODE4` (GPU only); others
    :func:`code_values`."""
    if DECODE == "prmt":
        lo0, lo1, hi0, hi1 = _byte_tables(table_ptr)
        even, odd = tl.inline_asm_elementwise(
            _PRMT_DECODE4, _PRMT_CONSTRAINTS,
            [words.to(tl.uint8), lo0, lo1, hi0, hi1], dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    else:
        even = code_values(words, 0, table_ptr, 4, DECODE)
        odd = code_values(words, 4, table_ptr, 4, DECODE)
    return even, odd
