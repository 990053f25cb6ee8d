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
``"prmt"``    register codebooks as inline PTX (GPU only), looked up with byte permutes: ``prmt d, a, b, s``
              picks for each byte of d one of the 8 bytes of (a, b) by a 4-bit selector of s, so one ``prmt``
              looks up 4 codes in an 8-entry byte table held in two registers.
              4-bit codes (:func:`nibble_pair_values`): 16 values do not fit one 8-entry table, so the symmetric
              codebook's 8 magnitudes are looked up (sign bit + 3-bit magnitude index, as ``"select"``): per
              32-bit word of 8 codes, 3 ops for the magnitude indices (one an integer multiply), 4 ``prmt`` for
              the low / high bytes of the fp16 magnitudes, 4 ``prmt`` that interleave them into fp16 pairs and 8
              ops that set the sign bits.
              3-bit codes (:func:`three_bit_group_values`): the 8 signed centroids are the table itself, looked up
              by the codes spread from 3-bit to 4-bit fields (7 mask / multiply-add ops per 24-bit group word),
              then 8 ``prmt`` per 8 codes; no sign ops. ~2.5 instructions per code at either width. Other widths
              use ``"table"`` (cheaper than ``"select"`` by instruction count: ``benchmarks/NOTES.md``, Session 5).
``"none"``    the raw code as fp16 (wrong values; the benchmark's attribution of time to the lookup).

The register decoders need the symmetric codebook (``check_symmetric``); every Lloyd-Max codebook of the library
is symmetric to the last bit (``lloyd_max_codebook``).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from ..codebook import host_codebook

DECODERS = ("auto", "table", "select", "prmt")

# The fewest tokens of a tile that :func:`channel_order_tile` is used in: a 16-token tile decoded in channel order
# gave wrong attention outputs on the GPU with every decoder (benchmarks/NOTES.md, Session 10); smaller tiles
# decode 3-bit codes per code position instead.
CHANNEL_ORDER_MIN_TOKENS = tl.constexpr(64)


def resolve_decoder(decoder: str, device: torch.device, symmetric: Callable[[], bool]) -> str:
    """The decoder a kernel compiles: ``"auto"`` is ``"prmt"`` on CUDA when the codebooks are symmetric (the fastest
    measured, ``benchmarks/NOTES.md``), else ``"table"`` (the interpreter cannot run PTX). An explicit decoder is
    returned as given; ValueError unless it is one of :data:`DECODERS` and, for a register decoder, ``symmetric()``
    says the codebooks are sorted and symmetric (:func:`turboquant.codebook.symmetric_codebook`; only asked then,
    since it may read the codebook back from the device)."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    if decoder == "auto":
        return "prmt" if device.type == "cuda" and symmetric() else "table"
    if decoder != "table" and not symmetric():
        raise ValueError(f"decoder {decoder!r} needs sorted symmetric codebooks (c[2^b-1-i] = -c[i], the Lloyd-Max "
                         "codebook); this one is not: use decoder='table'")
    return decoder


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
    if DECODE == "table" or DECODE == "prmt":  # prmt: whole groups only (nibble_pair_values, three_bit_group_values)
        values = tl.load(table_ptr + codes)
    elif DECODE == "none":
        values = codes.to(tl.float16)
    else:
        values = register_values(codes, table_ptr, BITS)
    return values


@triton.jit
def _byte_tables(table_ptr):
    """The 8 fp16 values ``table[0..7]`` as 4 int32 byte tables: low bytes of t_0..t_3, of t_4..t_7, high bytes
    of t_0..t_3, of t_4..t_7 (``prmt`` indexes the 8 bytes of two registers). For a 4-bit codebook the caller
    passes ``table + 8`` (its magnitudes), for a 3-bit one the table."""
    lo0 = tl.zeros((), dtype=tl.int32)
    lo1 = tl.zeros((), dtype=tl.int32)
    hi0 = tl.zeros((), dtype=tl.int32)
    hi1 = tl.zeros((), dtype=tl.int32)
    for j in tl.static_range(8):
        bits = tl.load(table_ptr + j).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        if j < 4:
            lo0 = lo0 | ((bits & 255) << (8 * j))
            hi0 = hi0 | ((bits >> 8) << (8 * j))
        else:
            lo1 = lo1 | ((bits & 255) << (8 * (j - 4)))
            hi1 = hi1 | ((bits >> 8) << (8 * (j - 4)))
    return lo0, lo1, hi0, hi1


def _magnitude_index_lines(src: str, dst: str) -> list[str]:
    """PTX lines writing to ``dst`` the magnitude index of each 4-bit code i of ``src`` (8 nibbles): j = i - 8 for
    i >= 8, 7 - i below (the symmetric codebook's ``c[i] = +-m_j``, module docstring), bit 3 of every nibble clear
    (``prmt``'s default mode). With b the code's top bit, j = (i ^ 7 ^ 7b) & 7, and 7b in every nibble is the high word
    of ``(src & 0x88888888) * 7 * 2^29``: an integer multiply, which runs beside the logic ops rather than among
    them. Uses the scratch register ``s``."""
    return [f"and.b32 s, {src}, 0x88888888;", "mul.hi.u32 s, s, 0xE0000000;", f"xor.b32 {dst}, {src}, s;",
            f"not.b32 {dst}, {dst};", f"and.b32 {dst}, {dst}, 0x77777777;"]


def _nibble_pair_lines(src: str, outs: list[str]) -> list[str]:
    """PTX lines decoding the 4-bit codes of the 32-bit register ``src`` (code n at bits 4n..4n+3) to fp16 values of
    a symmetric codebook, codes n and n + 4 as one fp16 pair written to ``outs[n]`` (n < len(outs): 4 for all 8
    codes, 2 for codes 0, 1, 4, 5 alone). As :data:`_PRMT_DECODE4` (sign bit + 3-bit magnitude index, the magnitudes
    looked up in the byte tables ``$T0..$T3``), but the sign bits of a pair sit 16 bits apart in ``src`` (bits
    4n + 3 and 4n + 19), so one shift and one ``lop3`` set both (sign set where the code's top bit is clear). Per 8
    codes: 3 ops for the magnitude indices (:func:`_magnitude_index_lines`), 2 ``prmt`` that gather the selector
    nibbles, 4 + 4 ``prmt`` for the table bytes and their interleaving, 7 for the signs."""
    lines = _magnitude_index_lines(src, "j")
    for half, selector in ((0, "0x4420"), (1, "0x4431"))[:len(outs) // 2]:  # bytes 0, 2 / 1, 3 of j: codes
        lines += [f"prmt.b32 sel, j, 0, {selector};", "prmt.b32 lo, $T0, $T1, sel;",  # (0, 1, 4, 5) / (2, 3, 6, 7)
                  "prmt.b32 hi, $T2, $T3, sel;"]
        for odd, interleave in ((0, "0x6240"), (1, "0x7351")):
            n = 2 * half + odd
            shift = 12 - 4 * n
            lines += [f"prmt.b32 r, lo, hi, {interleave};",
                      f"shl.b32 t, {src}, {shift};" if shift else f"mov.b32 t, {src};",
                      "not.b32 t, t;", "and.b32 t, t, 0x80008000;", f"or.b32 {outs[n]}, r, t;"]
    return lines


def _with_tables(lines: list[str], tables: tuple[str, str, str, str]) -> list[str]:
    """``lines`` with the byte-table placeholders ``$T0..$T3`` replaced by the operands ``tables``."""
    for i, table in enumerate(tables):
        lines = [line.replace(f"$T{i}", table) for line in lines]
    return lines


def _decode4_lines() -> list[str]:
    """Lines of :data:`_PRMT_DECODE4`: the magnitude indices of the 8 codes, two lookups of 4 codes each (codes of
    bytes 0-1, then 2-3: even values to $0 / $1, odd to $2 / $3), and the sign bits, set where a code's top bit is
    clear: ``prmt`` copies code bytes 0, 1 (2, 3) to bytes 1, 3 of ``s``, which puts the odd codes' sign bits at bits
    15 / 31 and, shifted by 4, the even codes'."""
    halves = (("e0", "o0", "0x1404"), ("e1", "o1", "0x3424"))
    lines = _magnitude_index_lines("$4", "j")
    for half, (even, odd, _) in enumerate(halves):
        lines += (["shr.u32 j, j, 16;"] if half else []) + [
            "prmt.b32 lo, $5, $9, j;", "prmt.b32 hi, $13, $17, j;",
            f"prmt.b32 {even}, lo, hi, 0x6240;", f"prmt.b32 {odd}, lo, hi, 0x7351;"]
    for even, odd, signs in halves:
        lines += [f"prmt.b32 s, $4, 0, {signs};", "not.b32 t, s;", "and.b32 t, t, 0x80008000;",
                  f"or.b32 {odd}, {odd}, t;", "shl.b32 t, s, 4;", "not.b32 t, t;", "and.b32 t, t, 0x80008000;",
                  f"or.b32 {even}, {even}, t;"]
    return lines + ["mov.b32 $0, e0;", "mov.b32 $1, e1;", "mov.b32 $2, o0;", "mov.b32 $3, o1;"]


# One invocation: 4 code bytes in $4 (byte k: even code in the low nibble, odd code in the high nibble) -> even
# values of bytes 0-3 as fp16 pairs in $0, $1, odd values in $2, $3. $5/$9/$13/$17: the byte tables of
# _byte_tables (each input is passed 4 times, once per packed element).
_PRMT_DECODE4 = tl.constexpr("{\n.reg .b32 t, j, lo, hi, s, e0, e1, o0, o1;\n" + "\n".join(_decode4_lines())
                             + "\n}")
_PRMT_CONSTRAINTS = tl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 17))  # 4 outputs, 1 + 4 x 4 inputs


@triton.jit
def nibble_pair_values(words, table_ptr, DECODE: tl.constexpr):
    """(even, odd) fp16 values of the low / high 4-bit code of each byte ``words & 255`` (int32, any shape): the
    two codes of a 4-bit group. ``DECODE="prmt"`` runs :data:`_PRMT_DECODE4` (GPU only); others
    :func:`code_values`."""
    if DECODE == "prmt":
        lo0, lo1, hi0, hi1 = _byte_tables(table_ptr + 8)
        even, odd = tl.inline_asm_elementwise(
            _PRMT_DECODE4, _PRMT_CONSTRAINTS,
            [words.to(tl.uint8), lo0, lo1, hi0, hi1], dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    else:
        even = code_values(words, 0, table_ptr, 4, DECODE)
        odd = code_values(words, 4, table_ptr, 4, DECODE)
    return even, odd


def _spread3_lines(src: str, dst: str) -> list[str]:
    """PTX lines moving the 8 3-bit codes of the 24-bit group word ``src`` (code k at bit 3k; the bits above 24 may
    hold anything) to nibbles of ``dst`` (code k at bits 4k..4k+2, bit 3 clear): the two 12-bit halves moved apart,
    then :func:`_spread_halves_lines`. Uses the scratch register ``t``."""
    return ([f"and.b32 t, {src}, 0xFFF000;", f"and.b32 {dst}, {src}, 0xFFF;", f"mad.lo.u32 {dst}, t, 16, {dst};"]
            + _spread_halves_lines(dst))


def _spread_halves_lines(x: str) -> list[str]:
    """PTX lines spreading the 4 3-bit codes of each 12-bit field at bits 0 and 16 of ``x`` (nothing else set) to
    nibbles, in place: 6-bit fields, then 3-bit fields moved apart. A field f of x moved up by s bits is
    ``x + f * (2^s - 1)`` when nothing else is set where it lands, so each step is one mask and one integer
    multiply-add (or add), not a mask, a shift and a merge. Uses the scratch register ``t``."""
    return [f"and.b32 t, {x}, 0x0FC00FC0;", f"mad.lo.u32 {x}, t, 3, {x};",
            f"and.b32 t, {x}, 0x38383838;", f"add.u32 {x}, {x}, t;"]


def _shr_line(x: str, n: int, multiply: bool) -> str:
    """The PTX line ``t = x >> n``: ``shr`` (the ALU pipe), or with ``multiply`` the high word of ``x * 2^(32 - n)``
    (``IMAD``, the FMA pipe, which runs beside the logic ops rather than among them)."""
    return f"mul.hi.u32 t, {x}, {1 << (32 - n)};" if multiply else f"shr.u32 t, {x}, {n};"


def _nibble_interleave_lines(a: str, b: str, even: str, odd: str, multiply: bool) -> list[str]:
    """PTX lines interleaving the nibbles of ``a`` and ``b``: byte k of ``even`` is a_2k | b_2k << 4, of ``odd``
    a_2k+1 | b_2k+1 << 4 (one mask-merge each after a shift; the shifts as :func:`_shr_line`). Uses the scratch
    register ``t``."""
    shl = f"mul.lo.u32 t, {b}, 16;" if multiply else f"shl.b32 t, {b}, 4;"
    return [shl, f"and.b32 {even}, {a}, 0x0F0F0F0F;", "and.b32 t, t, 0xF0F0F0F0;", f"or.b32 {even}, {even}, t;",
            _shr_line(a, 4, multiply), f"and.b32 {odd}, t, 0x0F0F0F0F;", f"and.b32 t, {b}, 0xF0F0F0F0;",
            f"or.b32 {odd}, {odd}, t;"]


def _mixed_three_bit_lines(x: str, even: str, odd: str) -> list[str]:
    """PTX lines taking the 3-bit halves of two mixed slots $8 and $9 (bits 16-27) into ``x`` (A's 12 bits at bit 0,
    B's at bit 16, the bits above masked away), spreading them to nibbles (a0 a1 a2 a3 b0 b1 b2 b3) and interleaving
    them into bytes: ``even`` holds a0 | b0 << 4 and a2 | b2 << 4, ``odd`` a1 | b1 << 4 and a3 | b3 << 4. Uses the
    scratch register ``t``."""
    return ["prmt.b32 {}, $8, $9, 0x7632;".format(x), f"and.b32 {x}, {x}, 0x0FFF0FFF;", *_spread_halves_lines(x),
            f"shr.u32 t, {x}, 12;", "and.b32 t, t, 0xF0F0;", f"and.b32 {even}, {x}, 0x0F0F;",
            f"or.b32 {even}, {even}, t;", f"shr.u32 t, {x}, 4;", f"and.b32 {odd}, t, 0x0F0F;",
            f"shr.u32 t, {x}, 16;", "and.b32 t, t, 0xF0F0;", f"or.b32 {odd}, {odd}, t;"]


def _selector_lookup_lines(selector: str, first: str, second: str, tables: tuple[str, ...]) -> list[str]:
    """Lines that look up the 4 nibbles of ``selector`` (x0 y0 x1 y1: code k of two words X and Y, twice) in the
    8-entry byte tables ``tables`` (low bytes of entries 0-3, of 4-7, high bytes of each) and write the fp16 pairs
    (x0, y0) to ``first`` and (x1, y1) to ``second``."""
    lo0, lo1, hi0, hi1 = tables
    return [f"prmt.b32 lo, {lo0}, {lo1}, {selector};", f"prmt.b32 hi, {hi0}, {hi1}, {selector};",
            f"prmt.b32 {first}, lo, hi, 0x5140;", f"prmt.b32 {second}, lo, hi, 0x7362;"]


# One invocation: the 24-bit word of a 3-bit group in $8 (code k at bits 3k..3k+2) -> the fp16 values of its 8 codes
# in $0..$7 (16-bit registers). $9/$10/$11/$12: the byte tables of _byte_tables(table). The codes are spread to
# nibbles (_spread3_lines) so that one prmt selector holds 4 codes, looked up 4 at a time (_selector_lookup_lines)
# and unpacked into the outputs.
_PRMT_DECODE3 = tl.constexpr("{\n.reg .b32 n, t, lo, hi, v, w;\n" + "\n".join(
    _spread3_lines("$8", "n") + _selector_lookup_lines("n", "v", "w", ("$9", "$10", "$11", "$12"))
    + ["mov.b32 {$0, $1}, v;", "mov.b32 {$2, $3}, w;", "shr.u32 n, n, 16;"]
    + _selector_lookup_lines("n", "v", "w", ("$9", "$10", "$11", "$12"))
    + ["mov.b32 {$4, $5}, v;", "mov.b32 {$6, $7}, w;"]) + "\n}")
_PRMT3_CONSTRAINTS = tl.constexpr(",".join(["=h"] * 8 + ["r"] * 5))  # 8 fp16 outputs, the word + 4 tables


@triton.jit
def three_bit_group_values(words, table_ptr, DECODE: tl.constexpr):
    """The fp16 values of the 8 codes of each 3-bit group word ``words`` (int32, any shape; code k at bit 3k), as a
    tuple of 8 tensors of that shape (code position k). ``DECODE="prmt"`` runs :data:`_PRMT_DECODE3` (GPU only);
    others :func:`code_values` per position."""
    if DECODE == "prmt":
        lo0, lo1, hi0, hi1 = _byte_tables(table_ptr)
        values = tl.inline_asm_elementwise(
            _PRMT_DECODE3, _PRMT3_CONSTRAINTS, [words, lo0, lo1, hi0, hi1],
            dtype=(tl.float16,) * 8, is_pure=True, pack=1)
    else:
        values = (code_values(words, 0, table_ptr, 3, DECODE), code_values(words, 3, table_ptr, 3, DECODE),
                  code_values(words, 6, table_ptr, 3, DECODE), code_values(words, 9, table_ptr, 3, DECODE),
                  code_values(words, 12, table_ptr, 3, DECODE), code_values(words, 15, table_ptr, 3, DECODE),
                  code_values(words, 18, table_ptr, 3, DECODE), code_values(words, 21, table_ptr, 3, DECODE))
    return values


def prmt_byte_tables(table: torch.Tensor) -> tuple[int, int, int, int]:
    """The byte tables the register decoders look up, as the host hands them to a kernel: for a symmetric 4-bit
    codebook its 8 magnitudes (the upper 8 fp16 values; what :func:`_byte_tables` builds on the device from
    ``table + 8``), for a 3-bit one its 8 signed values (``_byte_tables(table)``): low bytes of entries 0..3, of
    4..7, high bytes of each, packed little-endian into int32 values. Reads the table through
    :func:`~turboquant.codebook.host_codebook` (once per tensor)."""
    values = host_codebook(table)
    if values.numel() not in (8, 16):
        raise ValueError(f"the register decoders read 3- or 4-bit codebooks, got {values.numel()} entries")
    bits = values.view(torch.int16).to(torch.int64)[-8:] & 0xFFFF
    packed = [sum(int(b) << (8 * i) for i, b in enumerate(part)) for part in
              (bits[:4] & 255, bits[4:] & 255, bits[:4] >> 8, bits[4:] >> 8)]
    return tuple(v - (1 << 32) if v >= 1 << 31 else v for v in packed)


# One invocation (``pack=2``): two words A ($8) and B ($9) of 8 4-bit codes -> $c = the fp16 pair (code c of A,
# code c of B), c = 0..7; $10, $12, $14, $16: the magnitude byte tables (_byte_tables(table + 8); each scalar is
# passed once per packed element). The low (high) halves of the two words are joined first, one prmt each, so that
# codes c of A and of B are codes n and n + 4 of one register for the decoder above. A register MMA operand wants
# exactly such pairs: the same token's channels (keys, A and B two words of a row) or the same channel of two tokens
# (values, A and B the rows of tokens 2p and 2p + 1).
PRMT_PAIR4 = tl.constexpr("{\n.reg .b32 s, j, sel, lo, hi, r, t, x;\n" + "\n".join(_with_tables(
    ["prmt.b32 x, $8, $9, 0x5410;", *_nibble_pair_lines("x", ["$0", "$1", "$2", "$3"]),
     "prmt.b32 x, $8, $9, 0x7632;", *_nibble_pair_lines("x", ["$4", "$5", "$6", "$7"])],
    ("$10", "$12", "$14", "$16"))) + "\n}")
PRMT_PAIR4_CONSTRAINTS = tl.constexpr(",".join(["=r"] * 8 + ["r"] * 10))


PAIR_LUT_SYMBOL = "tq_pair_lut"
PAIR_LUT_ENTRIES = 256  # one per byte of two 4-bit codes
PAIR_LUT_COPIES = 16  # copies of the table in shared memory; lanes l and l + 16 share copy l mod 16
PAIR_LUT_BYTES = PAIR_LUT_ENTRIES * PAIR_LUT_COPIES * 4  # int32 entries: 16 KB of shared memory
_ENTRY_SHIFT = (4 * PAIR_LUT_COPIES).bit_length() - 1  # byte offset of entry e, copy c: (e << _ENTRY_SHIFT) + 4 c


def pair_lut_table(table: torch.Tensor) -> torch.Tensor:
    """int32 (256,) on ``table``'s device: entry ``e`` is the fp16 pair (c[e & 15], c[e >> 4]) of the 16-entry
    codebook ``table`` (low half the low nibble's value), what :data:`PAIR_LUT_FILL` copies to shared memory and
    :data:`PAIR_LUT4` looks up. Reads the codebook through :func:`~turboquant.codebook.host_codebook`."""
    values = host_codebook(table)
    if values.numel() != 16:
        raise ValueError(f"the pair table decodes 4-bit codebooks (16 entries), got {values.numel()}")
    bits = values.view(torch.int16).to(torch.int64) & 0xFFFF
    entries = torch.arange(PAIR_LUT_ENTRIES)
    pairs = bits[entries & 15] | bits[entries >> 4] << 16
    return torch.where(pairs >= 1 << 31, pairs - (1 << 32), pairs).to(torch.int32).to(table.device)


def _pair_lut_fill_lines() -> list[str]:
    """Lines of :data:`PAIR_LUT_FILL`. Lane l holds the entries 8 l + i (its inputs $8..$15) and writes each to all
    :data:`PAIR_LUT_COPIES` copies (word ``copies * e + c`` of the table), 4 copies per 16-byte store, the lanes
    rotating over the groups of 4 so that one store instruction spreads over the banks; then ``bar.warp.sync``
    (which orders the writes before any lane's lookups). The inputs are copied to the outputs, so that the statement
    has some."""
    groups, entry_bytes = PAIR_LUT_COPIES // 4, 4 * PAIR_LUT_COPIES
    lines = ["mov.u32 l, %laneid;", f"mov.u32 row, {PAIR_LUT_SYMBOL};", f"mad.lo.u32 row, l, {8 * entry_bytes}, row;"]
    for j in range(groups):
        lines += [f"add.u32 r, l, {j};", f"and.b32 r, r, {groups - 1};", "mad.lo.u32 r, r, 16, row;"]
        lines += [f"st.shared.v4.b32 [r+{entry_bytes * i}], {{${8 + i}, ${8 + i}, ${8 + i}, ${8 + i}}};"
                  for i in range(8)]
    return lines + ["bar.warp.sync -1;"] + [f"mov.b32 ${i}, ${8 + i};" for i in range(8)]


# One invocation per lane (``pack=8``, the lane's 8 entries of pair_lut_table in $8..$15, copied to $0..$7 so that the
# statement has outputs): declares the table in shared memory (a function-scope ``.shared`` array: only this program
# may declare it, once per kernel) and fills it. Lane l reads copy c = l mod 16 of entry e, word 16 e + c, in bank
# c + 16 (e mod 2): two lanes of one load share a bank only as the pair (l, l + 16), so a load takes at most two
# shared-memory wavefronts, whatever codes the lanes hold.
PAIR_LUT_FILL = tl.constexpr(f".shared .align 16 .b8 {PAIR_LUT_SYMBOL}[{PAIR_LUT_BYTES}];\n"
                             + "{\n.reg .b32 l, row, r;\n" + "\n".join(_pair_lut_fill_lines()) + "\n}")
PAIR_LUT_FILL_CONSTRAINTS = tl.constexpr(",".join(["=r"] * 8 + ["r"] * 8))


def _byte_lookup_lines(source: str, k: int) -> list[str]:
    """PTX lines loading the entry of byte k of ``source`` (byte offset ``(byte << _ENTRY_SHIFT) + l``, ``l`` this
    lane's copy) into ``a``: the byte moved to bit _ENTRY_SHIFT, x << s or x >> (8k - s) as the high word of
    x * 2^(32 + s - 8k), an integer multiply (which runs beside the logic ops rather than among them), then one
    mask-merge and the load."""
    shift = (f"mul.lo.u32 a, {source}, {1 << _ENTRY_SHIFT};" if k == 0
             else f"mul.hi.u32 a, {source}, {1 << (32 + _ENTRY_SHIFT - 8 * k)};")
    return [shift, f"and.b32 a, a, {255 << _ENTRY_SHIFT};", "or.b32 a, a, l;", "add.u32 a, a, base;"]


def _pair_lut_lines() -> list[str]:
    """Lines of :data:`PAIR_LUT4`. The nibbles of the words A ($8) and B ($9) are interleaved into bytes (x_e, x_o:
    :func:`_nibble_interleave_lines`), then each byte addresses one ``ld.shared`` of this lane's copy
    (:func:`_byte_lookup_lines`) and writes output 2k (x_e) or 2k + 1 (x_o): per 16 codes 2 + 8 logic ops, 2 + 8
    shifts written as integer multiplies (``IMAD``, the FMA pipe) and 8 loads, no sign or interleave step (the
    entries hold signed fp16 pairs)."""
    lines = (["mov.u32 l, %laneid;", f"and.b32 l, l, {PAIR_LUT_COPIES - 1};", "shl.b32 l, l, 2;",
              f"mov.u32 base, {PAIR_LUT_SYMBOL};"] + _nibble_interleave_lines("$8", "$9", "xe", "xo", multiply=True))
    for source, first in (("xe", 0), ("xo", 1)):
        for k in range(4):  # byte k of the source holds code 2k + first of A (low nibble) and of B (high nibble)
            lines += _byte_lookup_lines(source, k) + [f"ld.shared.b32 ${first + 2 * k}, [a];"]
    return lines


# One invocation (``pack=2``): two words A ($8) and B ($9) of 8 4-bit codes -> $c = the fp16 pair (code c of A,
# code c of B), c = 0..7, as PRMT_PAIR4 writes it, looked up in the shared table PAIR_LUT_FILL wrote (two codes per
# load). Needs PAIR_LUT_FILL earlier in the same kernel.
PAIR_LUT4 = tl.constexpr("{\n.reg .b32 l, base, xe, xo, t, a;\n" + "\n".join(_pair_lut_lines()) + "\n}")
PAIR_LUT_CONSTRAINTS = tl.constexpr(",".join(["=r"] * 8 + ["r"] * 2))


def _pair3_lines() -> list[str]:
    """Lines of :data:`PRMT_PAIR3`: both group words spread to nibbles, their nibbles interleaved into two selector
    words (even codes: a0 b0 a2 b2 a4 b4 a6 b6; odd codes likewise), each looked up 4 nibbles at a time
    (:func:`_selector_lookup_lines`)."""
    tables = ("$10", "$12", "$14", "$16")
    lines = _spread3_lines("$8", "na") + _spread3_lines("$9", "nb")
    lines += _nibble_interleave_lines("na", "nb", "se", "so", multiply=False)
    for selector, first in (("se", 0), ("so", 1)):  # codes 2i + first
        lines += _selector_lookup_lines(selector, f"${first}", f"${first + 2}", tables)
        lines += [f"shr.u32 s, {selector}, 16;", *_selector_lookup_lines("s", f"${first + 4}", f"${first + 6}", tables)]
    return lines


# One invocation (``pack=2``): two 24-bit group words A ($8) and B ($9) of 8 3-bit codes each (code k at bit 3k) ->
# $c = the fp16 pair (code c of A, code c of B), c = 0..7; $10, $12, $14, $16: the byte tables of the 8 signed
# values (_byte_tables(table); each scalar passed once per packed element). No sign step: the 8 values are the
# table. The pairs are what a register MMA operand holds (:data:`PRMT_PAIR4`).
PRMT_PAIR3 = tl.constexpr("{\n.reg .b32 na, nb, se, so, s, lo, hi, t;\n" + "\n".join(_pair3_lines()) + "\n}")
PRMT_PAIR3_CONSTRAINTS = PRMT_PAIR4_CONSTRAINTS


def _pair_mixed_lines() -> list[str]:
    """Lines of :data:`PRMT_PAIR_MIXED`. The 4-bit halves of A and B joined in one register (codes n of A and n + 4
    of it are then A's and B's code n: :func:`_nibble_pair_lines`), the 3-bit halves in another (A's 12 bits at
    bit 0, B's at bit 16, spread to nibbles in two shift-and-mask steps: a0 a1 a2 a3 b0 b1 b2 b3), interleaved into
    the selectors a0 b0 a2 b2 and a1 b1 a3 b3 and looked up in the 3-bit byte tables. The bits above each 12-bit
    field are masked away, so a slot's bits 28-31 may hold anything."""
    four = _with_tables(["prmt.b32 x, $8, $9, 0x5410;", *_nibble_pair_lines("x", ["$0", "$1", "$2", "$3"])],
                        ("$10", "$12", "$14", "$16"))
    three = _mixed_three_bit_lines("x", "se", "so")
    tables3 = ("$18", "$20", "$22", "$24")
    return (four + three + _selector_lookup_lines("se", "$4", "$6", tables3)
            + _selector_lookup_lines("so", "$5", "$7", tables3))


# One invocation (``pack=2``): two *mixed slots* A ($8) and B ($9) of a stream split into 4-bit outlier channels and
# 3-bit others (the 3.5-bit preset; ``_mma``'s split layouts): codes 0-3 4-bit at bits 0-15, codes 4-7 3-bit at bits
# 16 + 3(c - 4) -> $c = the fp16 pair (code c of A, code c of B) as PRMT_PAIR4 writes it; $10, $12, $14, $16: the
# 4-bit codebook's magnitude byte tables, $18, $20, $22, $24: the 3-bit codebook's signed ones (each scalar passed
# once per packed element).
PRMT_PAIR_MIXED = tl.constexpr("{\n.reg .b32 s, j, sel, lo, hi, r, t, x, se, so;\n" + "\n".join(_pair_mixed_lines())
                               + "\n}")
PRMT_PAIR_MIXED_CONSTRAINTS = tl.constexpr(",".join(["=r"] * 8 + ["r"] * 18))


@triton.jit
def channel_order_tile(values):
    """The 8 (tokens, groups) tiles of :func:`three_bit_group_values` (code position k = 0..7) as one
    (tokens, 8 * groups) tile in channel order: column 8 g + k is code k of group g, i.e. coordinate 8 g + k of the
    rotated vector. Joined as (tokens, groups, b2, b1, b0) with k = 4 b2 + 2 b1 + b0, so a group's 8 values stay in
    the registers of the thread that decoded them (stream order, column k * groups + g, moves them between
    threads)."""
    even = tl.join(tl.join(values[0], values[4]), tl.join(values[2], values[6]))
    odd = tl.join(tl.join(values[1], values[5]), tl.join(values[3], values[7]))
    tile = tl.join(even, odd)
    return tl.reshape(tile, (tile.shape[0], 8 * tile.shape[1]))
