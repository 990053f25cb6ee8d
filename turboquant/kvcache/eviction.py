"""Token eviction by observation-window attention: SnapKV (Li et al. 2024, arXiv 2404.14469) and PyramidKV
(Cai et al. 2024, arXiv 2406.02069).

SnapKV, as its paper and reference code do it, once at the end of the prefill of an ``n``-token prompt and
independently in every layer and KV head:

1. the *observation window* is the last ``w`` prompt tokens (``w = 32``); their queries attend (causally,
   softmax over all ``n`` keys, scale ``1/sqrt(d)``) to the prompt;
2. the attention of the ``w`` window queries to each of the ``n - w`` prefix keys is summed over the window
   ("votes"), then smoothed by a 1-D max-pool of kernel 7 (stride 1, same padding) so that neighbours of an
   important token are kept with it;
3. the ``budget - w`` prefix tokens with the highest pooled votes are kept (in their original order) together
   with the window; everything else is dropped for good. Tokens generated later are appended unmodified.

The defaults (``w = 32``, max-pool, kernel 7) are those of SnapKV's LongBench run script
(``ablation_c4096_w32_k7_maxpool``); PyramidKV's code defaults to avg-pool, kernel 5 (``pooling=``,
``kernel_size=`` select them).

With grouped-query attention the votes of the query heads sharing a KV head are averaged (as the
GQA-aware ports do; SnapKV's own code repeats the KV heads instead, which stores them once per query head).

PyramidKV uses the same scoring and selection but gives lower layers more tokens than higher ones: with an
average of ``C = budget - w`` selected prefix tokens per layer, layer ``l`` of ``L`` selects
``max - l * (max - min) / (L - 1)`` with ``min = C / beta``, ``max = 2C - min`` (``beta = 20``; if ``max``
exceeds ``n - w`` it is clamped there and ``min = 2C - max``), rounded so that the total over layers is
exactly ``L * C`` — the same memory as SnapKV at the same budget.

The window queries. ``transformers`` hands the cache only keys and values; the queries reach the cache layer
through the attention function that ``turboquant.kvcache.attach`` installs
(:mod:`turboquant.kvcache.attention`): at the prefill :meth:`EvictionLayer.update` holds the prompt's keys and
values back, the model's own attention attends over the whole prompt, and :meth:`EvictionLayer.attend` then
scores the prompt with the last ``w`` of the very queries that attention used (RoPE and any ``q_norm`` applied
by the model) and stores the tokens it keeps. No projection is recomputed and no model code forked.

``budget`` is in tokens per layer (SnapKV's ``max_capacity_prompt``, window included); by default it is
``floor(memory_ratio * n)`` with ``memory_ratio = 0.25``, or ``floor(memory_ratio * (n + m)) - m`` when the builder is
told the generation's ``max_new_tokens = m``, so that the budget holds at the peak (the end of the generation). If the budget is not above the window, the window
shrinks to ``budget // 2`` (SnapKV requires ``budget > w``; this only matters for prompts under ~4w tokens).

Bytes of one layer storing ``m`` tokens (kept prompt tokens + generated ones)::

    nbytes = 2 * B * H * m * d * 2

Prompts shorter than the budget are kept whole. Only batch size 1 (SnapKV's own setting) is supported
with PyramidKV under eager attention; with SDPA (the default) decoding works for any per-layer lengths.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from turboquant.kvcache.base import CompressedCache
from turboquant.kvcache.factory import ModelShape, register_method
from turboquant.kvcache.full import FullPrecisionLayer

POOLINGS = ("maxpool", "avgpool")


def observation_votes(
    window_queries: torch.Tensor, keys: torch.Tensor, kernel_size: int, pooling: str
) -> torch.Tensor:
    """Pooled attention votes of the window over the prefix, per KV head: ``(batch, kv_heads, n - w)``.

    ``window_queries``: ``(batch, q_heads, w, d)`` (RoPE applied); ``keys``: ``(batch, kv_heads, n, d)``.
    The window's own block is causally masked, the softmax runs over all ``n`` keys (SnapKV step 1-2).
    """
    batch, q_heads, window, dim = window_queries.shape
    kv_heads, n = keys.shape[1], keys.shape[2]
    group = q_heads // kv_heads
    queries = window_queries.float().reshape(batch, kv_heads, group, window, dim)
    logits = torch.einsum("bhgwd,bhnd->bhgwn", queries, keys.float()) / math.sqrt(dim)
    causal = torch.ones(window, window, dtype=torch.bool, device=keys.device).triu(1)
    logits[..., n - window:] = logits[..., n - window:].masked_fill(causal, float("-inf"))
    votes = logits.softmax(dim=-1)[..., : n - window].sum(dim=3)  # (batch, kv_heads, group, n - w)
    flat = votes.reshape(batch, kv_heads * group, n - window)
    if pooling == "maxpool":
        flat = F.max_pool1d(flat, kernel_size, stride=1, padding=kernel_size // 2)
    else:
        flat = F.avg_pool1d(flat, kernel_size, stride=1, padding=kernel_size // 2, count_include_pad=False)
    return flat.reshape(batch, kv_heads, group, -1).mean(dim=2)


def snapkv_select(
    keys: torch.Tensor, values: torch.Tensor, window_queries: torch.Tensor, keep: int, window: int,
    kernel_size: int, pooling: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``keep - window`` top-voted prefix tokens (original order) plus the last ``window`` tokens."""
    n = keys.shape[2]
    votes = observation_votes(window_queries[:, :, -window:], keys, kernel_size, pooling)
    chosen = votes.topk(keep - window, dim=-1).indices.sort(dim=-1).values
    index = chosen.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
    kept_keys = torch.cat([keys[:, :, : n - window].gather(2, index), keys[:, :, n - window:]], dim=2)
    kept_values = torch.cat([values[:, :, : n - window].gather(2, index), values[:, :, n - window:]], dim=2)
    return kept_keys, kept_values


def split_window(budget: int, window_size: int) -> int:
    """The observation window used at a given budget: ``window_size``, or ``budget // 2`` if the budget is smaller."""
    return window_size if budget > window_size else max(1, budget // 2)


def pyramid_selected_counts(average_selected: int, prefix_tokens: int, num_layers: int, beta: float) -> list[int]:
    """PyramidKV's per-layer numbers of selected prefix tokens (arithmetic, decreasing, summing to L*C)."""
    if num_layers == 1:
        return [min(average_selected, prefix_tokens)]
    low = average_selected / beta
    high = 2 * average_selected - low
    if high > prefix_tokens:
        high = prefix_tokens
        low = 2 * average_selected - high
    raw = [high - layer * (high - low) / (num_layers - 1) for layer in range(num_layers)]
    counts = [min(prefix_tokens, max(0, math.floor(value))) for value in raw]
    # largest-remainder rounding so that the total is exactly num_layers * average_selected
    missing = num_layers * average_selected - sum(counts)
    order = sorted(range(num_layers), key=lambda layer: raw[layer] - math.floor(raw[layer]), reverse=True)
    for layer in order:
        if missing <= 0:
            break
        if counts[layer] < prefix_tokens:
            counts[layer] += 1
            missing -= 1
    return counts


BudgetFn = Callable[[int, int], tuple[int, int]]  # (layer_idx, prompt tokens) -> (kept tokens, window)


class EvictionLayer(FullPrecisionLayer):
    """Keeps the prompt tokens chosen by observation-window votes at the prefill, then appends new tokens.

    Storage and byte accounting are :class:`FullPrecisionLayer`'s: only fewer tokens are written. The prompt is
    stored at the prefill's attention call, where the window's queries are known (module docstring).
    """

    AWAITING = "the prompt's keys and values (never stored)"

    def __init__(
        self, layer_idx: int, budget_fn: BudgetFn, kernel_size: int, pooling: str, window_size: int,
        fp_dtype: torch.dtype | None = None, uniform_budget: bool = True,
    ) -> None:
        super().__init__(layer_idx, fp_dtype)
        self.uniform_budget = uniform_budget  # False: layers keep different numbers of tokens (PyramidKV)
        self.budget_fn, self.kernel_size, self.pooling = budget_fn, kernel_size, pooling
        self.window_size = window_size
        self.prompt_tokens = 0

    def _write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if self.seen_tokens > 0:
            super()._write(key_states, value_states)
            return
        if not self.attached:
            raise ValueError(
                f"{type(self).__name__} needs the observation-window queries at the prefill: run the model inside "
                "`with turboquant.kvcache.attach(model, cache):`"
            )
        self.prompt_tokens = key_states.shape[2]
        self.awaiting = (key_states, value_states)  # the prompt, stored by attend

    def write_pending(self) -> bool:
        return self.awaiting is not None

    def attend(self, module, query, key, value, attention_mask, attention, **kwargs):
        """The model's attention over what ``update`` returned (the whole prompt at the prefill); at the prefill,
        then, the votes of the last ``window`` queries choose the prompt tokens to store."""
        out = attention(module, query, key, value, attention_mask, **kwargs)
        if self.awaiting is not None:
            (keys, values), self.awaiting = self.awaiting, None
            keep, window = self.budget_fn(self.layer_idx, keys.shape[2])
            if keep < keys.shape[2]:
                keys, values = snapkv_select(keys, values, query, keep, window, self.kernel_size, self.pooling)
            super()._write(keys, values)
        return out

    def check_attention(self, implementation: str) -> None:
        if not self.uniform_budget and implementation == "eager":
            raise ValueError("PyramidKV's per-layer cache lengths need SDPA attention, not eager (masks are shared "
                             "by layers)")



def _token_budget(prompt_tokens: int, budget: int | None, memory_ratio: float | None,
                  max_new_tokens: int | None) -> int:
    """Prompt tokens kept per layer: ``budget``, or the most for which the ratio holds at the end of the generation
    (its peak: the generated tokens are stored in 16 bits too), ``floor(r * (n + m)) - m``, at least 2."""
    if budget is not None:
        return budget
    new = max_new_tokens or 0
    return max(2, math.floor(memory_ratio * (prompt_tokens + new)) - new)


def _validate(budget: int | None, memory_ratio: float | None, window_size: int, kernel_size: int, pooling: str) -> None:
    if budget is not None and memory_ratio is not None:
        raise ValueError("give budget= (tokens per layer) or memory_ratio=, not both")
    if budget is not None and budget < 2:
        raise ValueError(f"budget must be at least 2 tokens, got {budget}")
    if memory_ratio is not None and not 0 < memory_ratio <= 1:
        raise ValueError(f"memory_ratio must be in (0, 1], got {memory_ratio}")
    if window_size < 1 or kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"need window_size >= 1 and an odd kernel_size, got {window_size}, {kernel_size}")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")


def build_snapkv_cache(
    shape: ModelShape, budget: int | None = None, memory_ratio: float | None = None, window_size: int = 32,
    kernel_size: int = 7, pooling: str = "maxpool", fp_dtype: torch.dtype | None = None,
    max_new_tokens: int | None = None,
) -> CompressedCache:
    """SnapKV keeping ``budget`` prompt tokens per layer (default ``floor(0.25 * n)``)."""
    if budget is None and memory_ratio is None:
        memory_ratio = 0.25
    _validate(budget, memory_ratio, window_size, kernel_size, pooling)

    def budget_fn(layer_idx: int, prompt_tokens: int) -> tuple[int, int]:
        keep = _token_budget(prompt_tokens, budget, memory_ratio, max_new_tokens)
        return keep, split_window(keep, window_size)

    layers = [EvictionLayer(i, budget_fn, kernel_size, pooling, window_size, fp_dtype) for i in range(shape.num_layers)]
    options = {"budget": budget, "memory_ratio": memory_ratio, "window_size": window_size,
               "kernel_size": kernel_size, "pooling": pooling}
    return CompressedCache(layers, method="snapkv", options=options)


def build_pyramidkv_cache(
    shape: ModelShape, budget: int | None = None, memory_ratio: float | None = None, window_size: int = 32,
    kernel_size: int = 7, pooling: str = "maxpool", beta: float = 20.0, fp_dtype: torch.dtype | None = None,
    max_new_tokens: int | None = None,
) -> CompressedCache:
    """PyramidKV with an *average* of ``budget`` prompt tokens per layer (same total as SnapKV)."""
    if budget is None and memory_ratio is None:
        memory_ratio = 0.25
    _validate(budget, memory_ratio, window_size, kernel_size, pooling)
    if beta < 1:
        raise ValueError(f"PyramidKV beta must be >= 1, got {beta}")
    plans: dict[int, list[int]] = {}

    def budget_fn(layer_idx: int, prompt_tokens: int) -> tuple[int, int]:
        keep = _token_budget(prompt_tokens, budget, memory_ratio, max_new_tokens)
        window = split_window(keep, window_size)
        if keep >= prompt_tokens:
            return keep, window
        if prompt_tokens not in plans:
            plans[prompt_tokens] = pyramid_selected_counts(keep - window, prompt_tokens - window, shape.num_layers, beta)
        return plans[prompt_tokens][layer_idx] + window, window

    layers = [EvictionLayer(i, budget_fn, kernel_size, pooling, window_size, fp_dtype, uniform_budget=False)
              for i in range(shape.num_layers)]
    options = {"budget": budget, "memory_ratio": memory_ratio, "window_size": window_size,
               "kernel_size": kernel_size, "pooling": pooling, "beta": beta}
    return CompressedCache(layers, method="pyramidkv", options=options)


register_method("snapkv", build_snapkv_cache)
register_method("pyramidkv", build_pyramidkv_cache)
