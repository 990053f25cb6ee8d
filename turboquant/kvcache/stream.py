"""An append-only quantized token stream with a full-precision residual window (keys or values of one layer).

Tokens enter a 16-bit residual buffer; a *flush policy* decides how many of the oldest buffered tokens are
handed to an :class:`Encoder` and stored as packed fields:

- ``"block"`` (KIVI keys, the authors' TurboQuant code): when the buffer holds ``R`` or more tokens, the oldest
  ``floor(r / R) * R`` are quantized, so between 0 and ``R - 1`` recent tokens stay in 16 bits ("the last <128
  tokens kept in fp16"); ``R = 0`` quantizes every token as soon as it is written;
- ``"sliding"`` (KIVI values): the ``R`` most recent tokens stay in 16 bits, older ones are quantized one by
  one as they leave the window.

Optionally the stream's first ``S`` tokens (``sink_length``: attention sinks, StreamingLLM's "first 4 tokens") are
kept in 16 bits for good and never reach the policy; the stream reads ``[sink ; quantized ; residual]``, oldest
first.

The stored fields are tensors whose dim 2 is the token (or token-group) axis; each lives in a
:class:`~turboquant.kvcache.base.TokenBuffer`, so appending a flushed chunk copies that chunk only (amortised
O(1) per token) and ``fields`` are views equal to the concatenation of every chunk's fields. With ``capacity``
the store is *static* (:class:`~turboquant.kvcache.base.StaticTokenBuffer`: allocated once, written at a token count
held on the device) and every token is quantized as it is written (no window, no sinks, no workspace): what a decode
step captured in a CUDA graph needs (:meth:`QuantizedStream.packed_view`). The 16-bit residual
holds at most ``R`` tokens (plus the tokens of the current write) and is re-concatenated per write: O(R), not
O(T). On the torch path, each flushed chunk is decoded once into a *workspace* that attention reads (a growing
buffer too); it is computed from the stored fields (never from the original inputs), so it equals decoding the
whole store at every step (``keep_workspace=False`` does exactly that; the tests check both agree bit for bit).
The workspace is an artefact of materialising keys for a stock attention function and is not counted in
``nbytes``; the fused decode path (:mod:`turboquant.kvcache.fused_attention`) reads the packed fields directly
and keeps none. ``decode_fn`` is the workspace's decoding hook. (On the workspace path the layer still hands
attention ``[past ; new]``, one O(T) concatenation per step, as transformers' own ``DynamicCache`` does; the
fused path hands over the window and the new token only.)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from turboquant.kvcache.base import CompressedLayer, StaticTokenBuffer, TokenBuffer, tensor_nbytes

FLUSH_POLICIES = ("block", "sliding")
Fields = dict[str, torch.Tensor]


class Encoder(ABC):
    """Turns ``(batch, heads, tokens, dim)`` chunks into packed fields and back."""

    def prepare(self, prefill: torch.Tensor) -> None:
        """Fit data-dependent side information on the first chunk written (the prefill); default: nothing."""

    @abstractmethod
    def encode(self, x: torch.Tensor) -> Fields:
        """Packed fields of the chunk ``x`` (float32); every field has the token (group) axis at dim 2."""

    @abstractmethod
    def decode(self, fields: Fields) -> torch.Tensor:
        """``(batch, heads, tokens, dim)`` float32 reconstruction of concatenated fields."""

    def side_nbytes(self) -> int:
        """Bytes of per-stream side information (e.g. outlier channel indices), 0 by default."""
        return 0


def tokens_to_flush(buffered: int, residual_length: int, policy: str) -> int:
    """How many of the oldest ``buffered`` 16-bit tokens the policy quantizes now (see module docstring)."""
    if policy == "block":
        return buffered if residual_length == 0 else (buffered // residual_length) * residual_length
    return max(0, buffered - residual_length)


def quantized_and_residual(tokens: int, residual_length: int, policy: str, sink_length: int = 0) -> tuple[int, int]:
    """``(quantized, 16-bit)`` token counts after ``tokens`` tokens were written, in any chunking (the 16-bit count
    includes the first ``sink_length`` tokens)."""
    sink = min(tokens, sink_length)
    quantized = tokens_to_flush(tokens - sink, residual_length, policy)
    return quantized, tokens - quantized


def _joined(held: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """``new`` appended to the 16-bit tokens ``held`` (None: nothing held yet) along the token axis."""
    return new if held is None else torch.cat([held, new], dim=-2)


class QuantizedStream:
    """Residual buffer + packed store + decoded workspace for one tensor stream of one layer."""

    def __init__(
        self,
        encoder: Encoder,
        residual_length: int,
        policy: str,
        fp_dtype: torch.dtype,
        compute_dtype: torch.dtype,
        keep_workspace: bool = True,
        decode_fn: Callable[[Encoder, Fields], torch.Tensor] | None = None,
        sink_length: int = 0,
        capacity: int | None = None,
    ) -> None:
        if policy not in FLUSH_POLICIES:
            raise ValueError(f"flush policy must be one of {FLUSH_POLICIES}, got {policy!r}")
        if residual_length < 0 or sink_length < 0:
            raise ValueError(f"residual_length and sink_length must be >= 0, got {residual_length}, {sink_length}")
        if capacity is not None and (residual_length or sink_length or keep_workspace):
            raise ValueError("a static store (capacity=) quantizes every token as it is written and keeps no "
                             f"workspace: got residual_length={residual_length}, sink_length={sink_length}, "
                             f"keep_workspace={keep_workspace}")
        self.encoder = encoder
        self.residual_length = residual_length
        self.policy = policy
        self.fp_dtype = fp_dtype
        self.compute_dtype = compute_dtype
        self.keep_workspace = keep_workspace
        self.decode_fn = decode_fn or (lambda encoder, fields: encoder.decode(fields))
        self.field_buffers: dict[str, TokenBuffer | StaticTokenBuffer] = {}
        self.workspace_buffer = TokenBuffer()
        self.sink_length = sink_length
        self.capacity = capacity
        self.sink: torch.Tensor | None = None
        self.residual: torch.Tensor | None = None
        self.quantized_tokens = 0
        self._prepared = False

    @property
    def fields(self) -> Fields | None:
        """The packed store: every field's stored rows (views of its buffer); ``None`` before the first flush."""
        return {name: buffer.tensor for name, buffer in self.field_buffers.items()} or None

    @property
    def workspace(self) -> torch.Tensor | None:
        """The decoded quantized tokens in the compute dtype (``None`` without a workspace or before a flush)."""
        return self.workspace_buffer.tensor

    @property
    def residual_tokens(self) -> int:
        return 0 if self.residual is None else self.residual.shape[-2]

    @property
    def sink_tokens(self) -> int:
        return 0 if self.sink is None else self.sink.shape[-2]

    @property
    def tokens(self) -> int:
        return self.sink_tokens + self.quantized_tokens + self.residual_tokens

    def append(self, x: torch.Tensor) -> None:
        """Write new tokens ``(batch, heads, n, dim)``: buffer them in 16 bits, then flush per the policy."""
        if not self._prepared:
            self.encoder.prepare(x.float())
            self._prepared = True
        stored = x.to(self.fp_dtype)
        if self.sink_tokens < self.sink_length:
            take = self.sink_length - self.sink_tokens
            self.sink = _joined(self.sink, stored[:, :, :take])
            stored = stored[:, :, take:]
            if stored.shape[-2] == 0:
                return
        self.residual = _joined(self.residual, stored)
        flush = tokens_to_flush(self.residual.shape[-2], self.residual_length, self.policy)
        if flush == 0:
            return
        chunk, self.residual = self.residual[:, :, :flush], self.residual[:, :, flush:]
        fields = self.encoder.encode(chunk.float())
        if not self.field_buffers:
            self.field_buffers = {name: TokenBuffer() if self.capacity is None else StaticTokenBuffer(self.capacity)
                                  for name in fields}
        if fields.keys() != self.field_buffers.keys():
            raise ValueError(f"the encoder returned fields {sorted(fields)}, the store holds {sorted(self.field_buffers)}")
        for name, value in fields.items():
            self.field_buffers[name].append(value)
        self.quantized_tokens += flush
        if self.keep_workspace:
            self.workspace_buffer.append(self.decode_fn(self.encoder, fields).to(self.compute_dtype))

    def packed_view(self, batch: int) -> tuple[Fields | None, torch.Tensor | None]:
        """What attention reads of the packed store: its fields and the (batch,) int32 count of their stored tokens
        (``(None, None)`` before the first flush). A static store hands over its whole storage and a copy of its
        count on the device, so that nothing of the read is decided on the host: a CUDA graph replays it as the
        store grows."""
        if not self.field_buffers:
            return None, None
        if self.capacity is None:
            device = next(iter(self.field_buffers.values())).storage.device
            return self.fields, torch.full((batch,), self.quantized_tokens, dtype=torch.int32, device=device)
        return ({name: buffer.storage for name, buffer in self.field_buffers.items()},
                self.device_tokens().to(torch.int32).expand(batch).contiguous())

    def device_tokens(self) -> torch.Tensor:
        """A static store's token count on the device, a 0-dim int64 tensor that its writes advance in place (so a
        CUDA graph that reads it reads each replay's count). A static store holds no sink and no window."""
        if self.capacity is None or not self.field_buffers:
            raise ValueError("only a static store that holds tokens keeps its count on the device")
        return next(iter(self.field_buffers.values())).device_length

    def resync(self) -> None:
        """After replays of a captured decode step: the host's token count read back from a static store's device
        count (one synchronisation; nothing to do for a growing store)."""
        if self.capacity is not None and self.field_buffers:
            counts = {buffer.resync() for buffer in self.field_buffers.values()}  # the fields advance together
            self.quantized_tokens = counts.pop()

    def read_parts(self) -> list[torch.Tensor]:
        """The stored tokens, decoded, in the compute dtype, as consecutive pieces along the token axis (16-bit sink,
        decoded quantized tokens, 16-bit window; empty pieces left out), so that a caller appending new tokens joins
        everything in one copy instead of two."""
        parts = [self.sink.to(self.compute_dtype)] if self.sink_tokens else []
        if self.quantized_tokens:
            parts.append(self.workspace if self.keep_workspace else self.decode_fn(self.encoder, self.fields).to(self.compute_dtype))
        if self.residual_tokens:
            parts.append(self.residual.to(self.compute_dtype))
        return parts

    def read(self) -> torch.Tensor:
        """All stored tokens, decoded, oldest first, in the compute dtype."""
        parts = self.read_parts()
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)

    def packed_nbytes(self) -> int:
        """Bytes of the quantized fields only (their stored rows)."""
        return sum(buffer.nbytes() for buffer in self.field_buffers.values())

    def nbytes(self) -> int:
        """Stored bytes: packed fields + 16-bit sink and residual + the encoder's side information."""
        return (self.packed_nbytes() + tensor_nbytes(self.sink) + tensor_nbytes(self.residual)
                + self.encoder.side_nbytes())

    def allocated_nbytes(self) -> int:
        """``nbytes()`` with the field buffers' spare capacity (the workspace is excluded, as from ``nbytes``)."""
        packed = sum(buffer.allocated_nbytes() for buffer in self.field_buffers.values())
        return packed + tensor_nbytes(self.sink) + tensor_nbytes(self.residual) + self.encoder.side_nbytes()


class StreamLayer(CompressedLayer):
    """A compressed layer whose keys and values are two :class:`QuantizedStream` s.

    Subclasses build ``self.key_stream`` / ``self.value_stream`` in ``lazy_initialization`` and give
    the byte formula in ``expected_nbytes``; reading, writing and byte counting are shared here.
    """

    key_stream: QuantizedStream
    value_stream: QuantizedStream

    def _read(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.key_stream.read(), self.value_stream.read()

    def _read_parts(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return self.key_stream.read_parts(), self.value_stream.read_parts()

    def _write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.key_stream.append(key_states)
        self.value_stream.append(value_states)

    def stored_tokens(self) -> int:
        return self.key_stream.tokens if self.is_initialized else 0

    def nbytes(self) -> int:
        return self.key_stream.nbytes() + self.value_stream.nbytes() if self.is_initialized else 0

    def allocated_nbytes(self) -> int:
        return self.key_stream.allocated_nbytes() + self.value_stream.allocated_nbytes() if self.is_initialized else 0
