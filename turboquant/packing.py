"""Bit packing of b-bit codes into bytes, with no wasted bits beyond the last byte of a vector.

Layout: the n codes of a vector form one little-endian bit stream, code j occupying stream bits
[j·b, (j+1)·b), and stream bit k living in byte k // 8 at bit position k % 8. A vector of n codes takes
⌈n·b/8⌉ bytes, so 3-bit codes really cost 3 bits a coordinate. For b = 4 this is two codes a byte, low
nibble first; for b = 2 four codes a byte; for b = 3 every 8 codes fill exactly 3 bytes.

Both directions work on groups of 8 codes, which always fill exactly b bytes. When b divides 8 the
codes of a byte are OR-ed in place; otherwise a group's 8b bits are assembled in (or split from) one
int64 word. Either way the work is a handful of vectorised shifts over strided views.
"""

from __future__ import annotations

import torch

from ._validation import check_int

__all__ = ["pack_codes", "unpack_codes", "packed_size"]

_MAX_BITS = 8


def _check_bits(bits: int) -> int:
    return check_int(bits, "bits", 1, _MAX_BITS)


def packed_size(n: int, bits: int) -> int:
    """Bytes taken by n codes of ``bits`` bits: ⌈n·b/8⌉."""
    return (check_int(n, "n", low=0) * _check_bits(bits) + 7) // 8


def _pad_to_groups(x: torch.Tensor, length: int) -> torch.Tensor:
    if x.shape[-1] == length:
        return x
    padded = torch.zeros(*x.shape[:-1], length, dtype=x.dtype, device=x.device)
    padded[..., : x.shape[-1]] = x
    return padded


def pack_codes(codes: torch.Tensor, bits: int, *, check_range: bool = True) -> torch.Tensor:
    """Pack integer codes (…, n) with values in [0, 2^b) into uint8 (…, ⌈n·b/8⌉).

    ``check_range`` raises on a code outside [0, 2^b); it reads the codes' min and max back to the host, a device
    synchronisation on a GPU. Encoders whose codes lie in range by construction (``bucketize`` over 2^b - 1
    boundaries, sign bits, clamped levels) pass ``check_range=False``: a KV cache packs codes at every decode step,
    where one synchronisation per layer costs more than the step's arithmetic on a shared GPU."""
    bits = _check_bits(bits)
    if not isinstance(codes, torch.Tensor):
        raise ValueError(f"codes must be a torch.Tensor, got {type(codes).__name__}")
    if codes.dtype.is_floating_point or codes.dtype == torch.bool or codes.dtype.is_complex:
        raise ValueError(f"codes must be an integer tensor, got {codes.dtype}")
    if codes.ndim == 0:
        raise ValueError("codes must have at least one dimension")
    n = codes.shape[-1]
    if check_range and codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 1 << bits):
        raise ValueError(f"codes must lie in [0, {1 << bits}) for {bits}-bit packing")
    groups = (n + 7) // 8
    codes = _pad_to_groups(codes, groups * 8)
    if 8 % bits == 0:  # whole codes per byte: OR shifted strided views straight into uint8
        per_byte = 8 // bits
        codes = codes.to(torch.uint8)
        packed = codes[..., 0::per_byte].clone()
        for j in range(1, per_byte):
            packed |= codes[..., j::per_byte] << (j * bits)
    else:  # each group of 8 codes is one 8b-bit word, written out as b bytes
        words = codes[..., 0::8].to(torch.int64, copy=True)
        for j in range(1, 8):
            words |= codes[..., j::8].to(torch.int64) << (j * bits)
        packed = torch.empty(*codes.shape[:-1], groups * bits, dtype=torch.uint8, device=codes.device)
        for i in range(bits):
            packed[..., i::bits] = ((words >> (8 * i)) & 0xFF).to(torch.uint8)
    return packed[..., : packed_size(n, bits)].contiguous()


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: uint8 (…, ⌈n·b/8⌉) → uint8 codes (…, n)."""
    bits = _check_bits(bits)
    n = check_int(n, "n", low=0)
    if not isinstance(packed, torch.Tensor):
        raise ValueError(f"packed codes must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed codes must be uint8, got {packed.dtype}")
    if packed.ndim == 0 or packed.shape[-1] != packed_size(n, bits):
        raise ValueError(f"packed codes for n={n} at {bits} bits must have last dimension "
                         f"{packed_size(n, bits)}, got shape {tuple(packed.shape)}")
    groups = (n + 7) // 8
    packed = _pad_to_groups(packed, groups * bits)
    codes = torch.empty(*packed.shape[:-1], groups * 8, dtype=torch.uint8, device=packed.device)
    mask = (1 << bits) - 1
    if 8 % bits == 0:
        per_byte = 8 // bits
        for j in range(per_byte):
            codes[..., j::per_byte] = (packed >> (j * bits)) & mask
    else:
        words = packed[..., 0::bits].to(torch.int64)
        for i in range(1, bits):
            words |= packed[..., i::bits].to(torch.int64) << (8 * i)
        for j in range(8):
            codes[..., j::8] = ((words >> (j * bits)) & mask).to(torch.uint8)
    return codes[..., :n]
