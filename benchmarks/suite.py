"""The kernel benchmark suite: one function per op, each ``(bench, sizes, variants) -> list[Row]``.

``python run.py experiment=kernels`` (:mod:`experiments.kernels`) runs the ops of ``experiment.ops`` with the sizes
and variants of ``configs/experiment/kernels.yaml`` and stores one result unit per op.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .bench_decode import bench_decode
from .bench_decode_step import bench_decode_step
from .bench_library import bench_library_paths
from .bench_quantize import bench_quantize, bench_quantize_prod
from .bench_scores import bench_scores
from .utils import Bench, Row

__all__ = ["OPS", "select_ops"]

OPS: dict[str, Callable[[Bench, Any, dict[str, dict]], list[Row]]] = {
    "quantize": bench_quantize, "library": bench_library_paths, "prod": bench_quantize_prod,
    "scores": bench_scores, "decode": bench_decode, "decode_step": bench_decode_step,
}


def select_ops(names: Sequence[str]) -> dict[str, Callable[[Bench, Any, dict[str, dict]], list[Row]]]:
    """The benchmark function of each op in ``names``, in order; ValueError naming the unknown ones first."""
    unknown = sorted(set(names) - set(OPS))
    if unknown:
        raise ValueError(f"unknown kernel ops {unknown}; available: {sorted(OPS)}")
    return {name: OPS[name] for name in names}
