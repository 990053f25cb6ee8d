"""Fused TurboQuant_prod quantization (Algorithm 2): (b-1)-bit MSE codes, QJL sign bits and norms in one pass.

For a row x with u = x / ||x|| the kernel computes, without writing intermediates to memory:

    idx = nearest centroids of y = Pi u           (the MSE stage, as ``quantize.py``; b - 1 bits)
    r   = u - Pi^T c[idx]                         (residual in the input basis: sum_k c[idx_k-th codes] @ Pi rows)
    signs = [S r >= 0],   ||r||,   ||x||          (QJL, Definition 1: bit 1 for +1)

exactly the quantities ``TurboQuantProd.quantize`` stores (residual norm of the unit vector, signs
packed 1 bit per coordinate). ``Pi^T c[idx]`` is accumulated code position by code position with
``tl.dot`` (codes never leave registers); the sign bits come out of one ``tl.dot`` per bit position of
the packed byte.

Exactness: as for the MSE kernel, ``y`` uses fp16 operands (codes may differ within ~1e-3 of a
midpoint); ``S r`` uses fp16 ``r``, so a sign may differ where |S r| is within ~1e-3 * ||r|| of zero.
Rows of up to 256 coordinates (one tile); larger dims use the torch path.
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from ..backends import quantize_kernel
from ..packing import packed_size
from ._layout import (
    as_rows,
    check_device,
    group_geometry,
    num_groups,
    pow2_at_least,
    store_group_words,
)
from .quantize import (
    _as_numpy,
    _check_inputs,
    _codes,
    nearest_operands,
    stream_rotation,
    wgmma_unsupported,
)

_MAX_DIM = 256


@triton.jit
def _quantize_prod_kernel(
    x_ptr, rot_ptr, basis_ptr, cent_ptr, table_ptr, sketch_ptr,
    codes_ptr, signs_ptr, norms_ptr, residual_ptr,
    n_rows, dim, row_bytes, sign_bytes, groups_padded, sign_groups_padded,
    stride_x, stride_codes, stride_signs, lut_scale, lut_offset,
    MSE_BITS: tl.constexpr, BYTES_PER_GROUP: tl.constexpr, CODES_PER_GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_G1: tl.constexpr,
    LUT_MASK: tl.constexpr, HAS_MSE: tl.constexpr, NEAREST: tl.constexpr,
):
    """One tile of BLOCK_N rows. ``rot_ptr``/``sketch_ptr``: Pi and S in stream order
    (``stream_rotation``: [k, i, g] = M[g * cpg + k, i]); ``basis_ptr``: Pi rows in stream order
    transposed, [k, g, i] = Pi[g * cpg + k, i], so ``c_k @ basis[k]`` adds code position k's part of Pi^T c."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    d_offs = tl.arange(0, BLOCK_D)
    d_mask = d_offs < dim
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_x + d_offs[None, :],
                mask=row_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    norm = tl.sqrt(tl.sum(x * x, axis=1))
    unit = x * tl.where(norm > 0, 1.0 / tl.maximum(norm, 1e-30), 0.0)[:, None]
    tl.store(norms_ptr + rows, norm.to(norms_ptr.dtype.element_ty), mask=row_mask)

    residual = unit
    if HAS_MSE:
        unit16 = unit.to(tl.float16)
        g_offs = tl.arange(0, BLOCK_G)
        words = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.int32)
        approx = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        for k in tl.static_range(CODES_PER_GROUP):
            valid = g_offs * CODES_PER_GROUP + k < dim
            rot = tl.load(rot_ptr + k * dim * groups_padded + d_offs[:, None] * groups_padded + g_offs[None, :],
                          mask=d_mask[:, None], other=0.0)
            codes = _codes(tl.dot(unit16, rot), table_ptr, lut_scale, lut_offset, LUT_MASK, NEAREST, MSE_BITS)
            codes = tl.where(valid[None, :], codes, 0)
            words = words | (codes << (MSE_BITS * k))
            values = tl.where(valid[None, :], tl.load(cent_ptr + codes), 0.0)
            basis = tl.load(basis_ptr + k * groups_padded * dim + g_offs[:, None] * dim + d_offs[None, :],
                            mask=d_mask[None, :], other=0.0)
            approx = tl.dot(values, basis, approx)
        store_group_words(codes_ptr + rows.to(tl.int64) * stride_codes, row_mask, g_offs, row_bytes, words,
                          BYTES_PER_GROUP)
        residual = unit - approx
    tl.store(residual_ptr + rows, tl.sqrt(tl.sum(residual * residual, axis=1)).to(residual_ptr.dtype.element_ty),
             mask=row_mask)

    residual16 = residual.to(tl.float16)
    g1_offs = tl.arange(0, BLOCK_G1)
    sign_words = tl.zeros((BLOCK_N, BLOCK_G1), dtype=tl.int32)
    for k in tl.static_range(8):
        sketch = tl.load(sketch_ptr + k * dim * sign_groups_padded + d_offs[:, None] * sign_groups_padded
                         + g1_offs[None, :], mask=d_mask[:, None], other=0.0)
        positive = (tl.dot(residual16, sketch) >= 0) & (g1_offs * 8 + k < dim)[None, :]
        sign_words = sign_words | (positive.to(tl.int32) << k)
    store_group_words(signs_ptr + rows.to(tl.int64) * stride_signs, row_mask, g1_offs, sign_bytes, sign_words, 1)


def quantize_prod_triton(
    x: torch.Tensor,
    rotation_matrix: torch.Tensor | None,
    boundaries: torch.Tensor | np.ndarray | None,
    centroids: torch.Tensor | None,
    mse_bits: int,
    qjl_matrix: torch.Tensor,
    norms_dtype: torch.dtype = torch.float32,
    *,
    block_n: int = 32,
    num_warps: int = 4,
    nearest: str | None = None,
    kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TurboQuant_prod codes of ``x`` (..., dim), dim <= 256, in one kernel.

    Args:
        x: float16 / bfloat16 / float32 vectors of any norm.
        rotation_matrix, boundaries, centroids: the MSE stage (Pi with y = Pi x, the (b-1)-bit
            codebook's midpoints and centroids); all None when ``mse_bits == 0`` (b = 1: QJL alone).
        mse_bits: b - 1, in 0..4.
        qjl_matrix: S (dim, dim), the QJL stage's Gaussian matrix (``TurboQuantProd.qjl.matrix``).
        nearest: the tile kernel's nearest-centroid step, ``"table"`` (its default) or ``"tree"``
            (``quantize.nearest_operands``). The wgmma kernel has one step, the midpoint tree on fp16 pairs
            (:func:`turboquant.kernels.quantize_wgmma.quantize_prod_wgmma`).
        kernel: ``"tiles"`` (this module's kernel), ``"wgmma"``
            (:func:`turboquant.kernels.quantize_wgmma.quantize_prod_wgmma`, Gluon, Hopper only: float16 or bfloat16
            rows of 128 channels, ``mse_bits`` 1-3, a symmetric codebook; ``block_n``, ``num_warps`` unused) or
            ``"auto"``: ``"wgmma"`` where it serves (``turboquant.backends.quantize_kernel``), else ``"tiles"``;
            ``"tiles"`` as well when ``nearest`` is given (the tile kernel's option).

    Returns:
        ``(codes, signs, norms, residual_norms)``: codes uint8 (..., ceil(dim * mse_bits / 8)) (empty
        last dim when mse_bits == 0), signs uint8 (..., ceil(dim / 8)) with bit 1 for S r >= 0, ``||x||``
        and ``||r||`` of the unit vector, both in ``norms_dtype`` — the library's layout.
    """
    check_device(x.device)
    dim = _check_inputs(x, qjl_matrix)
    if dim > _MAX_DIM:
        raise ValueError(f"quantize_prod_triton handles dim <= {_MAX_DIM}, got {dim}")
    has_mse = mse_bits > 0
    if has_mse:
        _check_inputs(x, rotation_matrix)
        if len(_as_numpy(boundaries)) != 2 ** mse_bits - 1 or centroids.numel() != 2 ** mse_bits:
            raise ValueError(f"a {mse_bits}-bit MSE stage needs {2 ** mse_bits - 1} boundaries and "
                             f"{2 ** mse_bits} centroids")
    if nearest not in (None, "table", "tree"):
        raise ValueError(f"nearest must be None, 'table' or 'tree', got {nearest!r}")
    if kernel == "auto" and nearest is not None:
        kernel = "tiles"  # the tile kernel's own option was asked for
    if kernel == "wgmma" and nearest is not None:
        raise ValueError("the wgmma prod kernel has one nearest-centroid step (the midpoint tree on fp16 pairs); "
                         f"nearest is the tile kernel's option, got nearest={nearest!r}")
    if kernel != "tiles":
        reason = None if 1 <= mse_bits <= 3 else f"the wgmma prod kernel writes 1-3-bit MSE codes, not {mse_bits}"
        kernel = quantize_kernel(kernel, None, reason or wgmma_unsupported(x, mse_bits)).chosen  # raises if asked
    if kernel == "wgmma":
        from .quantize_wgmma import quantize_prod_wgmma

        return quantize_prod_wgmma(x, rotation_matrix, _as_numpy(boundaries), centroids, mse_bits, qjl_matrix,
                                   norms_dtype)
    nearest = nearest or "table"
    rows, lead_shape = as_rows(x)
    n_rows = rows.shape[0]
    row_bytes = packed_size(dim, mse_bits) if has_mse else 0
    sign_bytes = packed_size(dim, 1)
    codes = torch.empty((n_rows, row_bytes), dtype=torch.uint8, device=x.device)
    signs = torch.empty((n_rows, sign_bytes), dtype=torch.uint8, device=x.device)
    norms = torch.empty((n_rows,), dtype=norms_dtype, device=x.device)
    residual_norms = torch.empty((n_rows,), dtype=norms_dtype, device=x.device)
    if n_rows:
        sign_groups = pow2_at_least(num_groups(dim, 1))
        sketch = stream_rotation(qjl_matrix, 1, sign_groups)
        if has_mse:
            bytes_per_group, codes_per_group = group_geometry(mse_bits)
            groups = pow2_at_least(num_groups(dim, mse_bits))
            rot = stream_rotation(rotation_matrix, mse_bits, groups)
            basis = rot.transpose(1, 2).contiguous().float()
            table, lut_scale, lut_offset = nearest_operands(boundaries, nearest, x.device)
            cent = centroids.to(device=x.device, dtype=torch.float32).contiguous()
        else:  # QJL alone: the MSE operands are never read
            bytes_per_group, codes_per_group, groups = 1, 1, 16
            rot = basis = cent = sketch
            table, lut_scale, lut_offset = torch.zeros(1, dtype=torch.int32, device=x.device), 0.0, 0.0
        _quantize_prod_kernel[(triton.cdiv(n_rows, block_n),)](
            rows, rot, basis, cent, table, sketch, codes, signs, norms, residual_norms,
            n_rows, dim, row_bytes, sign_bytes, groups, sign_groups,
            rows.stride(0), codes.stride(0), signs.stride(0), lut_scale, lut_offset,
            MSE_BITS=max(mse_bits, 1), BYTES_PER_GROUP=bytes_per_group, CODES_PER_GROUP=codes_per_group,
            BLOCK_N=block_n, BLOCK_D=pow2_at_least(dim), BLOCK_G=groups, BLOCK_G1=sign_groups,
            LUT_MASK=table.numel() - 1, HAS_MSE=has_mse, NEAREST=nearest,
            num_warps=num_warps,
        )
    return (codes.reshape(*lead_shape, row_bytes), signs.reshape(*lead_shape, sign_bytes),
            norms.reshape(lead_shape), residual_norms.reshape(lead_shape))


def quantize_prod_reference(
    x: torch.Tensor, rotation_matrix: torch.Tensor | None, boundaries, centroids: torch.Tensor | None,
    mse_bits: int, qjl_matrix: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Float64 Algorithm 2 with the library's packing: codes, signs, norms, residual_norms, plus the
    rotated unit vector ``y`` and the sketch ``S r`` so tests can tell rounding ties from errors."""
    from turboquant.packing import pack_codes

    xf = x.to(torch.float64).reshape(-1, x.shape[-1])
    norms = torch.linalg.vector_norm(xf, dim=-1)
    unit = xf / torch.where(norms > 0, norms, 1.0)[:, None]
    out = {"norms": norms}
    residual = unit
    if mse_bits:
        pi = rotation_matrix.to(torch.float64)
        out["y"] = unit @ pi.T
        idx = torch.bucketize(out["y"], torch.as_tensor(_as_numpy(boundaries), device=x.device))
        out["codes"] = pack_codes(idx, mse_bits)
        residual = unit - centroids.to(torch.float64)[idx] @ pi
    out["sketch"] = residual @ qjl_matrix.to(torch.float64).T
    out["signs"] = pack_codes((out["sketch"] >= 0).to(torch.uint8), 1)
    out["residual_norms"] = torch.linalg.vector_norm(residual, dim=-1)
    return out
