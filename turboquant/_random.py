"""Seeded random streams, one per (seed, purpose, dimension), independent of torch's global RNG.

Every random object of the package (a Haar rotation, the signs and permutations of a randomized
Hadamard, QJL's Gaussian matrix S) draws from its own ``torch.Generator`` seeded with a hash of
``(seed, purpose, dim)``. So

* the same arguments give the same object on every machine and device (draws happen on the CPU);
* objects of different purposes or dimensions built from one seed are independent (TurboQuant_prod's
  Π and S, a cache's key and value rotations);
* nothing is correlated with data a user draws after ``torch.manual_seed(seed)``: the global stream is
  neither read nor advanced, and the hashed seed differs from ``seed`` itself.
"""

from __future__ import annotations

import hashlib

import torch

from ._validation import check_int

__all__ = ["stream_generator", "stream_seed"]


def stream_seed(seed: int, purpose: str, dim: int) -> int:
    """A 63-bit seed: the first 8 bytes of SHA-256("turboquant/<purpose>/d=<dim>/seed=<seed>"), top bit cleared."""
    seed = check_int(seed, "seed", low=0)
    digest = hashlib.sha256(f"turboquant/{purpose}/d={int(dim)}/seed={seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def stream_generator(seed: int, purpose: str, dim: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`stream_seed` (``seed``, ``purpose``, ``dim``)."""
    return torch.Generator(device="cpu").manual_seed(stream_seed(seed, purpose, dim))
