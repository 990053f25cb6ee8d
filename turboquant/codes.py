"""The packed codes a quantizer stores (:class:`QuantizedVectors`): one type for every layer that keeps, moves or reads
them (the quantizers, the KV cache's channel groups, the ANN index, the Triton kernels). It imports nothing of the
package, so the kernels can take it without importing the quantizers."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True, eq=False)
class QuantizedVectors:
    """What a quantizer stores for a batch of vectors of leading shape ``shape``.

    Attributes:
        codes: uint8 (*shape, ⌈d·mse_bits/8⌉), packed TurboQuant_mse indices (empty for pure QJL).
        norms: float32 (*shape), ‖x‖ (float16 where a code store keeps half-precision norms, as the KV cache
            does, through a quantizer's ``stored``; every decoder and scorer widens them).
        qjl_signs: uint8 (*shape, ⌈d/8⌉), packed sign bits of S·r (TurboQuant_prod) or S·x (QJL), else None.
        residual_norms: float32 or float16 (*shape), ‖r‖ of the unit vector's residual (TurboQuant_prod), else
            None.
        dim: d.  bits: total bits per coordinate of the codes (mse_bits + 1 with QJL).
        mse_bits: bits of the MSE stage (0 for pure QJL).
        signature: the settings of the quantizer that made these codes; decoding with other settings
            is refused.
        dtype: the dtype of the input, returned by ``dequantize``.
    """

    codes: torch.Tensor
    norms: torch.Tensor
    qjl_signs: torch.Tensor | None
    residual_norms: torch.Tensor | None
    dim: int
    bits: int
    mse_bits: int
    signature: str
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        """Leading batch shape: one entry per stored vector."""
        return self.norms.shape

    @property
    def device(self) -> torch.device:
        return self.norms.device

    def __len__(self) -> int:
        return self.shape[0] if len(self.shape) else 1

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(t for t in (self.codes, self.norms, self.qjl_signs, self.residual_norms) if t is not None)

    @property
    def nbytes(self) -> int:
        """Bytes really stored: packed codes, sign bits and the float norms."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    @property
    def bits_per_coordinate(self) -> float:
        """nbytes · 8 / (number of vectors · d): the true rate, norms and byte padding included."""
        count = self.norms.numel()
        return self.nbytes * 8 / (count * self.dim) if count else float("nan")

    def __getitem__(self, index) -> "QuantizedVectors":
        """Index or slice the leading batch dimensions (like indexing ``x[index]``)."""
        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[index]
        norms = self.norms[index]
        if norms.ndim == 0:
            raise IndexError("indexing must keep a batch dimension; use a slice (e.g. qv[i:i+1])")
        return replace(self, codes=pick(self.codes), norms=norms, qjl_signs=pick(self.qjl_signs),
                       residual_norms=pick(self.residual_norms))

    def to(self, device: torch.device | str) -> "QuantizedVectors":
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)
        return replace(self, codes=move(self.codes), norms=move(self.norms), qjl_signs=move(self.qjl_signs),
                       residual_norms=move(self.residual_norms))

    def flatten(self) -> "QuantizedVectors":
        """The same vectors with the leading shape flattened to (n,)."""
        count = self.norms.numel()

        def flat(t: torch.Tensor | None, trailing: bool) -> torch.Tensor | None:
            if t is None:
                return None
            return t.reshape(count, t.shape[-1]) if trailing else t.reshape(count)
        return replace(self, codes=flat(self.codes, True), norms=flat(self.norms, False),
                       qjl_signs=flat(self.qjl_signs, True), residual_norms=flat(self.residual_norms, False))

    @staticmethod
    def cat(parts: "list[QuantizedVectors]", dim: int = 0) -> "QuantizedVectors":
        """Concatenate along a leading batch dimension (all parts from the same quantizer)."""
        if not parts:
            raise ValueError("cat needs at least one QuantizedVectors")
        first = parts[0]
        if any(p.signature != first.signature for p in parts):
            raise ValueError("cannot concatenate codes from quantizers with different settings")
        if dim < 0:
            dim += len(first.shape)
        if not 0 <= dim < len(first.shape):
            raise ValueError(f"dim {dim} is not a batch dimension of shape {tuple(first.shape)}")

        def join(name: str) -> torch.Tensor | None:
            tensors = [getattr(p, name) for p in parts]
            return None if tensors[0] is None else torch.cat(tensors, dim=dim)
        return replace(first, codes=join("codes"), norms=join("norms"), qjl_signs=join("qjl_signs"),
                       residual_norms=join("residual_norms"))
