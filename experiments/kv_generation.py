"""Greedy generation through a compressed KV cache: the loop the needle and LongBench experiments share.

Each batch of prompts gets a fresh cache from :func:`turboquant.kvcache.build_cache` (caches hold one batch of
conversations), attached to the model (``turboquant.kvcache.attach``: the one attention function that hands every
attention call to the cache layer), and the cache's own byte accounting is returned with the texts so every row
records the memory it really used: at the end, at its peak and averaged over forward passes. A batch holds prompts of one length (no padding: every row's cache is the cache
a single prompt would build); the cache is told the prompt length and ``max_new_tokens`` so a ``memory_ratio``
budget holds at the peak of the generation.

Attention path. Generation runs inside :func:`turboquant.kvcache.attach`, and a TurboQuant cache is built with
``fused_decode="auto"``: where the Triton decode kernel serves its configuration and runs on the device (CUDA, or
any device under ``TRITON_INTERPRET=1``), decode steps read the packed codes; every other case (another method, a
configuration the kernel does not implement, no Triton on the device) runs the model's own attention over what the
cache returns. A method's ``fused_decode`` option (or a workspace ``decode_fn``), when given, decides instead
(``True`` never falls back: an unsupported configuration raises). ``Generation.attention_path`` records which
path ran, so result rows say it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
import torch

from experiments.io import config_to_dict
from experiments.models import LoadedModel
from turboquant.kvcache import attach, build_cache


@dataclass(frozen=True)
class Generation:
    """Greedy continuations of a batch of prompts and what the cache that produced them cost."""

    texts: tuple[str, ...]
    new_tokens: tuple[int, ...]  # per row, up to and excluding its first end-of-sequence token
    seconds: float               # the whole batch
    cache_nbytes: int
    cache_allocated_nbytes: int  # cache_nbytes + the growing buffers' spare capacity (enters no ratio)
    memory_ratio: float          # at the end
    peak_memory_ratio: float     # the largest after any forward pass (what a budget must hold)
    mean_memory_ratio: float     # averaged over forward passes
    bits_per_value: float
    compression_ratio: float
    attention_path: str  # "fused" (decode steps read the packed store in the kernel) or "workspace"
    gpu_peak_bytes: int | None = None  # torch.cuda.max_memory_allocated over the generation (model included)

    @property
    def text(self) -> str:
        """The continuation of a one-prompt batch."""
        return self.texts[self._only_row()]

    @property
    def new_token_count(self) -> int:
        """The generated tokens of a one-prompt batch."""
        return self.new_tokens[self._only_row()]

    def _only_row(self) -> int:
        if len(self.texts) != 1:
            raise ValueError(f"this generation has {len(self.texts)} rows; read .texts / .new_tokens")
        return 0


@dataclass(frozen=True)
class KVMethod:
    """One configured KV-cache method (a ``configs/method/`` file under ``experiment.methods.<key>``).

    ``cache`` and ``options`` are what is computed (the arguments of :func:`turboquant.kvcache.build_cache`);
    ``label`` is for tables and figures; ``paper_method`` is the paper row the method stands for in *this*
    experiment (``experiment.paper_methods``, empty when none): the same cache can stand for different rows
    in different experiments, so the mapping lives in the experiment config, not in the method file.
    ``seeds`` (a method's own ``seeds:`` list) replaces the experiment's ``method_seeds`` for this method.
    """

    key: str
    label: str
    cache: str
    options: dict[str, Any]
    paper_method: str = ""
    seeds: tuple[int, ...] | None = None

    @property
    def randomized(self) -> bool:
        """Whether the cache draws random state (a rotation, a QJL matrix) from ``options["seed"]``."""
        return "seed" in self.options

    def with_seed(self, seed: int) -> KVMethod:
        """The same method with its random state drawn from ``seed`` (only for randomized methods)."""
        if not self.randomized:
            raise ValueError(f"method {self.key!r} has no random state (no 'seed' option)")
        return replace(self, options={**self.options, "seed": int(seed)})

    def identity(self) -> str:
        """What a stored result depends on: the cache and its options (labels and paper rows excluded)."""
        return json.dumps({"cache": self.cache, "options": self.options}, sort_keys=True)


def method_draw(unit: Mapping[str, Any]) -> int | None:
    """The random state (``options["seed"]``) of the method whose :meth:`KVMethod.identity` is a unit's
    ``method_options``; None for a method without one. A unit's replicate for
    :meth:`experiments.io.ResultStore.record_units`: the seeds of a method are cells of their own."""
    seed = json.loads(unit["method_options"]).get("options", {}).get("seed")
    return None if seed is None else int(seed)


def kv_methods(cfg: Any) -> dict[str, KVMethod]:
    """``experiment.methods`` (configs/method/) as :class:`KVMethod`, with ``experiment.paper_methods``."""
    methods = config_to_dict(cfg.experiment.methods)
    if not methods:
        raise ValueError("experiment.methods is empty")
    paper_methods = config_to_dict(cfg.experiment.get("paper_methods") or {})
    out = {}
    for key, method in methods.items():
        if "cache" not in method:
            raise ValueError(f"method {key!r} lacks 'cache' (the turboquant.kvcache method name)")
        unknown = sorted(set(method) - {"name", "label", "cache", "options", "seeds"})
        if unknown:
            raise ValueError(f"method {key!r} has unknown keys {unknown}; known: name, label, cache, options, seeds")
        seeds = method.get("seeds")
        if seeds is not None and (not seeds or len(set(seeds)) != len(seeds)):
            raise ValueError(f"method {key!r}: seeds must be distinct integers, got {seeds}")
        out[key] = KVMethod(
            key=key,
            label=str(method.get("label", key)),
            cache=str(method["cache"]),
            options=dict(method.get("options") or {}),
            paper_method=str(paper_methods.get(key) or ""),
            seeds=None if seeds is None else tuple(int(x) for x in seeds),
        )
    return out


def with_current_labels(frame: pd.DataFrame, methods: Mapping[str, KVMethod]) -> pd.DataFrame:
    """Stored rows with ``method_label`` and ``paper_method`` from the current config: neither is part of a
    result's identity (:meth:`KVMethod.identity`), so relabelling never needs a re-run."""
    if frame.empty:
        return frame
    frame = frame.copy()
    frame["method_label"] = frame["method"].map(lambda k: methods[k].label if k in methods else k)
    frame["paper_method"] = frame["method"].map(lambda k: methods[k].paper_method if k in methods else "")
    return frame


@torch.inference_mode()
def generate_with_cache(
    loaded: LoadedModel,
    input_ids: torch.Tensor,
    cache_method: str,
    options: Mapping[str, Any],
    max_new_tokens: int,
    *,
    eos_token_ids: Sequence[int] | None = None,
    min_new_tokens: int | None = None,
    stopping_criteria: Any = None,
) -> Generation:
    """Prefill ``input_ids`` (B, n: B prompts of one length) and decode greedily with a fresh ``cache_method`` cache."""
    model, tokenizer = loaded.model, loaded.tokenizer
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be (batch, tokens) with tokens > 0, got shape {tuple(input_ids.shape)}")
    input_ids = input_ids.to(next(model.parameters()).device)
    lengths = {"context_length": int(input_ids.shape[1]), "max_new_tokens": int(max_new_tokens)}
    read_path = {"fused_decode": "auto"} if cache_method == "turboquant" and "decode_fn" not in options else {}
    cache = build_cache(cache_method, model.config, **{**lengths, **read_path, **options})
    extra: dict[str, Any] = {}
    if eos_token_ids:
        extra["eos_token_id"] = list(eos_token_ids)
    if min_new_tokens is not None:
        extra["min_new_tokens"] = min_new_tokens
    if stopping_criteria is not None:
        extra["stopping_criteria"] = stopping_criteria
    on_gpu = input_ids.device.type == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(input_ids.device)
    start = time.perf_counter()
    with attach(model, cache):
        output = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            cache=cache,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            pad_token_id=tokenizer.pad_token_id,
            **extra,
        )
    seconds = time.perf_counter() - start
    eos = getattr(tokenizer, "eos_token_id", None)
    stops = set(eos_token_ids or []) | ({eos} if eos is not None else set())
    rows = [_until_stop(row.tolist(), stops) for row in output[:, input_ids.shape[-1]:]]
    return Generation(
        texts=tuple(tokenizer.decode(row, skip_special_tokens=True) for row in rows),
        new_tokens=tuple(len(row) for row in rows),
        seconds=seconds,
        cache_nbytes=int(cache.nbytes()),
        cache_allocated_nbytes=int(cache.allocated_nbytes()),
        memory_ratio=float(cache.memory_ratio()),
        peak_memory_ratio=float(cache.peak_memory_ratio()),
        mean_memory_ratio=float(cache.mean_memory_ratio()),
        bits_per_value=float(cache.bits_per_value()),
        compression_ratio=float(cache.compression_ratio()),
        attention_path=cache.attention_path(),
        gpu_peak_bytes=int(torch.cuda.max_memory_allocated(input_ids.device)) if on_gpu else None,
    )


def _until_stop(tokens: list[int], stops: set[int]) -> list[int]:
    """The generated tokens before the first stop token (the padding after it in a batch is dropped too)."""
    for index, token in enumerate(tokens):
        if token in stops:
            return tokens[:index]
    return tokens


@torch.inference_mode()
def answer_logprobs(loaded: LoadedModel, input_ids: torch.Tensor, answers: Sequence[Sequence[int]],
                    cache_method: str, options: Mapping[str, Any]) -> list[float]:
    """Teacher-forced ``log p(answer | prompt)`` per row under a fresh ``cache_method`` cache (nats, summed over
    the answer's tokens): the prompt is prefilled into the cache, then every answer token is scored against the
    compressed past, all in one forward pass, or one token per pass where layers store different numbers of
    tokens (PyramidKV: one causal mask cannot fit every layer). Answers of different lengths are right-padded;
    padding comes after every scored token, so causal attention keeps it out. Rows with an empty answer get NaN.
    The workspace read path is used (the same scores as the fused kernel's up to rounding)."""
    model = loaded.model
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    if len(answers) != input_ids.shape[0]:
        raise ValueError(f"{len(answers)} answers for {input_ids.shape[0]} prompts")
    width = max((len(a) for a in answers), default=0)
    if width == 0:
        return [float("nan")] * len(answers)
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0
    answer_ids = torch.tensor([list(a) + [pad] * (width - len(a)) for a in answers], device=device)
    lengths = {"context_length": int(input_ids.shape[1]), "max_new_tokens": width}
    cache = build_cache(cache_method, model.config, **{**lengths, **options})
    with attach(model, cache):
        steps = [model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1:]]
        if len({layer.stored_tokens() for layer in cache.layers}) == 1:
            steps.append(model(input_ids=answer_ids[:, :-1], cache=cache, use_cache=True).logits)
        else:
            steps += [model(input_ids=answer_ids[:, i:i + 1], cache=cache, use_cache=True).logits
                      for i in range(width - 1)]
    logits = torch.cat(steps, dim=1).float().log_softmax(dim=-1)
    picked = logits.gather(-1, answer_ids.unsqueeze(-1)).squeeze(-1)
    return [float(picked[row, : len(a)].sum()) if len(a) else float("nan") for row, a in enumerate(answers)]
