"""Random rotations Π of R^d: the first step of TurboQuant (paper, Algorithm 1, line 2).

Two kinds behind one interface (:class:`Rotation`):

* :class:`HaarRotation`: Π uniform on the orthogonal group, from the QR factorisation of a d×d matrix
  of i.i.d. N(0, 1) entries with the signs of R's diagonal moved into Q (without that fix, QR's sign
  convention biases Q away from Haar). This is what the paper's theorems assume; it costs O(d²) per
  vector and O(d³) once to build.
* :class:`RandomizedHadamard`: the usual fast substitute, Π = H·D with D a random ±1 diagonal and H
  the normalised Walsh-Hadamard matrix, applied by the fast transform in O(d log d). For a d that is
  not a power of two, Π is a product of three rounds, each a random permutation, random signs and a
  Hadamard transform of the leading p = 2^⌊log₂ d⌋ coordinates; every factor is orthogonal, so Π is an
  exact orthogonal map of R^d (nothing is padded, so no extra coordinates are stored), and three rounds
  let every output coordinate depend on every input coordinate. It is not Haar: its coordinates are
  only approximately distributed as Lemma 1 says.

Both are deterministic functions of (dim, seed): the random draws happen on the CPU, from a generator
seeded with a hash of (seed, kind, dim) (:mod:`turboquant._random`; never torch's global stream), and are
then moved to the target device, so CPU and GPU use the same Π.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod

import torch

from ._random import stream_generator
from ._validation import check_choice, check_device, check_int, check_vectors

__all__ = ["Rotation", "HaarRotation", "RandomizedHadamard", "make_rotation", "fast_walsh_hadamard",
           "ROTATION_KINDS"]

ROTATION_KINDS = ("haar", "hadamard")


class Rotation(ABC):
    """An orthogonal map Π of R^d applied over the last dimension of any tensor."""

    kind: str

    def __init__(self, dim: int, seed: int = 0, device: torch.device | str | None = None):
        self.dim = check_int(dim, "dim", low=2)
        self.seed = check_int(seed, "seed", low=0)
        self.device = check_device(device)

    def _check_input(self, x: torch.Tensor) -> None:
        check_vectors(x, "x", self.dim)

    @abstractmethod
    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """y = Πx for every vector in the last dimension of x (computed in float32 or wider)."""

    @abstractmethod
    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """x = Πᵀy."""

    @abstractmethod
    def to(self, device: torch.device | str) -> "Rotation":
        """The same rotation, with its state on ``device``."""

    def matrix(self) -> torch.Tensor:
        """Π as a dense (d, d) float32 matrix, so that ``apply(x) == x @ matrix().T``."""
        eye = torch.eye(self.dim, dtype=torch.float32, device=self.device)
        return self.apply(eye).T.contiguous()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, seed={self.seed}, device={str(self.device)!r})"


def _as_float(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


class HaarRotation(Rotation):
    """Π drawn from the Haar measure on O(d): QR of an i.i.d. Gaussian matrix with the sign fix."""

    kind = "haar"

    def __init__(self, dim: int, seed: int = 0, device: torch.device | str | None = None,
                 _matrix: torch.Tensor | None = None):
        super().__init__(dim, seed, device)
        if _matrix is None:
            gaussian = torch.randn(self.dim, self.dim, generator=stream_generator(self.seed, self.kind, self.dim),
                                   dtype=torch.float64)
            q, r = torch.linalg.qr(gaussian)
            q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
            _matrix = q.to(torch.float32)
        self._pi = _matrix.to(self.device)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        x = _as_float(x)
        return x @ self._pi.to(x.dtype).T

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        self._check_input(y)
        y = _as_float(y)
        return y @ self._pi.to(y.dtype)

    def matrix(self) -> torch.Tensor:
        return self._pi

    def to(self, device: torch.device | str) -> "HaarRotation":
        return HaarRotation(self.dim, self.seed, device, _matrix=self._pi)


_HADAMARD_FACTOR = 64  # largest dense Hadamard block used by the Kronecker factorisation


@functools.lru_cache(maxsize=None)
def _sylvester_hadamard(size: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The unnormalised ±1 Sylvester-Hadamard matrix H_size (size a power of two), made once per device and dtype:
    a copy from host memory at every transform would make each call wait for the GPU (a KV cache transforms every
    decode step's token)."""
    with torch.inference_mode(False):  # a plain tensor even when first made under inference mode
        h = torch.ones(1, 1)
        while h.shape[0] < size:
            h = torch.cat((torch.cat((h, h), dim=1), torch.cat((h, -h), dim=1)), dim=0)
        return h.to(device=device, dtype=dtype)


def fast_walsh_hadamard(x: torch.Tensor) -> torch.Tensor:
    """Normalised Walsh-Hadamard transform H_p x / √p over the last dimension (p a power of two).

    Uses H_p = H_(f1) ⊗ H_(f2) ⊗ … with every f_i ≤ 64: viewing x as an (f1, f2, …) array, each
    factor is one small dense matrix product along its axis, so the cost is O(p · Σ f_i) multiply-adds
    in a few BLAS calls, i.e. O(p log p) up to the block size, and fast on CPUs and GPUs alike.
    H_p/√p is symmetric and orthogonal, so the transform is its own inverse.
    """
    p = check_vectors(x, "x").shape[-1]
    if p < 1 or p & (p - 1):
        raise ValueError(f"the Walsh-Hadamard transform needs a power-of-two length, got {p}")
    factors = []
    remaining = p
    while remaining > 1:
        factors.append(min(remaining, _HADAMARD_FACTOR))
        remaining //= factors[-1]
    lead = x.shape[:-1]
    y = x.reshape(-1, *factors) if factors else x.reshape(-1, 1)
    for axis, size in enumerate(factors, start=1):
        h = _sylvester_hadamard(size, y.device, y.dtype)
        y = (y.movedim(axis, -1) @ h).movedim(-1, axis)
    return (y.reshape(*lead, p) * (1.0 / math.sqrt(p)))


class RandomizedHadamard(Rotation):
    """Π = ∏_rounds H_p · D_k · P_k (signs D, permutations P, H on the leading p = 2^⌊log₂ d⌋ coords).

    One round (no permutation) when d is a power of two, three otherwise (see the module docstring).
    """

    kind = "hadamard"

    def __init__(self, dim: int, seed: int = 0, device: torch.device | str | None = None):
        super().__init__(dim, seed, device)
        self.block = 1 << (self.dim.bit_length() - 1)
        self.rounds = 1 if self.block == self.dim else 3
        generator = stream_generator(self.seed, self.kind, self.dim)
        signs, perms = [], []
        for _ in range(self.rounds):
            signs.append(torch.randint(0, 2, (self.dim,), generator=generator).float() * 2 - 1)
            if self.rounds == 1:
                perms.append(torch.arange(self.dim))
            else:
                perms.append(torch.randperm(self.dim, generator=generator))
        self._signs = torch.stack(signs).to(self.device)          # (rounds, d)
        self._perms = torch.stack(perms).to(self.device)          # (rounds, d): round input index order
        self._inverse_perms = torch.argsort(self._perms, dim=1)

    @property
    def signs(self) -> torch.Tensor:
        """(rounds, d) ±1 diagonals D_k (for kernels that implement the transform themselves)."""
        return self._signs

    @property
    def permutations(self) -> torch.Tensor:
        """(rounds, d) permutations P_k: round k reads input coordinate perms[k, i] into slot i."""
        return self._perms

    def _hadamard_block(self, x: torch.Tensor) -> torch.Tensor:
        if self.block == self.dim:
            return fast_walsh_hadamard(x)
        head = fast_walsh_hadamard(x[..., : self.block])
        return torch.cat((head, x[..., self.block:]), dim=-1)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        y = _as_float(x)
        for k in range(self.rounds):
            if self.rounds > 1:
                y = y.index_select(-1, self._perms[k])
            y = self._hadamard_block(y * self._signs[k].to(y.dtype))
        return y

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        self._check_input(y)
        x = _as_float(y)
        for k in reversed(range(self.rounds)):
            x = self._hadamard_block(x) * self._signs[k].to(x.dtype)
            if self.rounds > 1:
                x = x.index_select(-1, self._inverse_perms[k])
        return x

    def to(self, device: torch.device | str) -> "RandomizedHadamard":
        return RandomizedHadamard(self.dim, self.seed, device)


def make_rotation(kind: str, dim: int, seed: int = 0, device: torch.device | str | None = None) -> Rotation:
    """Build a rotation by name: ``"haar"`` (the paper's) or ``"hadamard"`` (the fast substitute)."""
    rotation = {"haar": HaarRotation, "hadamard": RandomizedHadamard}[check_choice(kind, "rotation", ROTATION_KINDS)]
    return rotation(dim, seed, device)
