"""Recall@1@k, the nearest-neighbour metric of the paper's Fig. 5 (arXiv v1 §4.4).

For each query, let ``t`` be the id of its true top-1 inner-product neighbour (from exact search). The
quantized index returns its own top-k ids; ``recall@1@k`` is the fraction of queries whose ``t`` is among
those ``k`` ids. It is non-decreasing in ``k`` and equals 1 for exact search (up to ties).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["recall_at_1_at_k", "powers_of_two_up_to"]


def recall_at_1_at_k(true_top1: np.ndarray, found_ids: np.ndarray, ks: Iterable[int]) -> dict[int, float]:
    """Return ``{k: recall@1@k}`` for every ``k`` in ``ks``.

    Args:
        true_top1: (n_queries,) ids of the exact top-1 neighbours.
        found_ids: (n_queries, K) ids returned by the index, best first, with ``K >= max(ks)``.
        ks: cut-offs, each in ``1..K``.
    """
    true_top1 = np.asarray(true_top1)
    found_ids = np.asarray(found_ids)
    if true_top1.ndim != 1:
        raise ValueError(f"true_top1 must be 1-D (n_queries,), got shape {true_top1.shape}")
    if found_ids.ndim != 2 or found_ids.shape[0] != true_top1.shape[0]:
        raise ValueError(
            f"found_ids must be (n_queries={true_top1.shape[0]}, K), got shape {found_ids.shape}"
        )
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1 or max(ks) > found_ids.shape[1]:
        raise ValueError(f"every k must lie in 1..{found_ids.shape[1]} (columns of found_ids), got {ks}")
    hit_rank = found_ids == true_top1[:, None]  # (n_queries, K): True where the true neighbour sits
    first_hit = np.where(hit_rank.any(axis=1), hit_rank.argmax(axis=1), found_ids.shape[1])
    return {k: float(np.mean(first_hit < k)) for k in ks}


def powers_of_two_up_to(k_max: int) -> list[int]:
    """``[1, 2, 4, ..., k_max]`` — the paper's k axis (1 … 64); ``k_max`` must be a power of two."""
    if k_max < 1 or k_max & (k_max - 1):
        raise ValueError(f"k_max must be a power of two >= 1, got {k_max}")
    return [1 << i for i in range(k_max.bit_length())]
