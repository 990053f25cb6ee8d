"""Packed 4-bit codes as register operands of ``mma.sync`` (Gluon): the word layouts, the in-register decoder and the
channel orders they fix, shared by the decode-attention and scores kernels that read TurboQuant_mse codes.

Fragment of ``mma.m16n8k16`` (lane = 4g + t): the A operand holds rows g, g + 8 and columns 2t, 2t + 1, 2t + 8, 2t + 9
of each 16 x 16 block, two fp16 values per 32-bit register. A kernel loads into each lane exactly the code words of
those rows and columns (:func:`key_words_layout`, :func:`value_words_layout`), decodes them in registers
(:data:`~turboquant.kernels._decode.PRMT_PAIR4` / ``PRMT_PAIR3``, whose output registers are the operand's fp16
pairs) and hands the tile to ``mma_v2`` with no data movement (the conversions below are compiled with
``assert_trivial``). Which rotated channel lands where is therefore fixed by the fragment: :func:`key_channel_order`
(the reduction positions of ``K~ Q^T``, tokens as rows) and :func:`value_channel_order` (the rows of ``V~^T P^T``,
tokens as columns). The unit is a *slot*, the 8 codes of 8 consecutive channels in one 32-bit register: a word of
4-bit codes, or a 24-bit group of 3-bit codes cut out of the loaded words (:func:`key_slots`, :func:`value_slots`),
so both widths share the layouts and the orders. Only rows of 128 channels (head_dim 128) are laid out here.

A *split* stream (the 3.5-bit preset: 32 outlier channels at 4 bits, then 96 at 3, two code rows with their own
norms; ``BITS ==`` :data:`SPLIT_43`) uses the same fragments. Every lane must run the same programs, so the
outliers are spread evenly over the lanes: half of a lane's slots are *mixed* (codes 0-3 four 4-bit outlier codes,
codes 4-7 four 3-bit codes; :data:`~turboquant.kernels._decode.PRMT_PAIR_MIXED` decodes a pair of them), the other
half plain 3-bit slots (``PRMT_PAIR3``): key slots 4t, 4t + 1 and value slots 2g are mixed. The outliers then sit
in whole MMA blocks of the keys (reduction positions k < 32) and in known rows of the values (m < 64 with
m & 8 == 0), so the kernel weights them by their own norm with second products rather than a per-element scale:
:func:`split_key_slots`, :func:`split_value_slots`, :func:`decoded_split_values`, and the ``split`` channel orders,
whose entries index the stream's rotated channels (the outlier group's first).
"""
from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ._decode import (
    PAIR_LUT4,
    PAIR_LUT_CONSTRAINTS,
    PAIR_LUT_FILL,
    PAIR_LUT_FILL_CONSTRAINTS,
    PRMT_PAIR3,
    PRMT_PAIR3_CONSTRAINTS,
    PRMT_PAIR4,
    PRMT_PAIR4_CONSTRAINTS,
    PRMT_PAIR_MIXED,
    PRMT_PAIR_MIXED_CONSTRAINTS,
)

MMA = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8]))
OPERAND_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA.value, k_width=2))
OPERAND_B = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=MMA.value, k_width=2))
ROWS = gl.constexpr(gl.BlockedLayout([1, 4], [8, 4], [1, 1], [1, 0]))  # a plain one-warp layout for small loads

HEAD_DIM = 128
SPLIT_BITS = 43  # the BITS of a split stream: 32 outlier channels at 4 bits, 96 at 3 (module docstring)
SPLIT_43 = gl.constexpr(SPLIT_BITS)
SPLIT_OUTLIER_ROWS = gl.constexpr(64)  # value rows m < 64 hold the outliers (those with m & 8 == 0)
SPLIT_LAYOUT = ((32, 4), (96, 3))  # (channels, bits) of a split stream's groups, outliers first

def _key_slot_channel(slot: torch.Tensor, c: torch.Tensor, split: bool) -> torch.Tensor:
    """Stream channel of code ``c`` of key slot ``slot`` = 4t + i (lane t, its slot i). One group: the slot is word
    4t + i, channels 8 slot + c. Split: slots i = 0, 1 are mixed, their codes c < 4 half i of outlier word t (outlier
    channels 8t + 4i + c) and their codes c >= 4 the 3-bit codes 4i + c - 4 of lane t's 24; slots i = 2, 3 the 3-bit
    codes 8(i - 1) + c (3-bit code j of lane t is stream channel 32 + 24t + j)."""
    if not split:
        return 8 * slot + c
    t, i = slot >> 2, slot & 3
    three = 32 + 24 * t + torch.where(i < 2, 4 * i + c - 4, 8 * (i - 1) + c)
    return torch.where((i < 2) & (c < 4), 8 * t + 4 * i + c, three)


def _value_slot_channel(slot: torch.Tensor, c: torch.Tensor, split: bool) -> torch.Tensor:
    """Stream channel of code ``c`` of value slot ``slot`` = 2g + w (lane group g, its slot w). One group: word 2g + w,
    channels 8 slot + c. Split: slot w = 0 is mixed, its codes c < 4 half g & 1 of outlier word g >> 1 (outlier
    channels 4g + c) and its codes c >= 4 the 3-bit codes c - 4 of lane group g's 12; slot w = 1 the 3-bit codes
    4 + c (3-bit code j of lane group g is stream channel 32 + 12g + j)."""
    if not split:
        return 8 * slot + c
    g, w = slot >> 1, slot & 1
    return torch.where((w == 0) & (c < 4), 4 * g + c, 32 + 12 * g + torch.where(w == 0, c - 4, 4 + c))


@functools.cache
def key_channel_order(dim: int = HEAD_DIM, device: torch.device | str = "cpu", split: bool = False) -> torch.Tensor:
    """Rotated channel at each position k of the key reduction. With k = u0 + 2t + 8c + 64 u1, lane t of a fragment
    decodes slots 4t + 2 u1 + u0 of its token, and code c of that slot lands at position k: u0 is the pair a 32-bit
    operand register holds, t the lane, c and u1 the +8 column and the 16-column blocks of the fragment (one group:
    channels 8 (4t + 2 u1 + u0) + c; ``split``: :func:`_key_slot_channel`). Made once per ``device`` (a CUDA-graph
    capture may index with it) and shared: not to be modified."""
    k = torch.arange(dim)
    u0, t, c, u1 = k & 1, (k >> 1) & 3, (k >> 3) & 7, k >> 6
    return _key_slot_channel(4 * t + 2 * u1 + u0, c, split).to(device)


@functools.cache
def value_channel_order(dim: int = HEAD_DIM, device: torch.device | str = "cpu", split: bool = False) -> torch.Tensor:
    """Rotated channel of each output row m of the value product. With m = g + 8w + 16c, lane group g decodes slots
    2g + w of a token, and code c of slot w is row m (one group: channels 16g + 8w + c; ``split``:
    :func:`_value_slot_channel`). Made once per ``device``, shared."""
    m = torch.arange(dim)
    return _value_slot_channel(2 * (m & 7) + ((m >> 3) & 1), m >> 4, split).to(device)


# How a decoded tile's axes become the MMA operand. PRMT_PAIR4's 8 outputs (code c of a word pair) are joined pairwise,
# outputs 2i and 2i + 1 innermost, which appends the bits of c as axes, least significant first.
# Keys: (token, word as t1 t0 u1 u0, c0 c1 c2) -> (token, u1 c2 c1 c0 t1 t0 u0): column k = u0 + 2t + 8c + 64 u1.
KEY_AXES = gl.constexpr((0, 3, 7, 6, 5, 1, 2, 4))
# Values: (token, word as g w, c0 c1 c2) -> (c2 c1 c0 w g, token): row m = g + 8w + 16c.
VALUE_AXES = gl.constexpr((5, 4, 3, 2, 1, 0))


@gluon.constexpr_function
def key_words_layout(block_n):
    """(BLOCK_N tokens, 16 words): lane 4g + t holds words 4t..4t+3 (one 16-byte load) of tokens g + 8r; words 4t + 2u1
    and 4t + 2u1 + 1 are consecutive registers (the pair PRMT_PAIR4 decodes)."""
    tokens = [[8 << i, 0] for i in range(block_n.bit_length() - 4)]
    return gl.DistributedLinearLayout([[0, 1], [0, 2]] + tokens, [[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]], [], [],
                                      [block_n, 16])


@gluon.constexpr_function
def value_words_layout(block_n, pairs_first):
    """(BLOCK_N tokens, 16 words): lane 4g + t holds words 2g, 2g + 1 of tokens 2t + {0, 1} + 8r. Loaded with the two
    words of a token in consecutive registers (one 8-byte load); decoded with tokens 2t and 2t + 1 consecutive
    (``pairs_first``: the pair PRMT_PAIR4 decodes). The two differ only in register order."""
    word, pair = [0, 1], [1, 0]
    tokens = [[8 << i, 0] for i in range(block_n.bit_length() - 4)]
    return gl.DistributedLinearLayout([pair, word] + tokens if pairs_first else [word, pair] + tokens,
                                      [[2, 0], [4, 0], [0, 2], [0, 4], [0, 8]], [], [], [block_n, 16])


@gluon.constexpr_function
def row_loads_ptx(stream: str, bits: int, stride: int, block_n: int) -> str:
    """PTX loading the code words a lane holds of a tile of ``block_n`` tokens, in the register order of
    :func:`key_words_layout` (``stream="key"``) or ``value_words_layout(block_n, False)`` (``"value"``): the words
    :func:`key_slot_source` / :func:`value_slot_source` name, from one 64-bit address per lane. Operands: ``$0 ..
    $(n - 1)`` the words (n = block_n / 2), ``$n`` the address of the tile's first token row (int64), ``$(2n)`` how
    many of the tile's tokens are live (int32; the words of the others are 0); ``stride``: words per token row.

    The lane's first word is found from ``%laneid`` (lane = 4g + t) and every other one is an immediate offset from
    it, so a tile costs a few integer instructions and one ``setp`` per row where per-element pointers (``tokens *
    stride``, 64-bit) cost about seven per load. The words are zeroed before the loads, which are predicated on the
    row's token: predicated loads alone would leave ptxas registers that may be undefined, which cost 30-60
    registers per thread (benchmarks/NOTES.md, Session 35). 4-bit rows: one 16-byte load per key row, one 8-byte
    load per value row (the rows 16- / 8-byte aligned: :func:`row_loads_serve`); 3-bit rows: 4-byte loads (their
    words are not 8-byte aligned), a key row's fourth slot left 0 (never read)."""
    if stream not in ("key", "value") or bits not in (3, 4) or block_n % 16:
        raise ValueError(f"row loads serve key or value rows of 3 or 4 bits, tiles of 16k tokens; got {stream!r}, "
                         f"{bits} bits, {block_n} tokens")
    n, row = block_n // 2, 4 * stride
    words = [f"${i}" for i in range(n)]
    lines = ["{", ".reg .u32 %lane, %t, %g, %j;", ".reg .s32 %left;", ".reg .u64 %a;", ".reg .pred %p;",
             "mov.u32 %lane, %laneid;", "and.b32 %t, %lane, 3;", "shr.u32 %g, %lane, 2;"]
    loads = []  # (token of the row after the lane's first, registers, byte offset from the lane's first word)
    if stream == "key":  # register 4r + i: word (4 or 3) t + i of token g + 8r
        lines += [f"mad.wide.u32 %a, %t, {16 if bits == 4 else 12}, ${n};", f"mad.wide.u32 %a, %g, {row}, %a;",
                  f"sub.s32 %left, ${2 * n}, %g;"]
        for r in range(block_n // 8):
            regs = words[4 * r:4 * r + 4]
            loads += ([(8 * r, regs, 8 * r * row)] if bits == 4 else
                      [(8 * r, [regs[i]], 8 * r * row + 4 * i) for i in range(3)])
    else:  # register w + 2p + 4r: word 2g + w (4-bit) or 3(g >> 1) + (g & 1) + w (3-bit) of token 2t + p + 8r
        lines += ["shl.b32 %j, %g, 1;"] if bits == 4 else ["shr.u32 %j, %g, 1;", "and.b32 %g, %g, 1;",
                                                           "mad.lo.u32 %j, %j, 3, %g;"]
        lines += [f"mad.wide.u32 %a, %j, 4, ${n};", f"mad.wide.u32 %a, %t, {2 * row}, %a;", "shl.b32 %t, %t, 1;",
                  f"sub.s32 %left, ${2 * n}, %t;"]
        for r in range(block_n // 8):
            for p in range(2):
                token, regs, at = 8 * r + p, words[4 * r + 2 * p:4 * r + 2 * p + 2], (8 * r + p) * row
                loads += [(token, regs, at)] if bits == 4 else [(token, [regs[w]], at + 4 * w) for w in range(2)]
    lines += [f"mov.b32 {w}, 0;" for w in words]
    tested = None
    for token, regs, at in loads:  # a row is live where its token is below %left (the live count from the lane's)
        if token != tested:
            lines.append(f"setp.gt.s32 %p, %left, {token};")
            tested = token
        target = regs[0] if len(regs) == 1 else "{" + ", ".join(regs) + "}"
        lines.append(f"@%p ld.global{'' if len(regs) == 1 else f'.v{len(regs)}'}.b32 {target}, [%a+{at}];")
    return "\n".join(lines + ["}"])


def row_loads_serve(words: torch.Tensor, stream: str, bits: int) -> bool:
    """Whether :func:`row_loads_ptx` may read these code rows (int32 words, (..., tokens, words)): its 16-byte key
    loads and 8-byte value loads of 4-bit rows need every row start of a lane that aligned (the address and every
    stride but the words'); 3-bit rows are read a word at a time."""
    align = {("key", 4): 4, ("value", 4): 2}.get((stream, bits), 1)  # in words
    return words.data_ptr() % (4 * align) == 0 and all(s % align == 0 for s in words.stride()[:-1])


@gluon.constexpr_function
def load_constraints(n):
    """The constraints of :func:`row_loads_ptx` for ``n`` outputs: the outputs, then its two inputs, each passed once
    per packed element by ``gl.inline_asm_elementwise`` (only the first copy is read)."""
    return ",".join(["=r"] * n + ["l"] * n + ["r"] * n)


@gluon.jit
def tile_words(rows, live_tokens, STREAM: gl.constexpr, BITS: gl.constexpr, STRIDE: gl.constexpr,
               BLOCK_N: gl.constexpr):
    """The words a ``*_slot_source`` names for a tile whose first token row starts at ``rows`` (a pointer to int32;
    ``STRIDE`` words per token row), of which the first ``live_tokens`` are loaded (:func:`row_loads_ptx`), in
    :func:`key_words_layout` (``STREAM == "key"``) or ``value_words_layout(BLOCK_N, False)`` (``"value"``)."""
    if STREAM == "key":
        layout: gl.constexpr = key_words_layout(BLOCK_N)
    else:
        layout: gl.constexpr = value_words_layout(BLOCK_N, False)
    address = gl.full((BLOCK_N, 16), 0, gl.int64, layout) + rows.to(gl.int64)
    live = gl.full((BLOCK_N, 16), 0, gl.int32, layout) + live_tokens
    return gl.inline_asm_elementwise(row_loads_ptx(STREAM, BITS, STRIDE, BLOCK_N), load_constraints(BLOCK_N // 2),
                                     [address, live], dtype=gl.int32, is_pure=True, pack=BLOCK_N // 2)


@gluon.jit
def gather_words(pointers, live):
    """The int32 words at ``pointers`` (0 where not ``live``): what a ``*_slot_source`` names, loaded into registers
    in its layout (the kernel may instead copy it to shared memory and read it back in that layout)."""
    return gl.load(pointers, mask=live, other=0)


@gluon.jit
def _row_pointers(rows, tokens, stride, cols):
    """Pointers to the int32 words ``cols`` (a 1-D tensor over the slot axis) of the rows of ``tokens``."""
    return rows + tokens.to(gl.int64)[:, None] * stride + cols[None, :]


@gluon.jit
def key_slot_source(rows, tokens, tok_mask, slot, stride, BITS: gl.constexpr):
    """(pointers, live mask) of the words :func:`key_slots` reads, in :func:`key_words_layout`."""
    if BITS == 4:
        pointers = _row_pointers(rows, tokens, stride, slot)
        live = tok_mask[:, None]
    else:
        i = slot & 3
        pointers = _row_pointers(rows, tokens, stride, 3 * (slot >> 2) + i)
        live = tok_mask[:, None] & (i < 3)[None, :]
    return pointers, live


@gluon.jit
def cut_key_slots(loaded, BLOCK_N: gl.constexpr, BITS: gl.constexpr):
    """The key slots of :func:`key_slots` from the words its source names (``loaded``)."""
    if BITS == 4:
        words = loaded
    else:
        loaded = gl.reshape(loaded.to(gl.uint32, bitcast=True), (BLOCK_N, 4, 2, 2))  # token, t, i1, i0
        even, odd = gl.split(loaded)  # i0 = 0: words i = 0, 2; i0 = 1: words 1, 3 (3 unused)
        w0, w2 = gl.split(even)
        w1, _ = gl.split(odd)
        g0 = w0  # bits 24-31 of a group word are not read (PRMT_PAIR3 masks them)
        g1 = (w0 >> 24) | (w1 << 8)
        g2 = (w1 >> 16) | (w2 << 16)
        g3 = w2 >> 8
        words = gl.reshape(gl.join(gl.join(g0, g2), gl.join(g1, g3)), (BLOCK_N, 16)).to(gl.int32, bitcast=True)
        words = gl.convert_layout(words, key_words_layout(BLOCK_N), assert_trivial=True)
    return words


@gluon.jit
def key_slots(rows, tokens, tok_mask, slot, stride, BLOCK_N: gl.constexpr, BITS: gl.constexpr):
    """(BLOCK_N, 16) int32 *slots* of key rows in :func:`key_words_layout`: slot 4t + i holds the 8 codes of rotated
    channels 32t + 8i .. 32t + 8i + 7 (``slot``: the slot index, an arange over the layout's column axis). 4-bit rows:
    the slot is word 4t + i (one 16-byte load per lane). 3-bit rows (12 words): lane t loads words 3t .. 3t + 2 (96
    bits, its 32 channels) into slots 4t .. 4t + 2 and cuts them into four 24-bit group words."""
    pointers, live = key_slot_source(rows, tokens, tok_mask, slot, stride, BITS)
    return cut_key_slots(gather_words(pointers, live), BLOCK_N, BITS)


@gluon.jit
def value_slot_source(rows, tokens, tok_mask, slot, stride, BITS: gl.constexpr):
    """(pointers, live mask) of the words :func:`value_slots` reads, in ``value_words_layout(BLOCK_N, False)``."""
    if BITS == 4:
        cols = slot
    else:
        g = slot >> 1
        cols = 3 * (g >> 1) + (g & 1) + (slot & 1)
    return _row_pointers(rows, tokens, stride, cols), tok_mask[:, None]


@gluon.jit
def cut_value_slots(loaded, slot, BLOCK_N: gl.constexpr, BITS: gl.constexpr):
    """The value slots of :func:`value_slots` from the words its source names (``loaded``)."""
    if BITS == 4:
        words = loaded
    else:
        g = slot >> 1
        low, high = gl.split(gl.reshape(loaded.to(gl.uint32, bitcast=True), (BLOCK_N, 8, 2)))
        offset, _ = gl.split(gl.reshape(gl.zeros_like(loaded) + (16 * (g & 1))[None, :], (BLOCK_N, 8, 2)))
        both = low.to(gl.uint64) | (high.to(gl.uint64) << 32)
        first = (both >> offset.to(gl.uint64)).to(gl.uint32)  # bits 24-31: not read (PRMT_PAIR3 masks them)
        second = (both >> (offset + 24).to(gl.uint64)).to(gl.uint32)
        words = gl.reshape(gl.join(first, second), (BLOCK_N, 16)).to(gl.int32, bitcast=True)
        words = gl.convert_layout(words, value_words_layout(BLOCK_N, False), assert_trivial=True)
    return words


@gluon.jit
def value_slots(rows, tokens, tok_mask, slot, stride, BLOCK_N: gl.constexpr, BITS: gl.constexpr):
    """(BLOCK_N, 16) int32 slots of value rows in ``value_words_layout(BLOCK_N, False)``: slot 2g + w holds the 8 codes
    of rotated channels 16g + 8w .. 16g + 8w + 7. 4-bit rows: the slot is word 2g + w (one 8-byte load per lane and
    token). 3-bit rows: lane g's 48 bits start at bit 48g, inside words floor(3g / 2) and the next; both are loaded
    and the two 24-bit group words cut out at bit offset 16 (g odd) or 0."""
    pointers, live = value_slot_source(rows, tokens, tok_mask, slot, stride, BITS)
    return cut_value_slots(gather_words(pointers, live), slot, BLOCK_N, BITS)


@gluon.jit
def _lane_constant(like, column_values, BLOCK_N: gl.constexpr, PARTS: gl.constexpr):
    """``column_values`` (one int32 per slot column) broadcast over ``like``'s tokens and cut like ``like`` is cut
    into its slot registers: the first of the ``PARTS`` (2 or 4) registers per lane, in that register's layout."""
    wide = gl.zeros_like(like) + column_values[None, :]
    if PARTS == 2:
        first, _ = gl.split(gl.reshape(wide, (BLOCK_N, 8, 2)))
    else:
        even, _ = gl.split(gl.reshape(wide, (BLOCK_N, 4, 2, 2)))
        first, _ = gl.split(even)
    return first


@gluon.jit
def _funnel(low, high, shift):
    """Bits ``shift .. shift + 31`` (``shift`` < 32, uint64) of the 64-bit word (``high``, ``low``), uint32."""
    return (((high.to(gl.uint64) << 32) | low.to(gl.uint64)) >> shift).to(gl.uint32)


@gluon.jit
def split_key_slot_source(outlier_rows, rows, tokens, tok_mask, slot, outlier_stride, stride):
    """(pointers, live mask) of the words :func:`split_key_slots` reads, in :func:`key_words_layout`: slot 4t of a
    token points at its outlier word t, slot 4t + i (i > 0) at its 3-bit word 2t + i - 1."""
    i = slot & 3
    t = slot >> 2
    base = gl.where((i == 0)[None, :], outlier_rows + tokens.to(gl.int64)[:, None] * outlier_stride + t[None, :],
                    rows + tokens.to(gl.int64)[:, None] * stride + (2 * t + i - 1)[None, :])
    return base, tok_mask[:, None]


@gluon.jit
def cut_split_key_slots(loaded, slot, BLOCK_N: gl.constexpr):
    """The slots of :func:`split_key_slots` from the words its source names (``loaded``)."""
    t = slot >> 2
    loaded = loaded.to(gl.uint32, bitcast=True)
    even, odd = gl.split(gl.reshape(loaded, (BLOCK_N, 4, 2, 2)))  # token, t, i1, i0
    outlier, w1 = gl.split(even)  # i = 0: outlier word t; i = 2: 3-bit word 2t + 1
    w0, w2 = gl.split(odd)  # i = 1, 3: 3-bit words 2t, 2t + 2
    shift = _lane_constant(loaded, 8 * t, BLOCK_N, 4).to(gl.uint64)
    x0 = _funnel(w0, w1, shift)  # the lane's 3-bit bits 0-31, then 32-63, 64-71
    x1 = _funnel(w1, w2, shift)
    x2 = w2 >> shift.to(gl.uint32)
    s0 = (outlier & 0xFFFF) | (x0 << 16)
    s1 = (outlier >> 16) | ((x0 >> 12) << 16)
    s2 = (x0 >> 24) | (x1 << 8)
    s3 = (x1 >> 16) | (x2 << 16)
    words = gl.reshape(gl.join(gl.join(s0, s2), gl.join(s1, s3)), (BLOCK_N, 16)).to(gl.int32, bitcast=True)
    return gl.convert_layout(words, key_words_layout(BLOCK_N), assert_trivial=True)


@gluon.jit
def split_key_slots(outlier_rows, rows, tokens, tok_mask, slot, outlier_stride, stride, BLOCK_N: gl.constexpr):
    """(BLOCK_N, 16) int32 slots (``_key_slot_channel``) of a split key stream in :func:`key_words_layout`:
    ``outlier_rows`` the 4-bit outlier rows (4 words), ``rows`` the 3-bit rows (9 words). Lane t loads outlier word t
    and the 3-bit words 2t, 2t + 1, 2t + 2 (its 24 codes are the 72 bits at bit 8t of them). Mixed slots 4t + i,
    i = 0, 1: half i of the outlier word in bits 0-15, 3-bit codes 4i .. 4i + 3 above; slots 4t + 2, 4t + 3: 3-bit codes
    8 .. 15 and 16 .. 23 in bits 0-23. Bits above the codes a slot's program reads may hold anything."""
    pointers, live = split_key_slot_source(outlier_rows, rows, tokens, tok_mask, slot, outlier_stride, stride)
    return cut_split_key_slots(gather_words(pointers, live), slot, BLOCK_N)


@gluon.jit
def split_value_slot_sources(outlier_rows, rows, tokens, tok_mask, slot, outlier_stride, stride):
    """The two (pointers, live mask) pairs of the words :func:`split_value_slots` reads, in
    ``value_words_layout(BLOCK_N, False)``: slot 2g + w of a token points at its 3-bit word g + w, and (w = 0 only)
    at its outlier word g >> 1."""
    g = slot >> 1
    w = slot & 1
    token_rows = tokens.to(gl.int64)[:, None]
    live = tok_mask[:, None]
    return (rows + token_rows * stride + (g + w)[None, :], live,
            outlier_rows + token_rows * outlier_stride + (g >> 1)[None, :], live & (w == 0)[None, :])


@gluon.jit
def cut_split_value_slots(pair, outlier, slot, BLOCK_N: gl.constexpr):
    """The slots of :func:`split_value_slots` from the words its sources name (``pair``, ``outlier``)."""
    g = slot >> 1
    pair = pair.to(gl.uint32, bitcast=True)
    low, high = gl.split(gl.reshape(pair, (BLOCK_N, 8, 2)))
    outlier, _ = gl.split(gl.reshape(outlier.to(gl.uint32, bitcast=True), (BLOCK_N, 8, 2)))
    shift = _lane_constant(pair, 4 * g, BLOCK_N, 2).to(gl.uint64)
    half = outlier >> _lane_constant(pair, 16 * (g & 1), BLOCK_N, 2).to(gl.uint32)
    x0 = _funnel(low, high, shift)  # the lane group's 3-bit bits 0-31, then 32-35
    x1 = high >> shift.to(gl.uint32)
    s0 = (half & 0xFFFF) | (x0 << 16)
    s1 = (x0 >> 12) | (x1 << 20)
    words = gl.reshape(gl.join(s0, s1), (BLOCK_N, 16)).to(gl.int32, bitcast=True)
    return gl.convert_layout(words, value_words_layout(BLOCK_N, False), assert_trivial=True)


@gluon.jit
def split_value_slots(outlier_rows, rows, tokens, tok_mask, slot, outlier_stride, stride, BLOCK_N: gl.constexpr):
    """(BLOCK_N, 16) int32 slots (``_value_slot_channel``) of a split value stream in
    ``value_words_layout(BLOCK_N, False)``. Lane group g loads the 3-bit words g and g + 1 (its 12 codes are the 36
    bits at bit 4g of them) and outlier word g >> 1 (its 4 outlier codes are half g & 1 of it). Mixed slot 2g: the
    outlier half in bits 0-15, 3-bit codes 0-3 above; slot 2g + 1: 3-bit codes 4-11 in bits 0-23."""
    pair, pair_live, outlier, outlier_live = split_value_slot_sources(outlier_rows, rows, tokens, tok_mask, slot,
                                                                      outlier_stride, stride)
    return cut_split_value_slots(gather_words(pair, pair_live), gather_words(outlier, outlier_live), slot, BLOCK_N)


LUT_ENTRIES = gl.constexpr(gl.BlockedLayout([1, 8], [32, 1], [1, 1], [1, 0]))  # lane l: entries 8l .. 8l + 7


@gluon.jit
def fill_pair_lut(pair_table_ptr):
    """Copy ``_decode.pair_lut_table`` (256 int32 at ``pair_table_ptr``) into the shared table the ``"lut"`` decoder
    reads, a copy per two lanes (:data:`~turboquant.kernels._decode.PAIR_LUT_FILL`); once per program, before any
    lookup."""
    entries = (gl.arange(0, 32, layout=gl.SliceLayout(1, LUT_ENTRIES))[:, None] * 8
               + gl.arange(0, 8, layout=gl.SliceLayout(0, LUT_ENTRIES))[None, :])
    gl.inline_asm_elementwise(PAIR_LUT_FILL, PAIR_LUT_FILL_CONSTRAINTS, [gl.load(pair_table_ptr + entries)],
                              dtype=gl.int32, is_pure=False, pack=8)


@gluon.jit
def _decode_pairs(words, tables, BITS: gl.constexpr, DECODER: gl.constexpr):
    """The 8 code planes of slot pairs (consecutive registers of ``words``): fp16 tensors of ``words``' shape.
    ``tables``: the byte tables (``_decode.prmt_byte_tables``) of the codebook, or for ``BITS == 43`` (mixed slots)
    of the outlier codebook then the 3-bit one. ``DECODER``: ``"prmt"`` (byte-permute lookups in registers) or, for
    4-bit words, ``"lut"`` (two codes per load from the shared table of :func:`fill_pair_lut`; ``tables`` unread)."""
    if DECODER == "lut":
        planes = gl.inline_asm_elementwise(PAIR_LUT4, PAIR_LUT_CONSTRAINTS, [words], dtype=(gl.float16,) * 8,
                                           is_pure=True, pack=2)
    elif BITS == 4:
        planes = gl.inline_asm_elementwise(PRMT_PAIR4, PRMT_PAIR4_CONSTRAINTS,
                                           [words, tables[0], tables[1], tables[2], tables[3]],
                                           dtype=(gl.float16,) * 8, is_pure=True, pack=2)
    elif BITS == 3:
        planes = gl.inline_asm_elementwise(PRMT_PAIR3, PRMT_PAIR3_CONSTRAINTS,
                                           [words, tables[0], tables[1], tables[2], tables[3]],
                                           dtype=(gl.float16,) * 8, is_pure=True, pack=2)
    else:
        planes = gl.inline_asm_elementwise(PRMT_PAIR_MIXED, PRMT_PAIR_MIXED_CONSTRAINTS,
                                           [words, tables[0], tables[1], tables[2], tables[3], tables[4], tables[5],
                                            tables[6], tables[7]],
                                           dtype=(gl.float16,) * 8, is_pure=True, pack=2)
    return planes


@gluon.jit
def _split_key_planes(words, tables, BLOCK_N: gl.constexpr):
    """The 8 code planes of split key slots (:func:`split_key_slots`), in ``words``' shape and layout: the mixed pairs
    (slots 4t, 4t + 1) and the 3-bit pairs (4t + 2, 4t + 3) are taken apart (a register axis), decoded by their
    programs and put back."""
    w = gl.permute(gl.reshape(words, (BLOCK_N, 4, 2, 2)), (0, 1, 3, 2))  # token, t, i0, i1
    mixed, three = gl.split(w)  # i1 = 0: the mixed pair; 1: the 3-bit pair
    m = _decode_pairs(gl.reshape(mixed, (BLOCK_N, 8)), tables, SPLIT_43, "prmt")
    h = _decode_pairs(gl.reshape(three, (BLOCK_N, 8)), (tables[4], tables[5], tables[6], tables[7]), 3, "prmt")
    return (_key_plane(m[0], h[0], BLOCK_N), _key_plane(m[1], h[1], BLOCK_N), _key_plane(m[2], h[2], BLOCK_N),
            _key_plane(m[3], h[3], BLOCK_N), _key_plane(m[4], h[4], BLOCK_N), _key_plane(m[5], h[5], BLOCK_N),
            _key_plane(m[6], h[6], BLOCK_N), _key_plane(m[7], h[7], BLOCK_N))


@gluon.jit
def _key_plane(mixed, three, BLOCK_N: gl.constexpr):
    """One code plane of the mixed and the 3-bit key pairs (BLOCK_N, 8 each) as one (BLOCK_N, 16) plane."""
    both = gl.join(gl.reshape(mixed, (BLOCK_N, 4, 2)), gl.reshape(three, (BLOCK_N, 4, 2)))  # token, t, i0, i1
    return gl.reshape(gl.permute(both, (0, 1, 3, 2)), (BLOCK_N, 16))


@gluon.jit
def _join_planes(v):
    """The 8 planes of :func:`_decode_pairs` as one tensor with three more axes (c0, c1, c2)."""
    return gl.join(gl.join(gl.join(v[0], v[1]), gl.join(v[2], v[3])), gl.join(gl.join(v[4], v[5]), gl.join(v[6], v[7])))


@gluon.jit
def decoded_keys(words, tables, BLOCK_N: gl.constexpr, BITS: gl.constexpr, DECODER: gl.constexpr):
    """(BLOCK_N, 16) key slots -> (BLOCK_N, 128) fp16 in the A layout, columns in :func:`key_channel_order`
    (``DECODER``: :func:`_decode_pairs`)."""
    x = gl.permute(gl.reshape(_join_planes(_decode_pairs(words, tables, BITS, DECODER)),
                              (BLOCK_N, 2, 2, 2, 2, 2, 2, 2)),
                   KEY_AXES.value)
    return gl.convert_layout(gl.reshape(x, (BLOCK_N, 128)), OPERAND_A, assert_trivial=True)


@gluon.jit
def decoded_split_keys(words, tables, BLOCK_N: gl.constexpr):
    """(BLOCK_N, 16) split key slots (:func:`split_key_slots`) -> the (BLOCK_N, 128) tile and its outlier columns
    k < 32 (BLOCK_N, 32), both fp16 in the A layout (columns in the split :func:`key_channel_order`)."""
    x = gl.permute(gl.reshape(_join_planes(_split_key_planes(words, tables, BLOCK_N)), (BLOCK_N, 2, 2, 2, 2, 2, 2, 2)),
                   KEY_AXES.value)  # token, u1, c2, c1, c0, t1, t0, u0: k = u0 + 2t + 8c + 64 u1
    outliers, _ = gl.split(gl.permute(x, (0, 2, 3, 4, 5, 6, 7, 1)))  # u1 = 0
    outliers, _ = gl.split(gl.permute(outliers, (0, 2, 3, 4, 5, 6, 1)))  # c2 = 0: k < 32
    outliers = gl.convert_layout(gl.reshape(outliers, (BLOCK_N, 32)), OPERAND_A, assert_trivial=True)
    return gl.convert_layout(gl.reshape(x, (BLOCK_N, 128)), OPERAND_A, assert_trivial=True), outliers


@gluon.jit
def _value_tile(x, BLOCK_N: gl.constexpr):
    """Joined value planes (:func:`_join_planes`) -> (128, BLOCK_N) fp16 in the A layout, rows in
    :func:`value_channel_order`."""
    x = gl.permute(gl.reshape(x, (BLOCK_N, 8, 2, 2, 2, 2)), VALUE_AXES.value)
    return gl.convert_layout(gl.reshape(x, (128, BLOCK_N)), OPERAND_A, assert_trivial=True)


@gluon.jit
def decoded_values(words, tables, BLOCK_N: gl.constexpr, BITS: gl.constexpr, DECODER: gl.constexpr):
    """(BLOCK_N, 16) value slots -> (128, BLOCK_N) fp16 in the A layout, rows in :func:`value_channel_order`
    (``DECODER``: :func:`_decode_pairs`)."""
    words = gl.convert_layout(words, value_words_layout(BLOCK_N, True), assert_trivial=True)
    return _value_tile(_join_planes(_decode_pairs(words, tables, BITS, DECODER)), BLOCK_N)


@gluon.jit
def _value_plane(mixed, three, BLOCK_N: gl.constexpr):
    """One code plane of the mixed (w = 0) and 3-bit (w = 1) value slots (BLOCK_N, 8 each) as one (BLOCK_N, 16)."""
    return gl.reshape(gl.join(mixed, three), (BLOCK_N, 16))


@gluon.jit
def decoded_split_values(words, tables, BLOCK_N: gl.constexpr):
    """(BLOCK_N, 16) split value slots (:func:`split_value_slots`) -> the (128, BLOCK_N) tile and its rows m < 64
    (codes 0-3 of every slot: the outlier rows, m & 8 == 0, and 3-bit rows), both fp16 in the A layout: the kernel
    weights the first by the 3-bit norms and the second by the outlier norms and keeps each product's own rows."""
    words = gl.convert_layout(words, value_words_layout(BLOCK_N, True), assert_trivial=True)
    mixed, three = gl.split(gl.reshape(words, (BLOCK_N, 8, 2)))  # w = 0: the mixed slot; 1: the 3-bit slot
    m = _decode_pairs(mixed, tables, SPLIT_43, "prmt")
    h = _decode_pairs(three, (tables[4], tables[5], tables[6], tables[7]), 3, "prmt")
    v = (_value_plane(m[0], h[0], BLOCK_N), _value_plane(m[1], h[1], BLOCK_N), _value_plane(m[2], h[2], BLOCK_N),
         _value_plane(m[3], h[3], BLOCK_N), _value_plane(m[4], h[4], BLOCK_N), _value_plane(m[5], h[5], BLOCK_N),
         _value_plane(m[6], h[6], BLOCK_N), _value_plane(m[7], h[7], BLOCK_N))
    top = gl.join(gl.join(v[0], v[1]), gl.join(v[2], v[3]))
    top = gl.permute(gl.reshape(top, (BLOCK_N, 8, 2, 2, 2)), (4, 3, 2, 1, 0))  # (c1 c0 w g, token)
    top = gl.convert_layout(gl.reshape(top, (64, BLOCK_N)), OPERAND_A, assert_trivial=True)
    return top, _value_tile(_join_planes(v), BLOCK_N)
