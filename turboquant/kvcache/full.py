"""The full-precision baseline: every key and value kept in 16 bits.

This is "the model's 16-bit cache" that every other method's memory ratio is measured against, so its
``memory_ratio()`` is exactly 1. It is also the layer the quantized caches use for their boundary layers.
"""

from __future__ import annotations

import torch

from turboquant.kvcache.base import CompressedLayer, TokenBuffer, tensor_nbytes


class FullPrecisionLayer(CompressedLayer):
    """Keys and values stored unmodified in ``fp_dtype`` (fp16, or the model's own 16-bit dtype).

    Bytes: ``nbytes = 2 * B * H * n * d * s`` with ``n`` stored tokens, ``B`` batch, ``H`` KV heads, ``d`` head
    dim and ``s = 2`` the itemsize of the 16-bit storage dtype.
    """

    def _initialize(self) -> None:
        shape = (self.batch_size, self.num_heads, 0, self.head_dim)
        self.keys = torch.empty(shape, dtype=self.fp_dtype, device=self.device)
        self.values = torch.empty(shape, dtype=self.fp_dtype, device=self.device)
        self.key_buffer, self.value_buffer = TokenBuffer(), TokenBuffer()

    def _read(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys.to(self.compute_dtype), self.values.to(self.compute_dtype)

    def _write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        # ``keys`` / ``values`` are views of the filled part of the growing buffers
        self.keys = self.key_buffer.append(key_states.to(self.fp_dtype))
        self.values = self.value_buffer.append(value_states.to(self.fp_dtype))

    def stored_tokens(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def nbytes(self) -> int:
        return tensor_nbytes(self.keys, self.values) if self.is_initialized else 0

    def allocated_nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        return self.key_buffer.allocated_nbytes() + self.value_buffer.allocated_nbytes()

    def expected_nbytes(self) -> int:
        return self.fp_bytes(self.stored_tokens()) if self.is_initialized else 0
