"""The shared interface of every KV cache in this package, and its byte accounting.

Each method (full precision, TurboQuant, KIVI, PolarQuant, SnapKV, PyramidKV) is one subclass of
:class:`CompressedLayer`, a ``transformers`` cache layer (``CacheLayerMixin``), and the model-wide object is a
:class:`CompressedCache`, a real ``transformers.Cache``. ``model.generate(..., past_key_values=cache)`` (or
``cache=cache``, the name transformers >= 5.24 prefers) therefore works with an unmodified model: every
attention layer calls ``cache.update(key_states, value_states, layer_idx)`` with its new (RoPE-applied)
keys and values of shape ``(batch, kv_heads, new_tokens, head_dim)`` and attends over what it returns.

The contract of :meth:`CompressedLayer.update` (the same for all methods):

1. the tokens already stored are read back (decoded / dequantized) in the compute dtype;
2. the new tokens are written into the compressed store (quantized and packed, or scored and evicted);
3. the returned keys/values are ``[read-back past ; new tokens exact]``. The tokens of the current forward
   pass attend to each other at full precision, as in the authors' TurboQuant code ("prefill attention
   unquantized"), in KIVI (new tokens enter its full-precision residual) and in SnapKV / PyramidKV (the prefill
   attends to the whole prompt, eviction only shapes what later tokens see). Every later step reads the
   compressed store.

Sequence bookkeeping: ``get_seq_length()`` is the number of tokens *seen* (it drives the position ids),
while ``get_mask_sizes`` / ``get_query_offset`` use the number of tokens *stored*, which is smaller for the
eviction methods; this is what lets a SnapKV cache hold 25% of the prompt without touching model code.

Byte accounting. ``nbytes()`` is the memory of what is actually stored: the ``element_size() * numel()`` of
every tensor the layer keeps (packed codes, norms / scales, outlier indices, full-precision windows, fully
kept layers). Decoding workspaces that a fused GPU kernel would not need are excluded and named as such.
The reference is the model's 16-bit cache of the same tokens:

    reference_nbytes = 2 (K and V) * batch * kv_heads * seen_tokens * head_dim * 2 bytes

and ``memory_ratio = nbytes / reference_nbytes`` (0.25 = "25% of the full cache", the paper's Needle budget),
``compression_ratio = 1 / memory_ratio``, ``bits_per_value = 16 * memory_ratio``. Each subclass states its
closed-form ``nbytes`` formula in its docstring and implements it in ``expected_nbytes()``; the tests check
that the measured bytes equal the formula.

Memory over time. The ratio changes as tokens arrive (a 16-bit window fills and is flushed, evicted caches keep
appending decoded tokens), so the cache samples it after every forward pass (once the last layer has stored its tokens:
after its update, or after its attention call for a layer that stores only then, see ``write_pending``):
``peak_memory_ratio()`` is the largest sample, the memory a budget must hold at, and ``mean_memory_ratio()`` their
average over forward passes. A memory budget (``memory_ratio=`` of a builder) is enforced at the peak: given the
prompt length ``context_length`` and ``max_new_tokens``, the builders choose the costliest configuration whose ratio
at every length in ``[context_length, context_length + max_new_tokens]`` fits (:func:`peak_ratio_over`).

Growth. Stored tensors grow token by token in :class:`TokenBuffer` s (amortised O(1) per appended token instead
of a ``torch.cat`` copy of the whole store), which keep some spare capacity. ``nbytes()`` counts the filled part
only: the memory the method needs, the quantity every ratio uses. ``allocated_nbytes()`` is the memory the
buffers hold, spare capacity included (``>= nbytes()``; the slack is an implementation detail, bounded in
:class:`TokenBuffer`'s docstring, and enters no ratio).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from turboquant._validation import check_int, check_vectors

REFERENCE_BYTES_PER_VALUE = 2  # the model's 16-bit (fp16 / bf16) cache

#: A transformers attention function: ``(module, query, key, value, attention_mask, **kwargs) -> (output, weights)``.
AttentionFn = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]


def peak_ratio_over(ratio_at: Callable[[int | None], float], context_length: int | None,
                    max_new_tokens: int | None) -> float:
    """``max_t ratio_at(t)`` over the lengths a generation passes through, ``context_length .. + max_new_tokens``;
    without a ``context_length``, the steady state ``ratio_at(None)``."""
    if context_length is None:
        return ratio_at(None)
    if context_length < 1:
        raise ValueError(f"context_length must be >= 1, got {context_length}")
    return max(ratio_at(t) for t in range(context_length, context_length + (max_new_tokens or 0) + 1))


def tensor_nbytes(*tensors: torch.Tensor | None) -> int:
    """Total ``element_size * numel`` of the given tensors (``None`` counts 0)."""
    return sum(t.element_size() * t.numel() for t in tensors if t is not None)


class TokenBuffer:
    """An append-only tensor that grows along the token axis (dim 2) at amortised O(1) cost per appended row.

    KV caches grow by one token per decode step; ``torch.cat`` onto the stored tensor copies all ``T`` stored
    rows every step (O(T) per step, O(T^2) per generation). Here the rows live in a preallocated *storage*
    whose token axis has spare capacity: an append copies only the new rows into the free slots, and when
    they run out the storage is reallocated at ``capacity = max(ceil(growth * needed), needed + min_rows)``
    and the filled rows copied once. Capacities grow geometrically, so the copies of successive reallocations
    form a geometric series: over ``T`` appended rows they copy at most ``growth / (growth - 1) * T`` rows in
    total, O(1) amortised per row (5 at the default ``growth = 1.25``), and happen ``O(log T)`` times.

    The growth factor trades copies for idle memory: the allocated capacity is at most
    ``max(growth * needed, needed + min_rows)`` rows, so the slack stays within 25% of the stored rows plus
    ``min_rows`` (capacity doubling, ``growth = 2``, would allow up to 100% for one extra copy per row; a
    compressed KV cache exists to save memory, so the default keeps the slack small; copying a few rows per
    appended token is negligible next to a decode step, which reads all ``T``).

    :attr:`tensor` is a view of the filled rows, ``storage[:, :, :length]``: exactly what ``torch.cat`` of
    the appended chunks would hold (dtype, shape, values; strided along dims 0-1 rather than contiguous, with
    the last dim contiguous). Rows are never written twice, so a view taken earlier keeps its values after
    later appends. Byte accounting counts the filled rows (:meth:`nbytes`); the capacity is reported
    separately (:meth:`allocated_nbytes`).
    """

    TOKEN_DIM = 2

    def __init__(self, growth: float = 1.25, min_rows: int = 64) -> None:
        if growth <= 1 or min_rows < 1:
            raise ValueError(f"need growth > 1 and min_rows >= 1, got growth={growth}, min_rows={min_rows}")
        self.growth, self.min_rows = growth, min_rows
        self.storage: torch.Tensor | None = None
        self.length = 0

    @property
    def tensor(self) -> torch.Tensor | None:
        """The filled rows (``None`` before the first append)."""
        return None if self.storage is None else self.storage.narrow(self.TOKEN_DIM, 0, self.length)

    @property
    def capacity(self) -> int:
        return 0 if self.storage is None else self.storage.shape[self.TOKEN_DIM]

    def append(self, rows: torch.Tensor) -> torch.Tensor:
        """Write ``rows`` after the filled ones (same dtype, device and shape except dim 2); returns :attr:`tensor`."""
        if rows.dim() <= self.TOKEN_DIM:
            raise ValueError(f"expected a tensor with a token axis at dim {self.TOKEN_DIM}, got shape {tuple(rows.shape)}")
        if self.storage is not None:
            expected = self.storage.shape[: self.TOKEN_DIM] + self.storage.shape[self.TOKEN_DIM + 1:]
            got = rows.shape[: self.TOKEN_DIM] + rows.shape[self.TOKEN_DIM + 1:]
            if got != expected or rows.dtype != self.storage.dtype or rows.device != self.storage.device:
                raise ValueError(f"cannot append rows of shape {tuple(rows.shape)} {rows.dtype} on {rows.device} to "
                                 f"a buffer of {tuple(self.storage.shape)} {self.storage.dtype} on {self.storage.device}")
        needed = self.length + rows.shape[self.TOKEN_DIM]
        # storage made under torch.inference_mode cannot be written outside it: move to a fresh one (once)
        frozen = self.storage is not None and self.storage.is_inference() and not torch.is_inference_mode_enabled()
        if needed > self.capacity or frozen:
            self._reallocate(rows, needed)
        self.storage.narrow(self.TOKEN_DIM, self.length, rows.shape[self.TOKEN_DIM]).copy_(rows)
        self.length = needed
        return self.tensor

    def _reallocate(self, rows: torch.Tensor, needed: int) -> None:
        capacity = max(math.ceil(self.growth * needed), needed + self.min_rows)
        shape = list(rows.shape)
        shape[self.TOKEN_DIM] = capacity
        storage = torch.empty(shape, dtype=rows.dtype, device=rows.device)
        if self.length:
            storage.narrow(self.TOKEN_DIM, 0, self.length).copy_(self.tensor)
        self.storage = storage

    def nbytes(self) -> int:
        """Bytes of the filled rows (what is stored)."""
        return tensor_nbytes(self.tensor)

    def allocated_nbytes(self) -> int:
        """Bytes of the whole storage, spare capacity included."""
        return tensor_nbytes(self.storage)


class StaticTokenBuffer:
    """:class:`TokenBuffer`'s interface over a storage allocated once, at ``capacity`` rows, whose appends are placed
    by a row count held on the device (:attr:`device_length`), so that a CUDA graph can capture them: every replay
    writes after the rows of the one before, at a fixed storage address (``index_copy_`` at ``device_length +
    arange(n)``, then ``device_length += n``; transformers' ``StaticLayer`` works the same way).

    :attr:`length` counts the rows appended on the host and :attr:`tensor` views them, as in :class:`TokenBuffer`;
    the replays of a captured graph advance :attr:`device_length` only (:meth:`resync` reads it back, one
    synchronisation). An eager append beyond ``capacity`` raises; a replay beyond it fails in the device's index check.
    """

    TOKEN_DIM = 2

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 token, got {capacity}")
        self.capacity = capacity
        self.storage: torch.Tensor | None = None
        self.device_length: torch.Tensor | None = None  # () int64 on the storage's device
        self.length = 0

    @property
    def tensor(self) -> torch.Tensor | None:
        """The rows appended on the host (``None`` before the first append)."""
        return None if self.storage is None else self.storage.narrow(self.TOKEN_DIM, 0, self.length)

    def append(self, rows: torch.Tensor) -> torch.Tensor:
        """Write ``rows`` (token axis at dim 2) after the stored ones; returns :attr:`tensor`."""
        n = rows.shape[self.TOKEN_DIM]
        if self.length + n > self.capacity:
            raise ValueError(f"a static buffer of {self.capacity} tokens cannot take {n} more after {self.length}")
        if self.storage is None:
            shape = list(rows.shape)
            shape[self.TOKEN_DIM] = self.capacity
            self.storage = torch.zeros(shape, dtype=rows.dtype, device=rows.device)
            self.device_length = torch.zeros((), dtype=torch.int64, device=rows.device)
        elif (rows.shape[:self.TOKEN_DIM] != self.storage.shape[:self.TOKEN_DIM]
              or rows.shape[self.TOKEN_DIM + 1:] != self.storage.shape[self.TOKEN_DIM + 1:]
              or rows.dtype != self.storage.dtype or rows.device != self.storage.device):
            raise ValueError(f"cannot append rows of shape {tuple(rows.shape)} {rows.dtype} on {rows.device} to "
                             f"a static buffer of {tuple(self.storage.shape)} {self.storage.dtype} on {self.storage.device}")
        positions = self.device_length + torch.arange(n, device=rows.device)
        self.storage.index_copy_(self.TOKEN_DIM, positions, rows)
        self.device_length.add_(n)
        self.length += n
        return self.tensor

    def resync(self) -> int:
        """Set :attr:`length` to :attr:`device_length` (after graph replays) and return it."""
        if self.device_length is not None:
            self.length = int(self.device_length)
        return self.length

    def nbytes(self) -> int:
        """Bytes of the rows appended on the host."""
        return tensor_nbytes(self.tensor)

    def allocated_nbytes(self) -> int:
        """Bytes of the whole storage."""
        return tensor_nbytes(self.storage)


def storage_dtype_for(compute_dtype: torch.dtype, requested: torch.dtype | None) -> torch.dtype:
    """The 16-bit dtype in which full-precision parts are stored.

    ``requested`` wins; otherwise a 16-bit compute dtype is kept as is (bf16 models keep bf16) and a float32
    model (the CPU default) stores float16, so that "full precision" always means the 16-bit cache the paper
    compares against.
    """
    if requested is not None:
        return requested
    return compute_dtype if compute_dtype in (torch.float16, torch.bfloat16) else torch.float16


class CompressedLayer(CacheLayerMixin):
    """One attention layer's KV store; subclasses implement ``_read``, ``_write``, ``stored_tokens``, ``nbytes``.

    Attributes set on the first ``update`` (lazy initialisation): ``batch_size``, ``num_heads`` (KV heads),
    ``head_dim``, ``compute_dtype``, ``device``, ``fp_dtype`` (the 16-bit storage dtype of full-precision parts).
    """

    is_compileable = False
    is_croppable = False
    is_sliding = False
    model_head_dim: int | None = None  # the model's head_dim (set by build_cache), checked at the first update
    attached = False  # True inside ``attach(model, cache)``: the model's attention calls reach :meth:`attend`
    AWAITING = "what"  # names what ``awaiting`` holds, in the error of :meth:`detach`
    read_path = "workspace"  # how attention reads the store: the tensors update returns ("fused": see turboquant_cache)

    def __init__(self, layer_idx: int, fp_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.requested_fp_dtype = fp_dtype
        self.seen_tokens = 0
        self.awaiting: Any = None  # what update left for this layer's attend call (None: nothing)

    # ----------------------------------------------------------------- transformers layer interface
    def check_states(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """ValueError unless the new key/value states are floating-point tensors of one shape
        (batch, kv_heads, tokens, head_dim) whose batch, heads and head_dim are those of the earlier updates
        (and head_dim the model's). Metadata only: no pass over the values, no device synchronisation."""
        where = f"layer {self.layer_idx}"
        check_vectors(key_states, f"{where}: key_states")
        check_vectors(value_states, f"{where}: value_states")
        if key_states.dim() != 4 or key_states.shape != value_states.shape:
            raise ValueError(
                f"{where}: expected key/value states of equal shape (batch, kv_heads, tokens, head_dim), got "
                f"{tuple(key_states.shape)} and {tuple(value_states.shape)}"
            )
        head_dim = key_states.shape[-1]
        if self.is_initialized and head_dim != self.head_dim:
            raise ValueError(f"{where}: head_dim changed from {self.head_dim} to {head_dim} between updates")
        if not self.is_initialized and self.model_head_dim is not None and head_dim != self.model_head_dim:
            raise ValueError(f"{where}: key/value head_dim {head_dim} differs from the model's {self.model_head_dim}")
        if self.is_initialized and tuple(key_states.shape[:2]) != (self.batch_size, self.num_heads):
            raise ValueError(
                f"{where}: batch/heads changed from ({self.batch_size}, {self.num_heads}) to "
                f"{tuple(key_states.shape[:2])}; build a new cache per batch"
            )

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.batch_size, self.num_heads, _, self.head_dim = key_states.shape
        self.compute_dtype = key_states.dtype
        self.device = key_states.device
        self.fp_dtype = storage_dtype_for(key_states.dtype, self.requested_fp_dtype)
        self.is_initialized = True
        self._initialize()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens compressed; return ``[decoded past ; new tokens]`` for attention (see module doc)."""
        self.check_states(key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        past_keys, past_values = self._read_parts() if self.stored_tokens() > 0 else ([], [])
        self._write(key_states, value_states)
        self.seen_tokens += key_states.shape[-2]
        if not past_keys:
            return key_states, value_states
        return torch.cat([*past_keys, key_states], dim=-2), torch.cat([*past_values, value_states], dim=-2)

    def get_seq_length(self) -> int:
        """Number of tokens seen (drives position ids); eviction layers store fewer, see ``stored_tokens``."""
        return self.seen_tokens

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.stored_tokens() + query_length, 0

    def get_query_offset(self) -> int | torch.Tensor:
        """The first query position in the causal mask's key index: the tokens stored (fewer than seen for the
        eviction layers)."""
        return self.stored_tokens()

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.seen_tokens = 0
        self.is_initialized = False
        self.keys = self.values = None

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support beam search (use greedy or sampling)")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be cropped (no assisted/speculative decoding)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be expanded over the batch")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot select batch rows")

    # ----------------------------------------------------------------- attention (see turboquant.kvcache.attention)
    def attend(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, attention: AttentionFn,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One call of the model's attention module ``module`` (its ``query``; ``key``/``value`` as :meth:`update`
        returned them). By default the model's own ``attention`` function answers it; a method overrides this when
        attention needs more than the returned tensors (the eviction methods' window queries, the fused kernel)."""
        return attention(module, query, key, value, attention_mask, **kwargs)

    def write_pending(self) -> bool:
        """True while the tokens of the last :meth:`update` wait for this layer's :meth:`attend` before they are
        stored (the memory of a forward pass is sampled after that call)."""
        return False

    def check_attention(self, implementation: str) -> None:
        """ValueError when this layer cannot work under the model's attention ``implementation`` (``"sdpa"``,
        ``"eager"``, ...); called by ``attach``."""

    def detach(self) -> str | None:
        """Leave ``attach``: drop what :meth:`update` left for :meth:`attend` (``awaiting``) if no attention call took
        it, and say so (None: nothing was left), which means the model's attention did not dispatch through
        transformers' AttentionInterface."""
        self.attached = False
        if self.awaiting is None:
            return None
        self.awaiting = None
        return (f"layer {self.layer_idx}: no attention call read {self.AWAITING} that update left for it; this "
                "model's attention does not dispatch through transformers' AttentionInterface")

    # ----------------------------------------------------------------- what each method implements
    def _initialize(self) -> None:
        """Allocate method state once shapes and dtypes are known (called from ``lazy_initialization``)."""

    @abstractmethod
    def _read(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoded stored keys and values, ``(batch, kv_heads, stored_tokens, head_dim)``, compute dtype."""

    def _read_parts(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``_read`` as consecutive pieces along the token axis, which ``update`` joins with the new tokens in one
        copy; a layer that stores its tokens in several pieces returns them unjoined (one copy of the whole store
        per step saved)."""
        keys, values = self._read()
        return [keys], [values]

    @abstractmethod
    def _write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Compress and store new tokens."""

    @abstractmethod
    def stored_tokens(self) -> int:
        """Number of token positions the layer stores (what attention reads)."""

    @abstractmethod
    def nbytes(self) -> int:
        """Measured bytes of everything the layer stores."""

    @abstractmethod
    def expected_nbytes(self) -> int:
        """The closed-form byte formula of the class docstring, evaluated on the current token counts."""

    def allocated_nbytes(self) -> int:
        """Bytes held for the stored tensors, spare capacity of growing buffers included (``>= nbytes()``);
        layers without growing buffers hold exactly what they store."""
        return self.nbytes()

    # ----------------------------------------------------------------- accounting
    def reference_nbytes(self) -> int:
        """Bytes of the model's 16-bit cache holding the same seen tokens (K and V)."""
        if not self.is_initialized:
            return 0
        return 2 * self.batch_size * self.num_heads * self.seen_tokens * self.head_dim * REFERENCE_BYTES_PER_VALUE

    def fp_bytes(self, tokens: int) -> int:
        """Bytes of ``tokens`` full-precision K and V tokens in ``fp_dtype`` (both tensors)."""
        itemsize = torch.empty((), dtype=self.fp_dtype).element_size()
        return 2 * self.batch_size * self.num_heads * tokens * self.head_dim * itemsize


class CompressedCache(Cache):
    """A model-wide ``transformers.Cache`` of :class:`CompressedLayer` s, with memory reporting.

    ``method`` names the method, ``options`` records the resolved options (for result tables).
    """

    def __init__(self, layers: list[CompressedLayer], method: str, options: dict[str, Any]) -> None:
        if not layers:
            raise ValueError("a cache needs at least one layer")
        super().__init__(layers=layers)
        self.method = method
        self.options = dict(options)
        self.ratio_samples: list[float] = []  # memory_ratio() after each forward pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``transformers.Cache.update`` with ``layer_idx`` checked against this cache's layers; after the last
        layer's update, the memory ratio of this forward pass is sampled."""
        layer_idx = check_int(layer_idx, f"layer_idx (this cache has {len(self.layers)} layers)", 0,
                              len(self.layers) - 1)
        out = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        if not self.layers[layer_idx].write_pending():
            self._end_of_layer(layer_idx)
        return out

    def attend(self, layer_idx: int, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, attention_mask: torch.Tensor | None, attention: AttentionFn,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Layer ``layer_idx``'s :meth:`CompressedLayer.attend`; a layer that stored its tokens only there ends
        the forward pass's layer (and, for the last layer, samples its memory) after it."""
        layer = self.layers[layer_idx]
        pending = layer.write_pending()
        out = layer.attend(module, query, key, value, attention_mask, attention, **kwargs)
        if pending:
            self._end_of_layer(layer_idx)
        return out

    def _end_of_layer(self, layer_idx: int) -> None:
        """The layer's tokens of this forward pass are stored: after the last layer's, sample the memory ratio."""
        if layer_idx == len(self.layers) - 1:
            self.ratio_samples.append(self.memory_ratio())

    def get_query_offset(self, layer_idx: int = 0) -> int | torch.Tensor:
        """Layer ``layer_idx``'s :meth:`CompressedLayer.get_query_offset` (0 before its first update)."""
        if layer_idx >= len(self.layers) or not self.layers[layer_idx].is_initialized:
            return 0
        return self.layers[layer_idx].get_query_offset()

    def attention_path(self) -> str:
        """``"fused"`` when some layer's decode steps read the packed store through the kernel, else
        ``"workspace"`` (the model's attention reads the tensors the layers return: a quantizer's decoded workspace,
        the 16-bit store of the full and eviction caches). Decided per layer at its first update: ask after it."""
        return "fused" if any(layer.read_path == "fused" for layer in self.layers) else "workspace"

    def nbytes(self) -> int:
        """Measured bytes stored by all layers."""
        return sum(layer.nbytes() for layer in self.layers)

    def expected_nbytes(self) -> int:
        """Sum of each layer's closed-form byte formula (equals ``nbytes()``; checked in tests)."""
        return sum(layer.expected_nbytes() for layer in self.layers)

    def allocated_nbytes(self) -> int:
        """Bytes the layers hold, the growing buffers' spare capacity included (not part of any ratio)."""
        return sum(layer.allocated_nbytes() for layer in self.layers)

    def reference_nbytes(self) -> int:
        """Bytes of the model's 16-bit cache of the same tokens."""
        return sum(layer.reference_nbytes() for layer in self.layers)

    def memory_ratio(self) -> float:
        """``nbytes / reference_nbytes`` (0.25 = 25% of the full 16-bit cache)."""
        reference = self.reference_nbytes()
        if reference == 0:
            raise ValueError("the cache is empty: run a forward pass before asking for its memory ratio")
        return self.nbytes() / reference

    def peak_memory_ratio(self) -> float:
        """The largest memory ratio after any forward pass so far (what a memory budget must hold)."""
        if not self.ratio_samples:
            raise ValueError("the cache is empty: run a forward pass before asking for its peak memory ratio")
        return max(self.ratio_samples)

    def mean_memory_ratio(self) -> float:
        """The memory ratio averaged over forward passes (prefill and every decode step)."""
        if not self.ratio_samples:
            raise ValueError("the cache is empty: run a forward pass before asking for its mean memory ratio")
        return sum(self.ratio_samples) / len(self.ratio_samples)

    def compression_ratio(self) -> float:
        """``reference_nbytes / nbytes``: how many times smaller than the model's 16-bit cache."""
        return 1.0 / self.memory_ratio()

    def bits_per_value(self) -> float:
        """Average stored bits per cached K/V coordinate, everything counted (``16 * memory_ratio``)."""
        return 8 * REFERENCE_BYTES_PER_VALUE * self.memory_ratio()

    def summary(self) -> dict[str, Any]:
        """One flat row for result tables: method, options, bytes and ratios."""
        return {
            "method": self.method,
            **{f"option_{key}": value for key, value in self.options.items()},
            "nbytes": self.nbytes(),
            "reference_nbytes": self.reference_nbytes(),
            "memory_ratio": self.memory_ratio(),
            "peak_memory_ratio": self.peak_memory_ratio() if self.ratio_samples else self.memory_ratio(),
            "compression_ratio": self.compression_ratio(),
            "bits_per_value": self.bits_per_value(),
        }
