"""decode_step op: one generated token of a randomly initialised Llama-architecture model (built from a config,
nothing downloaded) with a TurboQuant cache read through the fused kernel (:mod:`turboquant.kvcache.fused_attention`),
with the same cache read through its decoded workspace and ``sdpa``, and with the full 16-bit cache
(``transformers.DynamicCache``); a variant with ``graph: true`` also times the step captured in a CUDA graph over a
static store (``capacity=``), against transformers' ``StaticCache`` captured the same way:
``python run.py experiment=kernels 'experiment.ops=[decode_step]'``."""
from __future__ import annotations

import contextlib
from functools import partial
from collections.abc import Callable
from typing import Any

import torch

from .utils import HEAD_DIM, HEADS_KV, HEADS_Q, Bench, Row, captured, failed_row, gpu_busy_us, rel_err

__all__ = ["bench_decode_step", "decode_step", "decode_step_model", "fill_cache", "graphed_step"]

#: Tokens a graphed step's store holds beyond the context: every replay (the timer's and the profiler's, about 100-400
#: at these sizes) writes one.
GRAPH_MARGIN = 1024


def decode_step_model(sizes: Any, device: torch.device) -> torch.nn.Module:
    """A randomly initialised Llama-architecture model (32 q / 8 KV heads, d = 128) in bf16 (fp32 on the CPU)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=int(sizes.vocab_size), hidden_size=HEADS_Q * HEAD_DIM,
        intermediate_size=int(sizes.intermediate_size),
        num_hidden_layers=int(sizes.layers), num_attention_heads=HEADS_Q, num_key_value_heads=HEADS_KV,
        head_dim=HEAD_DIM, max_position_embeddings=1 << 18, attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config)
    return model.to(torch.bfloat16 if device.type == "cuda" else torch.float32).eval()



def fill_cache(cache: Any, model: torch.nn.Module, batch: int, context: int, device: torch.device) -> None:
    """Write ``context`` random key/value tokens into every layer (what a prefill stores, minus the model)."""
    dtype = next(model.parameters()).dtype
    gen = torch.Generator(device=device).manual_seed(1)
    for layer in range(model.config.num_hidden_layers):
        keys = torch.randn(batch, HEADS_KV, context, HEAD_DIM, device=device, dtype=dtype, generator=gen)
        cache.update(keys, torch.randn(keys.shape, device=device, dtype=dtype, generator=gen), layer)



def decode_step(model: torch.nn.Module, token: torch.Tensor, cache: Any, fused: bool = False,
                any_sdpa_backend: bool = False, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Logits (float32) of one decode step of ``token`` (B, 1) through ``cache`` (fused attention if asked), at
    ``position_ids`` (B, 1) when given (else the cache's length, read on the host).

    sdpa runs without its cuDNN backend unless ``any_sdpa_backend``: cuDNN builds a new execution plan for
    every new key length (about 11 ms per call on the H200 here, measured with torch.profiler), i.e. at every
    generated token, which would swamp what is compared.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from turboquant.kvcache import attach

    backends = contextlib.nullcontext() if any_sdpa_backend else sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    context = attach(model, cache) if fused else contextlib.nullcontext()
    with torch.no_grad(), backends, context:
        return model(token, past_key_values=cache, position_ids=position_ids).logits[:, -1].float()


def graphed_step(model: torch.nn.Module, token: torch.Tensor, cache: Any, context: int,
                 fused: bool = False) -> Callable[[], None]:
    """One decode step of ``token`` after ``context`` tokens, captured in a CUDA graph (:func:`captured`): its
    position is a device tensor the step advances, so each replay is the next position over a store one token longer
    (a static one: ``StaticCache``, or a TurboQuant cache built with ``capacity``). Returns the replay."""
    position = torch.full((token.shape[0], 1), context, dtype=torch.long, device=token.device)

    def step() -> None:
        decode_step(model, token, cache, fused=fused, position_ids=position)
        position.add_(1)
    return captured(step)



def bench_decode_step(bench: Bench, sizes: Any, variants: dict[str, dict]) -> list[Row]:
    """One greedy decode step of the whole model per cache: fused kernel vs workspace + sdpa vs 16-bit cache.

    Each variant names TurboQuant cache options; every variant's fused step is checked against its workspace
    step (same packed store) before timing. Two times per configuration: ``wall`` (do_bench: events around
    the step, which equal wall time when the host is the bottleneck, as at these sizes in eager mode) and
    ``GPU busy`` (:func:`gpu_busy_us`). Both include the cache update (quantizing the new token and appending
    it, which ``DynamicCache`` and ``QuantizedStream`` do by concatenation) and reading the weights.

    A variant with ``graph: true`` is also built over a static store (``capacity`` = context + :data:`GRAPH_MARGIN`),
    checked eagerly against the same workspace step, and its step captured in a CUDA graph (:func:`graphed_step`): wall
    and GPU busy of the replay, against ``transformers.StaticCache`` (the same capacity) captured the same way. The
    GPU-busy row's baseline is the same replay's wall time, so its speed-up column is wall / busy.
    """
    import transformers

    from turboquant.kvcache import build_cache

    model = decode_step_model(sizes, bench.device)
    rows, device = [], bench.device
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    graphs = device.type == "cuda" and any(options.get("graph") for options in variants.values())
    for bsz, ctx in sizes.batch_context:
        size = f"B={bsz} ctx={ctx} layers={model.config.num_hidden_layers}"
        token = torch.randint(0, model.config.vocab_size, (bsz, 1), device=device)
        step = partial(decode_step, model, token)
        full = transformers.DynamicCache()
        fill_cache(full, model, bsz, ctx, device)
        full_bytes = 2 * bsz * HEADS_KV * ctx * HEAD_DIM * 2 * model.config.num_hidden_layers + weights
        t_full, busy_full = bench.timer(partial(step, full)), gpu_busy_us(partial(step, full))
        t_cudnn = bench.timer(partial(step, full, any_sdpa_backend=True))
        base = "full 16-bit, wall"
        for label, t, baseline, t_base in (
            ("full 16-bit cache (DynamicCache + sdpa), wall", t_full, base, t_full),
            ("full 16-bit cache (DynamicCache + sdpa incl. cuDNN), wall", t_cudnn, base, t_full),
            ("full 16-bit cache (DynamicCache + sdpa), GPU busy", busy_full, "full 16-bit, GPU busy", busy_full),
        ):
            rows.append(Row("decode_step", label, size, t, full_bytes, bench.floor_us(full_bytes), baseline, t_base,
                            "bytes: K/V + weights"))
        del full
        graph_base = "full 16-bit (StaticCache), CUDA graph, wall"
        t_graph_full = float("nan")
        if graphs:
            static_full = transformers.StaticCache(config=model.config, max_cache_len=ctx + GRAPH_MARGIN)
            fill_cache(static_full, model, bsz, ctx, device)
            label = "full 16-bit cache (StaticCache + sdpa)"
            rows += _graph_rows(bench, label, size, partial(graphed_step, model, token, static_full, ctx), full_bytes,
                                base, t_full, "bytes: K/V + weights; reads its whole capacity under a mask")
            t_graph_full = rows[-2].time_us
            del static_full
        for name, options in variants.items():
            options = dict(options)
            graph = bool(options.pop("graph", False))
            workspace = build_cache("turboquant", model.config, **options)
            fused = build_cache("turboquant", model.config, fused_decode=True, **options)
            for cache in (workspace, fused):
                fill_cache(cache, model, bsz, ctx, device)
            reference = step(workspace)
            err = rel_err(step(fused, fused=True), reference)
            if not err < 2e-2:
                raise AssertionError(f"decode_step {name}: fused vs workspace logits rel err {err}")
            moved = fused.nbytes() + weights
            check = f"logits vs workspace rel err {err:.1e}; cache {fused.bits_per_value():.2f} bits/value"
            times = {
                "workspace + sdpa": (bench.timer(partial(step, workspace)), gpu_busy_us(partial(step, workspace))),
                "fused kernel": (bench.timer(partial(step, fused, fused=True)),
                                 gpu_busy_us(partial(step, fused, fused=True))),
            }
            del workspace, fused
            for path, (wall, busy) in times.items():
                rows.append(Row("decode_step", f"TurboQuant {name}, {path}, wall", size, wall, moved,
                                bench.floor_us(moved), base, t_full, check))
                rows.append(Row("decode_step", f"TurboQuant {name}, {path}, GPU busy", size, busy, moved,
                                bench.floor_us(moved), "full 16-bit, GPU busy", busy_full, check))
            if graph and graphs:
                static = build_cache("turboquant", model.config, fused_decode=True, capacity=ctx + GRAPH_MARGIN,
                                     **options)
                fill_cache(static, model, bsz, ctx, device)
                err = rel_err(step(static, fused=True), reference)  # one token written: the next is at ctx + 1
                if not err < 2e-2:
                    raise AssertionError(f"decode_step {name}: static store vs workspace logits rel err {err}")
                check = f"static store: logits vs workspace rel err {err:.1e}"
                rows += _graph_rows(bench, f"TurboQuant {name}, fused kernel", size,
                                    partial(graphed_step, model, token, static, ctx + 1, fused=True), moved,
                                    graph_base, t_graph_full, check,
                                    after=lambda: [layer.after_graph_replays() for layer in static.layers])
                del static
    return rows


def _graph_rows(bench: Bench, label: str, size: str, capture: Callable[[], Callable[[], None]], moved: int,
                baseline: str, baseline_us: float, check: str, after: Callable[[], Any] | None = None) -> list[Row]:
    """The wall and GPU-busy rows of a step captured by ``capture()``, the busy row against the same wall; ``after``
    runs after the replays (a static store's records of what its replays met, raised there). A failed capture or
    check is recorded as two failed rows, and the run goes on."""
    try:
        replay = capture()
        wall, busy = bench.timer(replay), gpu_busy_us(replay)
        if after is not None:
            after()
    except Exception as exc:  # a capture that reads the host, a kernel that fails in a graph, a replay's record
        return [failed_row("decode_step", f"{label}, CUDA graph, {kind}", size, exc) for kind in ("wall", "GPU busy")]
    return [Row("decode_step", f"{label}, CUDA graph, wall", size, wall, moved, bench.floor_us(moved), baseline,
                baseline_us, check),
            Row("decode_step", f"{label}, CUDA graph, GPU busy", size, busy, moved, bench.floor_us(moved),
                "its CUDA-graph wall", wall, check)]
