"""library op: the quantize and scores kernels against the library's torch path on the same GPU (what backend
dispatch replaces), ``python run.py experiment=kernels 'experiment.ops=[library]'``."""
from __future__ import annotations

from typing import Any

import torch

from .utils import Bench, Row

__all__ = ["bench_library_paths"]


def bench_library_paths(bench: Bench, sizes: Any, variants: dict[str, dict]) -> list[Row]:
    """The kernels against the library's torch path on the same GPU (what backend dispatch replaces)."""
    from turboquant.kernels.quantize import quantize_mse_triton
    from turboquant.kernels.scores import mse_scores_triton
    from turboquant.quantizers import TurboQuantMSE

    n, dim, bits = int(sizes.vectors), int(sizes.dim), int(sizes.bits)
    quantizer = TurboQuantMSE(dim, bits, rotation="haar", seed=0, device=bench.device, backend="torch")
    rotation, boundaries = quantizer.rotation.matrix(), quantizer.codebook.boundaries
    x = torch.randn(n, dim, device=bench.device, dtype=torch.float16)
    qv = quantizer.quantize(x)
    moved = x.numel() * 2 + n * (qv.codes.shape[-1] + 4)
    t_torch = bench.timer(lambda: quantizer.quantize(x))
    t_kernel = bench.timer(lambda: quantize_mse_triton(x, rotation, boundaries, bits))
    rows = [Row("quantize vs library", f"b={bits} float16, float32 norms", f"{n}x{dim}", t_kernel, moved,
                bench.floor_us(moved), "TurboQuantMSE.quantize (torch)", t_torch, "")]
    queries = torch.randn(32, dim, device=bench.device)
    t_torch = bench.timer(lambda: quantizer.inner_product(queries, qv))
    centroids = quantizer.codebook.centroids_tensor(bench.device)
    t_kernel = bench.timer(lambda: mse_scores_triton(quantizer.rotation.apply(queries)[None], qv.codes[None],
                                                     qv.norms[None], centroids, bits))
    moved = qv.codes.numel() + qv.norms.numel() * 4 + 32 * n * 4
    rows.append(Row("scores vs library", f"b={bits}, 32 queries", f"{n}x{dim}", t_kernel, moved,
                    bench.floor_us(moved), "TurboQuantMSE.inner_product (torch)", t_torch, ""))
    return rows
