"""Bit layout shared by the Triton kernels, and the device-side helpers that read and write it.

The kernels read and write the library's packed layout unchanged (``turboquant.packing``): a
little-endian bit stream, code ``j`` of a vector occupying bits ``[j*b, (j+1)*b)`` of its row, the
row padded to whole bytes. No conversion is needed between the torch path and the kernels.

The kernels view a row as ``n_groups`` *groups*: the smallest run of whole bytes that holds whole
codes (``lcm(b, 8)`` bits).

====  =================  =================
 b    bytes per group    codes per group
====  =================  =================
 1    1                  8
 2    1                  4
 3    3                  8
 4    1                  2
====  =================  =================

Code ``k`` of group ``g`` is coordinate ``g * codes_per_group + k`` and sits at bit ``k * b`` of the
group's little-endian word. A kernel loads a tile of words ``(rows, groups)`` (16-byte loads for
b = 1, 2, 4, one byte per group) and takes code ``k`` of every group with one shift and mask: a
``(rows, groups)`` tile holding coordinates ``g * codes_per_group + k``. Rather than shuffling codes
back into coordinate order in registers, the kernels multiply that tile with the matching
coordinates of the other operand, which the host lays out in *stream order* once (position
``k * groups + g`` holds coordinate ``g * codes_per_group + k``: ``scores.stream_queries``,
``quantize.stream_rotation``, and for decode attention the columns of ``CacheFormat.query_map``, which
also reads QJL sign bits as 1-bit codes). Only the generic value path of decode attention (widths other
than 4 bits) builds a full stream-order tile (``words_to_stream_codes``).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..backends import KERNEL_BITS, triton_unavailable


def check_device(device: torch.device) -> None:
    """ValueError unless a kernel can run on ``device`` (CUDA, or any device under TRITON_INTERPRET=1)."""
    reason = triton_unavailable(device)
    if reason is not None:
        raise ValueError(f"the Triton kernels cannot take these tensors: {reason}")


def group_geometry(bits: int) -> tuple[int, int]:
    """Return ``(bytes_per_group, codes_per_group)`` for ``bits``-bit codes (``lcm(bits, 8)`` bits)."""
    if bits not in KERNEL_BITS:
        raise ValueError(f"the Triton kernels support bits in {KERNEL_BITS}, got {bits}")
    group_bits = math.lcm(bits, 8)
    return group_bits // 8, group_bits // bits


def num_groups(dim: int, bits: int) -> int:
    """Groups per row (the last may be partial)."""
    return -(-dim // group_geometry(bits)[1])


def as_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Size]:
    """``x`` (..., dim) as a row-major (rows, dim) matrix (a view where the last axis is contiguous) and its leading
    shape, which the kernels' outputs are reshaped back to."""
    rows = x.reshape(-1, x.shape[-1])
    return (rows if rows.stride(-1) == 1 else rows.contiguous()), x.shape[:-1]


SHARED_PER_SM = 228 * 1024  # shared memory of an SM on sm_90 (where torch does not report it)
SHARED_RESERVE_PER_BLOCK = 1024  # what the CUDA runtime keeps of it for each resident block


def blocks_fitting_shared_memory(device: torch.device, block_bytes: int) -> int:
    """How many blocks taking ``block_bytes`` of shared memory each fit one SM of ``device`` at once (the runtime's
    reserve per block included; off CUDA, an sm_90 SM's :data:`SHARED_PER_SM`)."""
    per_sm = (getattr(torch.cuda.get_device_properties(device), "shared_memory_per_multiprocessor", SHARED_PER_SM)
              if device.type == "cuda" else SHARED_PER_SM)
    return per_sm // (block_bytes + SHARED_RESERVE_PER_BLOCK)


def pow2_at_least(n: int, floor: int = 16) -> int:
    """Smallest power of two ``>= max(n, floor)`` (tile sizes; ``tl.dot`` needs every side >= 16)."""
    return max(floor, triton.next_power_of_2(n))


@triton.jit
def stream_coordinates(g_offs, CODES_PER_GROUP: tl.constexpr):
    """Coordinate of each stream-order position for groups ``g_offs``: shape (CODES_PER_GROUP * len(g_offs),)."""
    k = tl.arange(0, CODES_PER_GROUP)
    coords = g_offs[None, :] * CODES_PER_GROUP + k[:, None]
    return tl.reshape(coords, (CODES_PER_GROUP * g_offs.shape[0],))


@triton.jit
def load_group_words(row_ptrs, row_mask, g_offs, row_bytes, BYTES_PER_GROUP: tl.constexpr,
                     GROUPS_ACROSS_THREADS: tl.constexpr = False):
    """Little-endian words of groups ``g_offs`` of the rows at ``row_ptrs``: int32 (rows, groups).

    Bytes past ``row_bytes`` (and masked rows) read as 0. ``GROUPS_ACROSS_THREADS`` loads the bytes as a
    (groups, rows) tile and transposes it, which puts groups across a warp's threads: with several bytes per group
    no dimension of the addresses is contiguous, and Triton's layout for a (rows, groups) load then gives each
    thread a whole row, so a tile decoded from it in channel order reaches shared memory one 16-bit value per
    store (``benchmarks/NOTES.md``, session 9).
    """
    word = tl.zeros((row_ptrs.shape[0], g_offs.shape[0]), dtype=tl.int32)
    for i in tl.static_range(BYTES_PER_GROUP):
        col = g_offs * BYTES_PER_GROUP + i
        if GROUPS_ACROSS_THREADS:
            mask = row_mask[None, :] & (col < row_bytes)[:, None]
            byte = tl.trans(tl.load(row_ptrs[None, :] + col[:, None], mask=mask, other=0))
        else:
            mask = row_mask[:, None] & (col < row_bytes)[None, :]
            byte = tl.load(row_ptrs[:, None] + col[None, :], mask=mask, other=0)
        word = word | (byte.to(tl.int32) << (8 * i))
    return word


@triton.jit
def words_to_stream_codes(word, BITS: tl.constexpr, CODES_PER_GROUP: tl.constexpr):
    """Split words (rows, groups) into codes in stream order: int32 (rows, CODES_PER_GROUP * groups)."""
    shifts = tl.arange(0, CODES_PER_GROUP) * BITS
    codes = (word[:, None, :] >> shifts[None, :, None]) & ((1 << BITS) - 1)
    return tl.reshape(codes, (word.shape[0], CODES_PER_GROUP * word.shape[1]))


@triton.jit
def store_group_words(row_ptrs, row_mask, g_offs, row_bytes, word, BYTES_PER_GROUP: tl.constexpr):
    """Write words (rows, groups) as little-endian bytes; bytes past ``row_bytes`` are not written."""
    for i in tl.static_range(BYTES_PER_GROUP):
        col = g_offs * BYTES_PER_GROUP + i
        mask = row_mask[:, None] & (col < row_bytes)[None, :]
        tl.store(row_ptrs[:, None] + col[None, :], ((word >> (8 * i)) & 255).to(tl.uint8), mask=mask)
