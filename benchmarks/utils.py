"""What every benchmark shares: the timer, the byte floor, the result row, random packed inputs, the report table.

Method (``benchmarks/NOTES.md``): every op is first checked against its float64 torch reference on fresh random
inputs, then timed by :class:`Timer` (``triton.testing.do_bench`` median, L2 flushed between repetitions). Its
*floor* is the bytes it must move at the device-to-device copy bandwidth measured in the same run
(:func:`copy_bandwidth`), and its *baseline* a PyTorch path timed in the same run, so every ratio compares
numbers from one process on one GPU.
"""
from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import torch

__all__ = [
    "DTYPES", "HEADS_KV", "HEADS_Q", "HEAD_DIM", "Bench", "Row", "Timer", "captured", "compiled_kernels",
    "copy_bandwidth", "device_name",
    "gpu_busy_us", "kernel_kwargs", "failed_row", "skip_off_gpu", "markdown_table", "random_norms", "random_packed", "rel_err",
]

# attention shapes of the benchmarks: Llama-3.1-8B's 32 query / 8 KV heads of dimension 128
HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclasses.dataclass
class Row:
    """One timed measurement; ``floor_us`` = bytes that must move at the measured copy bandwidth."""

    op: str
    variant: str
    size: str
    time_us: float
    bytes_moved: int
    floor_us: float
    baseline: str = ""
    baseline_us: float = float("nan")
    check: str = ""

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(gbps=round(self.bytes_moved / self.time_us / 1e3, 1),
                   fraction_of_floor=round(self.floor_us / self.time_us, 3),
                   speedup_vs_baseline=round(self.baseline_us / self.time_us, 3))
        return out


def captured(fn: Callable[[], Any]) -> Callable[[], None]:
    """``fn`` (wrapper, launches and all) captured in a CUDA graph, after two warm-up calls on a side stream; returns
    the graph's replay. Whatever ``fn`` does on the host happens three times, at capture included; its device work
    then happens once per replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


class Timer:
    """Median time in µs: ``do_bench`` on CUDA (L2 flushed between repetitions), wall clock in the interpreter.

    ``graph=True`` captures ``fn`` (wrapper, launches and all) in a CUDA graph and times its replay: device
    time without the Python and launch overhead, which dominates at small sizes.
    """

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, fn: Callable[[], Any], graph: bool = False) -> float:
        if graph and self.device.type == "cuda":
            fn = captured(fn)
        if self.device.type == "cuda":
            import triton.testing

            return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        fn()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1e6 * float(np.median(times))


@dataclasses.dataclass
class Bench:
    """What every op needs: the timer, the device and the copy bandwidth measured in this run (bytes/s)."""

    timer: Timer
    device: torch.device
    copy_bw: float

    @classmethod
    def measure(cls, device: torch.device, copy_bytes: int) -> Bench:
        """A bench on ``device`` whose floor is a ``copy_bytes`` device-to-device copy timed now."""
        timer = Timer(device)
        return cls(timer, device, copy_bandwidth(timer, device, copy_bytes))

    def floor_us(self, n_bytes: int) -> float:
        return 1e6 * n_bytes / self.copy_bw


def copy_bandwidth(timer: Timer, device: torch.device, n_bytes: int) -> float:
    """Bytes read + written per second by a device-to-device copy of ``n_bytes``."""
    src = torch.randint(0, 255, (n_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src))
    return 2 * n_bytes / (t * 1e-6)


def device_name(device: torch.device) -> str:
    """The GPU's name, or ``CPU interpreter (<machine>)`` for the CPU (``TRITON_INTERPRET=1``)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU interpreter ({platform.machine()})"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN when ``out`` is not finite."""
    out, ref = out.to(torch.float64), ref.to(torch.float64)
    if not torch.isfinite(out).all():
        return float("nan")
    return float((out - ref).norm() / ref.norm())


def kernel_kwargs(variant: dict[str, Any]) -> dict[str, Any]:
    """A config variant as kernel keyword arguments (dtype names become torch dtypes)."""
    return {k: DTYPES[v] if k.endswith("dtype") else v for k, v in dict(variant).items()}


def skip_off_gpu(op: str, name: str, kw: dict[str, Any], device: torch.device) -> bool:
    """True (and says so) for a variant whose decoder is inline PTX, or whose kernel is Gluon, when not on CUDA: the
    interpreter runs neither."""
    if ((str(kw.get("decoder")).startswith(("prmt", "lut")) or kw.get("kernel") in ("mma", "wgmma"))
            and device.type != "cuda"):
        print(f"  {op} {name}: skipped (inline PTX and Gluon need a GPU)")
        return True
    return False


def failed_row(op: str, variant: str, size: str, error: Exception) -> Row:
    """The row of a variant that failed its reference check or did not compile: no time, the reason in ``check``
    (so that one failing variant does not cost the rest of a GPU run; the failure is printed too)."""
    reason = f"FAILED: {type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
    print(f"  {op} {variant} {size}: {reason}", flush=True)
    return Row(op, variant, size, float("nan"), 0, float("nan"), check=reason)


def random_packed(shape: tuple[int, ...], dim: int, bits: int, device: torch.device) -> torch.Tensor:
    """Uniform random codes, packed: uniform random bytes are exactly that (the last byte's spare bits zeroed)."""
    row_bytes = -(-dim * bits // 8)
    packed = torch.randint(0, 256, (*shape, row_bytes), dtype=torch.uint8, device=device)
    spare = row_bytes * 8 - dim * bits
    if spare:
        packed[..., -1] &= (1 << (8 - spare)) - 1
    return packed


def random_norms(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """fp16 norms uniform in [1, 11)."""
    return (torch.rand(*shape, device=device) * 10 + 1).to(torch.float16)


def gpu_busy_us(fn: Callable[[], Any], calls: int = 3) -> float:
    """Device time per call (µs): the kernels' summed self time under ``torch.profiler``, host gaps excluded;
    what the same work costs once launches are free (CUDA graphs, a static cache). NaN off CUDA."""
    if not torch.cuda.is_available():
        return float("nan")
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    total = sum(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) for e in events)
    return total / calls


def compiled_kernels() -> int:
    """Triton kernels compiled so far in this process: every specialization of every ``@triton.jit`` function of
    ``turboquant.kernels`` (0 under the interpreter, which compiles nothing)."""
    import sys

    count = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("turboquant.kernels"):
            continue
        for value in vars(module).values():
            for cache in getattr(value, "device_caches", {}).values():
                count += len(cache[0])
    return count


def markdown_table(frame: pd.DataFrame) -> str:
    """The rows of :meth:`Row.as_dict` as a Markdown table."""
    lines = ["| op | variant | size | time µs | GB/s | floor µs | floor/time | baseline | baseline µs | speedup "
             "| check |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in frame.itertuples():
        check = "" if pd.isna(r.check) else r.check
        lines.append(f"| {r.op} | {r.variant} | {r.size} | {r.time_us:.1f} | {r.gbps:.0f} | {r.floor_us:.1f} | "
                     f"{r.fraction_of_floor:.2f} | {r.baseline} | {r.baseline_us:.1f} | {r.speedup_vs_baseline:.2f} | "
                     f"{check} |")
    return "\n".join(lines)
