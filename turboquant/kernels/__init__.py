"""Triton kernels for TurboQuant, each beside its exact PyTorch reference.

=====================  =========================================================================
op                     entry point (module)
=====================  =========================================================================
quantize (Alg. 1)      :func:`quantize_mse_triton` (``quantize``): vectors -> packed codes + norms
quantize (Alg. 2)      :func:`quantize_prod_triton` (``quantize_prod``): (b-1)-bit codes, QJL sign
                       bits, norms and residual norms (dim <= 256)
scores                 :func:`mse_scores_triton` (``scores``): <q, k~> for packed keys, q rotated
decode attention       :func:`decode_attention_triton` (``decode_attention``): flash-decoding over a
                       packed K/V cache, GQA, split-KV, variable lengths;
                       :func:`decode_attention_groups_triton` for any TurboQuant cache layout: outlier
                       channel split (two channel groups, per-head channel order), TurboQuant_prod keys
=====================  =========================================================================

Each entry point's ``kernel`` keyword chooses between the portable Triton kernel (``"tiles"``: every layout, the
interpreter too) and a GPU-only Gluon kernel for the layouts it reads, whose inner loop keeps the data in
registers: ``_mma`` + ``decode_attention.mma`` / ``scores_mma`` (decoded codes as ``mma.sync`` register operands,
head_dim 128, 3- and 4-bit codes) and ``quantize_wgmma`` (Hopper's warpgroup MMA with the rotation in shared memory,
codes packed from the accumulator; fp16 or bf16 rows of 128). ``"auto"`` takes the Gluon kernel where
``turboquant.backends`` finds it serves.

Every kernel reads and writes the library's packed layout (``turboquant.pack_codes``), so the
quantizer classes can hand their tensors to a kernel without conversion. Importing this package does
not import Triton; the entry points do, on first use. :func:`triton_available` (``turboquant.backends``, the
capability table) says whether a kernel can run on a device (a CUDA device with Triton installed, or any device
under ``TRITON_INTERPRET=1``, Triton's CPU interpreter, which the tests use).
"""
from __future__ import annotations

import importlib

from ..backends import triton_available

__all__ = [
    "decode_attention_groups_triton",
    "decode_attention_triton",
    "mse_scores_triton",
    "quantize_mse_triton",
    "quantize_prod_triton",
    "triton_available",
]


_ENTRY_POINTS = {
    "quantize_mse_triton": "quantize",
    "quantize_prod_triton": "quantize_prod",
    "mse_scores_triton": "scores",
    "decode_attention_triton": "decode_attention",
    "decode_attention_groups_triton": "decode_attention",
}


def __getattr__(name: str):
    """Import an entry point's module (and Triton) on first access."""
    if name in _ENTRY_POINTS:
        module = importlib.import_module(f".{_ENTRY_POINTS[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
