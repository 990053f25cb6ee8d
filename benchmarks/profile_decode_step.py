"""Where a decode step's time goes, and the quantize kernel's resources (session-2 diagnostics, one H200).

    python -m benchmarks.profile_decode_step

For the full 16-bit cache, the TurboQuant cache read through its workspace and the same cache read by the fused
kernel (4-bit K/V, B=8, 32K tokens, the 4-layer model of :func:`benchmarks.bench_decode_step.decode_step_model`):
wall and CUDA-event ms per step, memory, and the torch.profiler tables sorted by CUDA and by CPU time. Then the
registers, spills and shared memory of the quantize kernel variants it compiles. Output of session 2:
``results/kernels/session2/profile_decode_step_torch_profiler.txt``.

    python -m benchmarks.profile_decode_step host [TOKENS]

The host side of fused decode steps (B=8, default 8K tokens), per cache configuration (4-bit K/V without a
window, the same with the 128-token window, the 3.5-bit preset): wall ms per step, the CUDA synchronisations one
step makes with the Python line that makes each (``torch.cuda.set_sync_debug_mode``), and the functions with the
most cumulative host time under ``cProfile``.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
import warnings
from collections import Counter

import torch

from .bench_decode_step import decode_step, decode_step_model, fill_cache
from .utils import HEAD_DIM


def _timed(model, token, cache, fused: bool, steps: int = 10) -> tuple[float, float]:
    """(wall ms, CUDA-event ms) per step after three warm-up steps."""
    for _ in range(3):
        decode_step(model, token, cache, fused)
    torch.cuda.synchronize()
    start_wall = time.perf_counter()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        decode_step(model, token, cache, fused)
    stop.record()
    torch.cuda.synchronize()
    return (time.perf_counter() - start_wall) / steps * 1e3, start.elapsed_time(stop) / steps


def _model_and_token(batch: int, device: torch.device) -> tuple[torch.nn.Module, torch.Tensor]:
    """Four Llama-3.1-8B-shaped layers (random weights) and one random token per batch row."""
    from omegaconf import OmegaConf

    model = decode_step_model(OmegaConf.create({"layers": 4, "intermediate_size": 14336, "vocab_size": 32000}),
                              device)
    return model, torch.randint(0, 32000, (batch, 1), device=device)


def profile_caches(batch: int = 8, tokens: int = 32768) -> None:
    import transformers
    from torch.profiler import ProfilerActivity, profile

    from turboquant.kvcache import build_cache

    device = torch.device("cuda")
    model, token = _model_and_token(batch, device)
    caches = {
        "full": transformers.DynamicCache,
        "workspace": lambda: build_cache("turboquant", model.config, key_bits=4, value_bits=4),
        "fused": lambda: build_cache("turboquant", model.config, fused_decode=True, key_bits=4, value_bits=4),
    }
    for name, make in caches.items():
        cache = make()
        fill_cache(cache, model, batch, tokens, device)
        wall, events = _timed(model, token, cache, name == "fused")
        print(f"{name}: wall {wall:.2f} ms/step, events {events:.2f} ms/step, mem "
              f"{torch.cuda.memory_allocated() / 1e9:.1f} GB reserved {torch.cuda.memory_reserved() / 1e9:.1f} GB",
              flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                decode_step(model, token, cache, name == "fused")
            torch.cuda.synchronize()
        for key in ("cuda_time_total", "cpu_time_total"):
            print(prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=60), flush=True)
        del cache
        torch.cuda.empty_cache()


def quantize_kernel_resources() -> None:
    """Registers, spills and shared memory of the quantize kernel variants compiled in this process."""
    import turboquant as tq
    from turboquant.kernels.quantize import _quantize_mse_kernel, quantize_mse_triton

    device = torch.device("cuda")
    codebook = tq.lloyd_max_codebook(HEAD_DIM, 4)
    rotation = tq.make_rotation("haar", HEAD_DIM, seed=0, device=device).matrix()
    x = torch.randn(1 << 20, HEAD_DIM, device=device, dtype=torch.float16)
    for options in ({}, {"num_stages": 1}, {"block_n": 32, "num_stages": 2},
                    {"block_n": 128, "num_warps": 8, "num_stages": 2}, {"block_n": 16, "num_stages": 2}):
        quantize_mse_triton(x, rotation, codebook.boundaries, 4, **options)
    torch.cuda.synchronize()
    try:
        for entry in _quantize_mse_kernel.device_caches.values():
            for key, kernel in entry[0].items():
                md = kernel.metadata
                print("quantize kernel:", "block_n", [c for c in str(key).split(",") if "BLOCK_N" in c][:1],
                      "warps", md.num_warps, "stages", md.num_stages, "regs", kernel.n_regs, "spills",
                      kernel.n_spills, "shared", md.shared)
    except Exception as exc:  # noqa: BLE001 - a diagnostic: report and go on
        print("no resource report:", repr(exc))


def sync_sites(step) -> Counter:
    """(file:line -> count) of the CUDA synchronisations that ``step()`` makes, by the Python line making each."""
    sites: Counter = Counter()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for warning in caught:
        if "synchroniz" in str(warning.message):
            sites[f"{warning.filename}:{warning.lineno}"] += 1
    return sites


def host_profile(batch: int = 8, tokens: int = 8192, steps: int = 5) -> None:
    """Wall time, synchronisations and cProfile's top functions of fused decode steps, per configuration."""
    from turboquant.kvcache import build_cache

    device = torch.device("cuda")
    model, token = _model_and_token(batch, device)
    configs = {
        "fused 4-bit K/V, no window": {"key_bits": 4, "value_bits": 4},
        "fused 4-bit K/V, 128-token window": {"key_bits": 4, "value_bits": 4, "residual_length": 128},
        "fused 3.5-bit preset, 128-token window": {"bits": 3.5, "residual_length": 128},
    }
    for name, options in configs.items():
        cache = build_cache("turboquant", model.config, fused_decode=True, **options)
        fill_cache(cache, model, batch, tokens, device)
        wall, events = _timed(model, token, cache, True)
        sites = sync_sites(lambda: decode_step(model, token, cache, True))
        print(f"{name}: wall {wall:.2f} ms/step, GPU events {events:.2f} ms/step, "
              f"{sum(sites.values())} synchronisations per step", flush=True)
        for site, count in sites.most_common(12):
            print(f"    {count:3d} x {site}")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            decode_step(model, token, cache, True)
        torch.cuda.synchronize()
        profiler.disable()
        for order, label, rows in (("cumulative", "cumulative", 30), ("tottime", "own time", 20)):
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(rows)
            print(f"cProfile of {steps} steps ({label}):\n{text.getvalue()}", flush=True)
        del cache
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1:2] == ["host"]:
        host_profile(tokens=int(sys.argv[2]) if len(sys.argv) > 2 else 8192)
    else:
        profile_caches()
        quantize_kernel_resources()
