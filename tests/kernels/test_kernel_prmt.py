"""The inline-PTX decoders of ``turboquant.kernels._decode``, run by a small emulator of the PTX instructions they use
(also the one the quantize kernel's fp16-pair code step is checked with, ``test_kernel_quantize_wgmma``).

Triton's interpreter cannot run inline assembly, so the ``"prmt"`` decoders are checked here, bit for bit, against
the codebook lookup they replace: every code value at every position of the input word, on the library's Lloyd-Max
codebooks. The emulator follows the PTX ISA's definitions (``prmt`` in its default mode: selector nibble i picks
byte ``sel & 7`` of ``{b, a}`` for byte i of the result, and with ``sel & 8`` replicates that byte's sign bit).
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import turboquant as tq
from turboquant.kernels._decode import _PRMT_DECODE3, _PRMT_DECODE4

MASK = 0xFFFFFFFF


def _prmt(a: int, b: int, selector: int) -> int:
    source = [(a >> (8 * i)) & 255 for i in range(4)] + [(b >> (8 * i)) & 255 for i in range(4)]
    out = 0
    for i in range(4):
        nibble = (selector >> (4 * i)) & 15
        byte = source[nibble & 7]
        if nibble & 8:
            byte = 255 if byte & 128 else 0
        out |= byte << (8 * i)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    """Bit i of the result is bit (a_i b_i c_i) of ``lut`` (a the high bit: a = 0xF0, b = 0xCC, c = 0xAA)."""
    return sum(((lut >> ((a >> i & 1) << 2 | (b >> i & 1) << 1 | (c >> i & 1))) & 1) << i for i in range(32))


def _halves(word: int) -> np.ndarray:
    return np.array([word & 0xFFFF, word >> 16], dtype=np.uint16).view(np.float16)


def _pack_halves(low, high) -> int:
    bits = np.array([low, high], dtype=np.float16).view(np.uint16)
    return int(bits[0]) | int(bits[1]) << 16


def _f32(word: int) -> np.float32:
    return np.array([word], dtype=np.uint32).view(np.float32)[0]


def _s32(word: int) -> int:
    word &= MASK
    return word - (1 << 32) if word >> 31 else word


def _set_gt_f16x2(a: int, b: int) -> int:
    """``set.gt.u32.f16x2``: per half, 0xFFFF where a > b (unordered: false), else 0."""
    gt = _halves(a) > _halves(b)
    return (0xFFFF if gt[0] else 0) | (0xFFFF0000 if gt[1] else 0)


_OPS = {
    "and.b32": lambda a, b: a & b, "or.b32": lambda a, b: a | b, "xor.b32": lambda a, b: a ^ b,
    "shl.b32": lambda a, b: (a << b) & MASK, "shr.u32": lambda a, b: a >> b,
    "mul.lo.u32": lambda a, b: (a * b) & MASK, "mul.hi.u32": lambda a, b: (a * b) >> 32,
    "mad.lo.u32": lambda a, b, c: (a * b + c) & MASK, "add.u32": lambda a, b: (a + b) & MASK,
    "not.b32": lambda a: ~a & MASK, "sub.s32": lambda a, b: (a - b) & MASK,
    "setp.gt.s32": lambda a, b: _s32(a) > _s32(b), "setp.lt.s32": lambda a, b: _s32(a) < _s32(b),
    "mad.wide.u32": lambda a, b, c: ((a & MASK) * (b & MASK) + c) & (2 ** 64 - 1),
    "prmt.b32": _prmt, "mov.b32": lambda a: a, "mov.u32": lambda a: a, "lop3.b32": _lop3,
    "cvt.rn.f16x2.f32": lambda a, b: _pack_halves(np.float16(_f32(b)), np.float16(_f32(a))),  # a: the high half
    "abs.f16x2": lambda a: a & 0x7FFF7FFF, "set.gt.u32.f16x2": _set_gt_f16x2,
    "cvt.f32.f16": lambda a: int(np.array([_halves(a)[0]], dtype=np.float32).view(np.uint32)[0]),
    "sub.f32": lambda a, b: int(np.array([_f32(a) - _f32(b)], dtype=np.float32).view(np.uint32)[0]),
}


class SharedMemory(dict):
    """Shared memory of one emulated warp: 32-bit words by byte address, and every address ``ld.shared`` read, by
    lane (for bank checks)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: dict[int, list[int]] = {}


def run_ptx(program: str, operands: dict[int, int], lane: int = 0, shared: SharedMemory | None = None,
            symbols: dict[str, int] | None = None, memory: dict[int, int] | None = None) -> dict[int, int]:
    """Execute ``program`` (``{ ... }`` blocks of the instructions in :data:`_OPS`, ``.shared`` declarations skipped)
    with ``$i`` inputs ``operands`` (unsigned up to 64-bit, or int32) as lane ``lane`` (``%laneid``) of a warp whose
    shared memory is ``shared``, whose shared variables are at the addresses ``symbols`` and whose global memory is
    ``memory``;
    ``ld.shared.b32`` / ``st.shared.v4.b32`` move words of ``shared``, ``ld.global{,.v2,.v4}.b32`` read words of
    ``memory`` (addresses ``[reg]`` or ``[reg+imm]``, 32-bit words by byte address), an instruction guarded by
    ``@%p`` runs where ``setp`` set ``%p``, ``bar.warp.sync`` does nothing (run the lanes one after the other).
    Returns every ``$i`` written (32-bit, or 16-bit halves for ``mov.b32 {x, y}, v``)."""
    regs: dict[str, int] = {f"${i}": v & MASK if v < 0 else v for i, v in operands.items()}  # negative: an int32
    regs["%laneid"] = lane
    regs.update(symbols or {})

    def value(token: str) -> int:
        return regs[token] if token in regs else int(token, 0)

    def address(token: str) -> int:
        base, _, offset = token.strip("[]").partition("+")
        return value(base) + (int(offset, 0) if offset else 0)

    for line in program.strip().splitlines():
        line = line.strip().rstrip(";")
        if line in ("", "{", "}") or line.startswith((".reg", ".shared", "bar.warp.sync")):
            continue
        guard = re.fullmatch(r"@(!?)(%\w+)\s+(.*)", line)
        if guard:
            negate, predicate, line = guard.groups()
            if bool(regs[predicate]) == bool(negate):
                continue
        op, rest = line.split(None, 1)
        if op.startswith("ld.global."):
            target, source = re.fullmatch(r"\{?([^}]*?)\}?,\s*(\[[^\]]+\])", rest).groups()
            for i, dest in enumerate(target.split(",")):
                regs[dest.strip()] = memory[address(source) + 4 * i]
            continue
        if op == "st.shared.v4.b32":
            target, words = re.fullmatch(r"(\[[^\]]+\]),\s*\{(.*)\}", rest).groups()
            for i, word in enumerate(words.split(",")):
                shared[address(target) + 4 * i] = value(word.strip())
            continue
        if op == "ld.shared.b32":
            dest, target = (t.strip() for t in rest.split(",", 1))
            shared.reads.setdefault(lane, []).append(address(target))
            regs[dest] = shared[address(target)]
            continue
        unpack = re.fullmatch(r"\{([$\w]+),\s*([$\w]+)\},\s*(\S+)", rest)
        if op == "mov.b32" and unpack:
            low, high, src = unpack.groups()
            regs[low], regs[high] = value(src) & 0xFFFF, value(src) >> 16
            continue
        dest, *args = [t.strip() for t in rest.split(",")]
        if op not in _OPS:
            raise ValueError(f"the emulator does not know {op!r}")
        regs[dest] = _OPS[op](*(value(a) for a in args))
    return {int(k[1:]): v for k, v in regs.items() if k.startswith("$") and int(k[1:]) not in operands}


def _fp16_bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float16).view(np.uint16).astype(np.int64)


def _byte_tables(entries: np.ndarray) -> tuple[int, int, int, int]:
    """What ``_decode._byte_tables`` builds from 8 fp16 values: low bytes of 0..3, of 4..7, high bytes of each."""
    bits = _fp16_bits(entries)
    pack = lambda parts: sum(int(p) << (8 * i) for i, p in enumerate(parts))  # noqa: E731
    return pack(bits[:4] & 255), pack(bits[4:] & 255), pack(bits[:4] >> 8), pack(bits[4:] >> 8)


@pytest.mark.parametrize("dim", [64, 128])
def test_prmt_4bit_program_decodes_every_code_of_every_byte(dim) -> None:
    table = tq.lloyd_max_codebook(dim, 4).centroids_tensor().numpy().astype(np.float16)
    assert np.array_equal(table[::-1], -table)  # the symmetric codebook the program assumes
    lo0, lo1, hi0, hi1 = _byte_tables(table[8:])
    expected = _fp16_bits(table)
    rng = np.random.default_rng(0)
    words = [sum(((c + 3 * i) % 256) << (8 * i) for i in range(4)) for c in range(256)]  # each byte value 4x
    words += [int(w) for w in rng.integers(0, 2 ** 32, size=500, dtype=np.uint64)]
    for word in words:
        out = run_ptx(_PRMT_DECODE4.value, {4: word, 5: lo0, 9: lo1, 13: hi0, 17: hi1})
        codes = [(word >> (4 * k)) & 15 for k in range(8)]  # byte i: even code k = 2i, odd code 2i + 1
        even, odd = codes[0::2], codes[1::2]
        got_even = [out[0] & 0xFFFF, out[0] >> 16, out[1] & 0xFFFF, out[1] >> 16]
        got_odd = [out[2] & 0xFFFF, out[2] >> 16, out[3] & 0xFFFF, out[3] >> 16]
        assert got_even == [expected[c] for c in even], hex(word)
        assert got_odd == [expected[c] for c in odd], hex(word)


@pytest.mark.parametrize("dim", [64, 128])
def test_prmt_3bit_program_decodes_all_8_codes_of_a_group_word(dim) -> None:
    table = tq.lloyd_max_codebook(dim, 3).centroids_tensor().numpy().astype(np.float16)
    tables = _byte_tables(table)
    expected = _fp16_bits(table)
    rng = np.random.default_rng(1)
    words = [sum(((c + k) % 8) << (3 * k) for k in range(8)) for c in range(8)]  # every code at every position
    words += [int(w) for w in rng.integers(0, 2 ** 24, size=1000)] + [0, 2 ** 24 - 1]
    words += [w | int(top) << 24 for w, top in zip(words[:200], rng.integers(1, 256, size=200))]  # bits 24-31 ignored
    for word in words:
        out = run_ptx(_PRMT_DECODE3.value, {8: word, 9: tables[0], 10: tables[1], 11: tables[2], 12: tables[3]})
        assert [out[k] for k in range(8)] == [expected[(word >> (3 * k)) & 7] for k in range(8)], hex(word)


def test_the_emulator_knows_prmt_sign_replication() -> None:
    assert _prmt(0x80_00_7F_01, 0, 0x3210) == 0x80_00_7F_01
    assert _prmt(0x80_00_7F_01, 0x44332211, 0x4567) == 0x11223344
    assert _prmt(0x00_00_80_7F, 0, 0x0098) == 0x7F7FFF00  # nibble 8 / 9: sign of byte 0 / 1; 0 / 0: byte 0
