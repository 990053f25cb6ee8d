"""Triton kernel benchmark (issue 4): every kernel against its byte floor and PyTorch baselines of the same run.

    python run.py experiment=kernels                           # one CUDA GPU (an H200: see benchmarks/NOTES.md)
    python run.py experiment=kernels scale=paper               # the issue's largest sizes too (128K context)
    python run.py experiment=kernels 'experiment.ops=[decode_step]'
    TRITON_INTERPRET=1 python run.py experiment=kernels experiment.smoke=true   # CPU: checks the code path only

For every op and size the kernel is first checked against its float64 torch reference on fresh random
inputs (the run stops otherwise), then timed with ``triton.testing.do_bench`` (median, L2 flushed between
repetitions). Each row gives the time, the achieved GB/s (bytes that must move / time), the floor (those
bytes at the device-to-device copy bandwidth measured in this run) and the ratio to a baseline timed in
this run:

- ``quantize`` / ``prod``: fused TurboQuant_mse / TurboQuant_prod quantization vs the copy floor;
- ``library``: the kernels vs the library's torch path on the same GPU (what backend dispatch replaces);
- ``scores``: attention logits from packed 4/3-bit keys vs ``torch.matmul`` with fp32 and with bf16 keys;
- ``decode``: split-KV decode attention over a packed cache vs ``scaled_dot_product_attention`` over a bf16
  cache (the fastest backend that runs);
- ``decode_step``: one generated token of a randomly initialised Llama-architecture model (built from a
  config, nothing downloaded) with a TurboQuant cache read through the fused kernel
  (:mod:`turboquant.kvcache.fused_attention`), with the same cache read through its decoded workspace and
  ``sdpa``, and with the full 16-bit cache (``transformers.DynamicCache``).

Results: ``results/kernels/results.csv`` (one unit per op and GPU; a killed run resumes at the next op) and
``results/kernels/kernels.md`` (command, GPU, versions, copy bandwidth, the table). The library knows nothing
of this module; the measurements are plain functions of sizes and variants given in
``configs/experiment/kernels.yaml``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from experiments.io import ResultStore, experiment_sizes

__all__ = ["Row", "markdown_table", "paper_comparison", "plot", "require_kernel_device", "run"]

HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


# ----------------------------------------------------------------------------------------------- basics
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


class Timer:
    """Median time in µs: ``do_bench`` on CUDA (L2 flushed between repetitions), wall clock in the interpreter.

    ``graph=True`` captures ``fn`` (wrapper, launches and all) in a CUDA graph and times its replay: device
    time without the Python and launch overhead, which dominates at small sizes.
    """

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, fn: Callable[[], Any], graph: bool = False) -> float:
        if graph and self.device.type == "cuda":
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn()
                fn()
            torch.cuda.current_stream().wait_stream(stream)
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured):
                fn()
            fn = captured.replay
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

    def floor_us(self, n_bytes: int) -> float:
        return 1e6 * n_bytes / self.copy_bw


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.to(torch.float64), ref.to(torch.float64)
    if not torch.isfinite(out).all():
        return float("nan")
    return float((out - ref).norm() / ref.norm())


def copy_bandwidth(timer: Timer, device: torch.device, n_bytes: int) -> float:
    """Bytes read + written per second by a device-to-device copy of ``n_bytes``."""
    src = torch.randint(0, 255, (n_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src))
    return 2 * n_bytes / (t * 1e-6)


def kernel_kwargs(variant: dict[str, Any]) -> dict[str, Any]:
    """A config variant as kernel keyword arguments (dtype names become torch dtypes)."""
    return {k: DTYPES[v] if k.endswith("dtype") else v for k, v in dict(variant).items()}


def random_packed(shape: tuple[int, ...], dim: int, bits: int, device: torch.device) -> torch.Tensor:
    """Uniform random codes, packed: uniform random bytes are exactly that (the last byte's spare bits zeroed)."""
    row_bytes = -(-dim * bits // 8)
    packed = torch.randint(0, 256, (*shape, row_bytes), dtype=torch.uint8, device=device)
    spare = row_bytes * 8 - dim * bits
    if spare:
        packed[..., -1] &= (1 << (8 - spare)) - 1
    return packed


def random_norms(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return (torch.rand(*shape, device=device) * 10 + 1).to(torch.float16)


# ----------------------------------------------------------------------------------------------- quantize
def check_quantize(x, rot, cb, bits, **kw) -> str:
    """Tie-aware code check + norm error on ``x`` (fresh data)."""
    from turboquant.kernels.quantize import quantize_mse_reference, quantize_mse_triton
    from turboquant.packing import unpack_codes

    codes, norms = quantize_mse_triton(x, rot, cb.boundaries, bits, norms_dtype=torch.float32, **kw)
    ref_codes, ref_norms, y = quantize_mse_reference(x, rot, cb.boundaries, bits)
    dim = x.shape[-1]
    got = unpack_codes(codes, bits, dim).long()
    want = unpack_codes(ref_codes, bits, dim).long()
    wrong = got != want
    gap = (y[..., None] - torch.as_tensor(cb.boundaries, device=x.device)).abs().min(dim=-1).values
    bad = wrong & ((gap > 2e-3) | ((got - want).abs() > 1))
    if bad.any():
        raise AssertionError(f"quantize {kw}: {int(bad.sum())} codes wrong away from a midpoint")
    norm_err = float(((norms.double() - ref_norms) / ref_norms.clamp_min(1e-30)).abs().max())
    if norm_err > 1e-5:
        raise AssertionError(f"quantize: norm error {norm_err}")
    return f"ties {float(wrong.double().mean()):.1e}, norm err {norm_err:.1e}"


def bench_quantize(bench: Bench, sizes: Any, variants: dict[str, dict]) -> list[Row]:
    """Every variant at the first (dim, bits) and dtype; the first variant at the other widths and dtypes."""
    from turboquant.codebook import lloyd_max_codebook
    from turboquant.kernels.quantize import quantize_mse_triton
    from turboquant.rotation import make_rotation

    rows = []
    n = int(sizes.vectors)
    dims_bits = [tuple(pair) for pair in sizes.dims_bits]
    dtypes = [DTYPES[name] for name in sizes.dtypes]
    first = dict(list(variants.items())[:1])
    cases = [(dims_bits[0], dtypes[0], variants)] + [(db, dtypes[0], first) for db in dims_bits[1:]]
    cases += [(dims_bits[0], dtype, first) for dtype in dtypes[1:]]
    for (dim, bits), dtype, chosen in cases:
        cb = lloyd_max_codebook(dim, bits)
        rot = make_rotation("haar", dim, seed=0, device=bench.device).matrix()
        x = torch.randn(n, dim, device=bench.device, dtype=dtype)
        moved = x.numel() * x.element_size() + n * (-(-dim * bits // 8) + 2)
        for name, variant in chosen.items():
            kw = kernel_kwargs(variant)
            check = "diagnostic (no nearest-centroid step)" if not kw.get("lookup", True) else check_quantize(
                torch.randn(min(n, 1 << 16), dim, device=bench.device).to(dtype) * 3, rot, cb, bits, **kw)
            t = bench.timer(partial(quantize_mse_triton, x, rot, cb.boundaries, bits, norms_dtype=torch.float16, **kw))
            rows.append(Row("quantize", f"b={bits} {str(dtype)[6:]} {name}", f"{n}x{dim}", t, moved,
                            bench.floor_us(moved), "copy", bench.floor_us(moved), check))
        del x
    return rows


def bench_quantize_prod(bench: Bench, sizes: Any, variants: dict[str, dict]) -> list[Row]:
    """TurboQuant_prod ((b-1)-bit codes + QJL signs + two norms) from fp16, checked against float64 first."""
    from turboquant.kernels.quantize_prod import (
        quantize_prod_reference,
        quantize_prod_triton,
    )
    from turboquant.quantizers import TurboQuantProd

    rows = []
    n, dim = int(sizes.vectors), int(sizes.dim)
    for bits in sizes.bits:
        quantizer = TurboQuantProd(dim, bits, rotation="haar", seed=0, device=bench.device)
        mse = quantizer.mse
        args = (mse.rotation.matrix(), mse.codebook.boundaries, mse.codebook.centroids_tensor(bench.device))
        s = quantizer.qjl.matrix
        x = torch.randn(min(n, 1 << 16), dim, device=bench.device).to(torch.float16)
        codes, signs, _, residual_norms = quantize_prod_triton(x, *args, bits - 1, s)
        ref = quantize_prod_reference(x, *args, bits - 1, s)
        code_ties = float((codes != ref["codes"]).double().mean())
        same = (codes == ref["codes"]).all(dim=-1)
        sign_flips = float((signs[same] != ref["signs"][same]).double().mean())
        res_err = float(((residual_norms.double() - ref["residual_norms"]).abs()[same]
                         / ref["residual_norms"][same]).max())
        if code_ties > 0.01 or sign_flips > 0.01 or res_err > 2e-2:
            raise AssertionError(f"quantize_prod b={bits}: ties {code_ties}, sign flips {sign_flips}, "
                                 f"residual norm err {res_err}")
        x = torch.randn(n, dim, device=bench.device, dtype=torch.float16)
        moved = x.numel() * 2 + n * (codes.shape[-1] + signs.shape[-1] + 4)
        t = bench.timer(partial(quantize_prod_triton, x, *args, bits - 1, s, norms_dtype=torch.float16))
        rows.append(Row("quantize_prod", f"b={bits} float16", f"{n}x{dim}", t, moved, bench.floor_us(moved),
                        "copy", bench.floor_us(moved),
                        f"code ties {code_ties:.1e}, sign flips {sign_flips:.1e}, residual-norm err {res_err:.1e}"))
        del x
    return rows


def bench_library_paths(bench: Bench, sizes: Any, variants: dict[str, dict]) -> list[Row]:
    """The kernels against the library's torch path on the same GPU (what backend dispatch replaces)."""
    from turboquant.kernels.quantize import quantize_mse_triton
    from turboquant.kernels.scores import mse_scores_triton
    from turboquant.quantizers import TurboQuantMSE

    n, dim, bits = int(sizes.vectors), int(sizes.dim), int(sizes.bits)
    quantizer = TurboQuantMSE(dim, bits, rotation="haar", seed=0, device=bench.device, backend="torch")
    rotation, boundaries = quantizer.rotation.matrix(), quantizer.codebook.boundaries
    x = torch.randn(n, dim, device=bench.device, dtype=torch.float16)
    qv = quantizer.quantize(x)
    moved = x.numel() * 2 + n * (qv.codes.shape[-1] + 4)
    t_torch = bench.timer(lambda: quantizer.quantize(x))
    t_kernel = bench.timer(lambda: quantize_mse_triton(x, rotation, boundaries, bits))
    rows = [Row("quantize vs library", f"b={bits} float16, float32 norms", f"{n}x{dim}", t_kernel, moved,
                bench.floor_us(moved), "TurboQuantMSE.quantize (torch)", t_torch, "")]
    queries = torch.randn(32, dim, device=bench.device)
    t_torch = bench.timer(lambda: quantizer.inner_product(queries, qv))
    centroids = quantizer.codebook.centroids_tensor(bench.device)
    t_kernel = bench.timer(lambda: mse_scores_triton(quantizer.rotation.apply(queries)[None], qv.codes[None],
                                                     qv.norms[None], centroids, bits))
    moved = qv.codes.numel() + qv.norms.numel() * 4 + 32 * n * 4
    rows.append(Row("scores vs library", f"b={bits}, 32 queries", f"{n}x{dim}", t_kernel, moved,
                    bench.floor_us(moved), "TurboQuantMSE.inner_product (torch)", t_torch, ""))
    return rows


# ----------------------------------------------------------------------------------------------- scores
def bench_scores(bench: Bench, sizes: Any, variants: dict[str, dict]) -> list[Row]:
    """Logits of the 4 query heads of each KV head against packed keys vs fp32 / bf16 ``torch.matmul``."""
    from turboquant.codebook import lloyd_max_codebook
    from turboquant.kernels.scores import mse_scores_reference, mse_scores_triton

    rows = []
    group, device = HEADS_Q // HEADS_KV, bench.device
    for bsz, ctx in sizes.batch_context:
        batch = bsz * HEADS_KV
        q = torch.randn(batch, group, HEAD_DIM, device=device)
        baselines = {}
        for name, dtype in (("fp32 matmul", torch.float32), ("bf16 matmul", torch.bfloat16)):
            keys, q_cast = torch.randn(batch, ctx, HEAD_DIM, device=device, dtype=dtype), q.to(dtype)
            baselines[name] = bench.timer(partial(torch.matmul, q_cast, keys.transpose(1, 2)), graph=True)
            del keys
        size = f"B={bsz} ctx={ctx}"
        for bits in sizes.bits:
            cent = lloyd_max_codebook(HEAD_DIM, bits).centroids_tensor(device, torch.float32)
            codes, norms = random_packed((batch, ctx), HEAD_DIM, bits, device), random_norms((batch, ctx), device)
            sl, n_check = slice(0, min(batch, 4)), min(ctx, 4096)
            ref = mse_scores_reference(q[sl], codes[sl, :n_check], norms[sl, :n_check], cent, bits)
            for name, variant in variants.items():
                kw = kernel_kwargs(variant)
                graph = kw.pop("graph", False)
                out_dtype = kw.get("out_dtype", torch.float32)
                err = rel_err(mse_scores_triton(q[sl], codes[sl, :n_check], norms[sl, :n_check], cent, bits, **kw), ref)
                if kw.get("lookup", True) and not err < (2e-3 if out_dtype == torch.float32 else 1e-2):
                    raise AssertionError(f"scores {name}: rel err {err}")
                moved = (codes.numel() + norms.numel() * 2 + q.numel() * 4
                         + batch * group * ctx * torch.finfo(out_dtype).bits // 8)
                t = bench.timer(partial(mse_scores_triton, q, codes, norms, cent, bits, **kw), graph=graph)
                check = f"rel err {err:.1e}" if kw.get("lookup", True) else "diagnostic (no lookup)"
                for base_name, t_base in baselines.items():
                    rows.append(Row("scores", f"b={bits} {name}", size, t, moved, bench.floor_us(moved),
                                    base_name, t_base, check))
            del codes, norms
    return rows


# ----------------------------------------------------------------------------------------------- decode
def sdpa_best(timer: Timer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[str, float]:
    """Fastest SDPA backend (bf16, GQA) that runs on these shapes, as a CUDA-graph replay: (name, µs)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    best = ("none", float("inf"))
    candidates = {"flash": [SDPBackend.FLASH_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
                  "cudnn": [SDPBackend.CUDNN_ATTENTION], "default": None}
    for name, backends in candidates.items():
        def call(backends=backends):
            if backends is None:
                return sdpa(q, k, v, enable_gqa=True)
            with sdpa_kernel(backends):
                return sdpa(q, k, v, enable_gqa=True)
        try:
            call()
            torch.cuda.synchronize()
            t = timer(call, graph=True)
        except RuntimeError as exc:  # a backend that refuses these shapes
            print(f"  sdpa {name}: unavailable ({str(exc).splitlines()[0][:80]})")
            continue
        if t < best[1]:
            best = (name, t)
    return best


def bench_decode(bench: Bench, sizes: Any, variants: dict[str, dict]) -> list[Row]:
    """Split-KV decode attention over a packed K/V cache vs SDPA over a bf16 cache (32 q / 8 KV heads, d=128)."""
    from turboquant.codebook import lloyd_max_codebook
    from turboquant.kernels.decode_attention import (
        CacheFormat,
        ChannelGroup,
        GroupFields,
        decode_attention_groups_triton,
        decode_attention_reference,
        decode_attention_triton,
        default_block_n,
        default_num_splits,
    )
    from turboquant.rotation import make_rotation

    rows, device = [], bench.device
    rot = make_rotation("haar", HEAD_DIM, seed=0, device=device).matrix()
    for bsz, ctx in sizes.batch_context:
        size = f"B={bsz} ctx={ctx}"
        q = torch.randn(bsz, HEADS_Q, HEAD_DIM, device=device, dtype=torch.bfloat16)
        if device.type == "cuda":
            k = torch.randn(bsz, HEADS_KV, ctx, HEAD_DIM, device=device, dtype=torch.bfloat16)
            base_name, t_base = sdpa_best(bench.timer, q[:, :, None], k, torch.randn_like(k))
            del k
        else:
            base_name, t_base = "none (cpu)", float("nan")
        for k_bits, v_bits in sizes.bits:
            kcb, vcb = lloyd_max_codebook(HEAD_DIM, k_bits), lloyd_max_codebook(HEAD_DIM, v_bits)
            cache = [random_packed((bsz, HEADS_KV, ctx), HEAD_DIM, k_bits, device), random_norms((bsz, HEADS_KV, ctx), device),
                     random_packed((bsz, HEADS_KV, ctx), HEAD_DIM, v_bits, device), random_norms((bsz, HEADS_KV, ctx), device)]
            seq_lens = torch.full((bsz,), ctx, dtype=torch.int32, device=device)
            common = {"k_centroids": kcb.centroids_tensor(device), "v_centroids": vcb.centroids_tensor(device),
                      "k_bits": k_bits, "v_bits": v_bits, "rotation": rot}
            rb, n_check = min(bsz, 2), min(ctx, 4096)
            check_lens = torch.randint(1, n_check + 1, (rb,), dtype=torch.int32, device=device)
            args = (q[:rb], *(t[:rb, :, :n_check] for t in cache), check_lens)
            ref = decode_attention_reference(*args, **common)
            moved = sum(t.numel() * t.element_size() for t in cache) + 2 * q.numel() * 2
            # timed as the cache layer calls it: the format (codebooks, query map) built once, not per call
            cache_format = CacheFormat.build([ChannelGroup(HEAD_DIM, k_bits, rot, common["k_centroids"])],
                                             [ChannelGroup(HEAD_DIM, v_bits, rot, common["v_centroids"])], device)
            timed = partial(decode_attention_groups_triton, q, [GroupFields(*cache[:2])], [GroupFields(*cache[2:])],
                            seq_lens, cache_format)
            for name, variant in variants.items():
                kw = kernel_kwargs(variant)
                factor, graph = kw.pop("split_factor", 1), kw.pop("graph", False)
                kw["num_splits"] = max(1, round(factor * default_num_splits(
                    bsz, HEADS_KV, ctx, device, kw.get("block_n") or default_block_n(cache_format))))
                err = rel_err(decode_attention_triton(*args, **common, **kw), ref)
                if kw.get("lookup", True) and not err < 1e-2:
                    raise AssertionError(f"decode {name}: rel err {err}")
                t = bench.timer(partial(timed, **kw), graph=graph)
                rows.append(Row("decode", f"K{k_bits}V{v_bits} {name}", size, t, moved, bench.floor_us(moved),
                                f"sdpa bf16 ({base_name})", t_base,
                                f"rel err {err:.1e} (bf16 out)" if kw.get("lookup", True) else "diagnostic (no lookup)"))
            del cache
        if device.type == "cuda":
            bf16_bytes = 2 * bsz * HEADS_KV * ctx * HEAD_DIM * 2
            rows.append(Row("decode", "bf16 sdpa baseline", size, t_base, bf16_bytes, bench.floor_us(bf16_bytes),
                            f"sdpa bf16 ({base_name})", t_base, ""))
    return rows


# ----------------------------------------------------------------------------------------------- decode step
def decode_step_model(sizes: Any, device: torch.device) -> torch.nn.Module:
    """A randomly initialised Llama-architecture model (32 q / 8 KV heads, d = 128) in bf16 (fp32 on the CPU)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=int(sizes.vocab_size), hidden_size=HEADS_Q * HEAD_DIM, intermediate_size=int(sizes.intermediate_size),
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
                any_sdpa_backend: bool = False) -> torch.Tensor:
    """Logits (float32) of one decode step of ``token`` (B, 1) through ``cache`` (fused attention if asked).

    sdpa runs without its cuDNN backend unless ``any_sdpa_backend``: cuDNN builds a new execution plan for
    every new key length (about 11 ms per call on the H200 here, measured with torch.profiler), i.e. at every
    generated token, which would swamp what is compared.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from turboquant.kvcache.fused_attention import fused_decode

    backends = contextlib.nullcontext() if any_sdpa_backend else sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    context = fused_decode(model, cache) if fused else contextlib.nullcontext()
    with torch.no_grad(), backends, context:
        return model(token, past_key_values=cache).logits[:, -1].float()


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


def bench_decode_step(bench: Bench, sizes: Any, variants: dict[str, dict]) -> list[Row]:
    """One greedy decode step of the whole model per cache: fused kernel vs workspace + sdpa vs 16-bit cache.

    Each variant names TurboQuant cache options; every variant's fused step is checked against its workspace
    step (same packed store) before timing. Two times per configuration: ``wall`` (do_bench: events around
    the step, which equal wall time when the host is the bottleneck, as at these sizes in eager mode) and
    ``GPU busy`` (:func:`gpu_busy_us`). Both include the cache update (quantizing the new token and appending
    it, which ``DynamicCache`` and ``QuantizedStream`` do by concatenation) and reading the weights.
    """
    import transformers

    from turboquant.kvcache import build_cache

    model = decode_step_model(sizes, bench.device)
    rows, device = [], bench.device
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
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
        for name, options in variants.items():
            options = dict(options)
            workspace = build_cache("turboquant", model.config, **options)
            fused = build_cache("turboquant", model.config, fused_decode=True, **options)
            for cache in (workspace, fused):
                fill_cache(cache, model, bsz, ctx, device)
            err = rel_err(step(fused, fused=True), step(workspace))
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
    return rows


OPS: dict[str, Callable[[Bench, Any, dict], list[Row]]] = {
    "quantize": bench_quantize, "library": bench_library_paths, "prod": bench_quantize_prod,
    "scores": bench_scores, "decode": bench_decode, "decode_step": bench_decode_step,
}


# ----------------------------------------------------------------------------------------------- report
def markdown_table(frame: pd.DataFrame) -> str:
    lines = ["| op | variant | size | time µs | GB/s | floor µs | floor/time | baseline | baseline µs | speedup | check |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in frame.itertuples():
        check = "" if pd.isna(r.check) else r.check
        lines.append(f"| {r.op} | {r.variant} | {r.size} | {r.time_us:.1f} | {r.gbps:.0f} | {r.floor_us:.1f} | "
                     f"{r.fraction_of_floor:.2f} | {r.baseline} | {r.baseline_us:.1f} | {r.speedup_vs_baseline:.2f} | "
                     f"{check} |")
    return "\n".join(lines)


def require_kernel_device(cfg: Any) -> torch.device:
    """The CUDA device, or the CPU under ``TRITON_INTERPRET=1`` with ``experiment.smoke=true``; else ValueError."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if cfg.experiment.smoke and os.environ.get("TRITON_INTERPRET") == "1":
        return torch.device("cpu")
    raise ValueError(
        "experiment=kernels times Triton GPU kernels and needs a CUDA device, but torch.cuda.is_available() is "
        "False here. Run it on a CUDA GPU, or check the code path on the CPU with tiny sizes (times meaningless): "
        "TRITON_INTERPRET=1 python run.py experiment=kernels experiment.smoke=true")


def _sizes(cfg: Any) -> Any:
    return cfg.experiment.sizes.smoke if cfg.experiment.smoke else experiment_sizes(cfg)


def run(cfg: Any, store: ResultStore) -> pd.DataFrame:
    """Check and time every op of ``experiment.ops``; one stored unit per (benchmark = op of experiment.ops, GPU); writes ``kernels.md``."""
    import triton

    device = require_kernel_device(cfg)
    unknown = set(cfg.experiment.ops) - set(OPS)
    if unknown:
        raise ValueError(f"unknown kernel ops {sorted(unknown)}; available: {sorted(OPS)}")
    sizes = _sizes(cfg)
    torch.manual_seed(cfg.seed)
    timer = Timer(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU interpreter ({platform.machine()})"
    bench = Bench(timer, device, copy_bandwidth(timer, device, int(sizes.copy_bytes)))
    command = " ".join([Path(sys.executable).name, *sys.argv])
    header = (f"command: {command}\ndevice: {gpu}; torch {torch.__version__}; triton {triton.__version__}; "
              f"copy bandwidth {bench.copy_bw / 1e9:.0f} GB/s (read + write)")
    print(header, flush=True)
    store.record_provenance(command=command, gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                            copy_bandwidth_gbps=round(bench.copy_bw / 1e9, 1))
    units = []
    for op in cfg.experiment.ops:
        unit = {"benchmark": op, "gpu": gpu}
        units.append(unit)
        if store.is_done(unit):
            continue
        rows = OPS[op](bench, sizes[op], dict(cfg.experiment.variants[op]))
        store.save_unit(unit, [r.as_dict() | {"command": command, "copy_bandwidth_gbps": round(bench.copy_bw / 1e9, 1)}
                               for r in rows])
        print(markdown_table(store.frame([unit])), flush=True)
    frame = store.frame(units)
    (store.directory / "kernels.md").write_text(
        f"# Triton kernel benchmark\n\n```\n{header}\n```\n\nColumns: median µs (`triton.testing.do_bench`, L2 "
        f"flushed), GB/s = bytes that must move / time, floor = those bytes at the copy bandwidth measured in the "
        f"same run, speedup = baseline µs / time µs. Rows of ops resumed from an earlier run carry that run's "
        f"command in results.csv.\n\n{markdown_table(frame)}\n")
    return frame


def plot(df: pd.DataFrame, cfg: Any, figures_dir: str | Path) -> list[Path]:
    """Fraction of the byte floor reached by each kernel row (bars), one panel per op."""
    rows = df[~df["variant"].str.contains("no-lookup|baseline", regex=True)].drop_duplicates(["op", "variant", "size"])
    if rows.empty:
        return []
    from experiments.coverage import grid_coverage
    from experiments.plotting import figure_style, save_figure

    ops = list(dict.fromkeys(rows["op"]))
    with figure_style():
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(ops), 1, figsize=(9, 2.2 + 0.22 * len(rows)), squeeze=False,
                                 height_ratios=[max(1, (rows["op"] == op).sum()) for op in ops])
        for ax, op in zip(axes[:, 0], ops):
            part = rows[rows["op"] == op]
            labels = [f"{v} | {s}" for v, s in zip(part["variant"], part["size"])]
            ax.barh(range(len(part)), part["fraction_of_floor"], color="tab:blue")
            ax.set_yticks(range(len(part)), labels, fontsize=6)
            ax.invert_yaxis()
            ax.set_title(op, fontsize=9)
            ax.set_xlabel("byte floor / time (1 = at the copy bandwidth)")
        gpu = df["gpu"].iloc[0] if "gpu" in df else ""
        fig.suptitle(f"Triton kernels on {gpu}: fraction of the byte floor", fontsize=10)
        fig.tight_layout()
        return save_figure(fig, figures_dir, "kernels_fraction_of_floor", grid_coverage(cfg))


def _best(rows: pd.DataFrame) -> pd.Series | None:
    """The row with the largest speed-up over its baseline (diagnostic no-lookup variants excluded)."""
    rows = rows[~rows["variant"].str.contains("no-lookup")]
    return None if rows.empty else rows.loc[rows["speedup_vs_baseline"].idxmax()]


def paper_comparison(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The blog's "up to 8x faster logits from 4-bit keys than from 32-bit keys" (our best 4-bit scores
    row against fp32 ``torch.matmul``), and the 4-bit decode speed-up over bf16 SDPA, each with the byte
    limit of the same run (baseline floor / our floor: the speed-up if both ran at the copy bandwidth)."""
    out = []
    scores = _best(df[(df["op"] == "scores") & (df["baseline"] == "fp32 matmul") & df["variant"].str.startswith("b=4")])
    if scores is not None:
        limit = 32 * HEAD_DIM / (4 * HEAD_DIM + 16)  # fp32 key bytes / (4-bit codes + fp16 norm)
        detail = (f"{scores['variant']}, {scores['size']}: {scores['time_us']:.0f} µs vs fp32 matmul "
                  f"{scores['baseline_us']:.0f} µs on {scores['gpu']}; byte limit {limit:.2f}x")
        out += [{"id": "kernels.scores_speedup_vs_fp32", "value": float(scores["speedup_vs_baseline"]), "detail": detail},
                {"id": "kernels.scores_speedup_byte_limit", "value": float(scores["speedup_vs_baseline"]), "detail": detail}]
    decode = _best(df[(df["op"] == "decode") & df["variant"].str.startswith("K4V4")])
    if decode is not None:
        base = df[(df["op"] == "decode") & (df["variant"] == "bf16 sdpa baseline") & (df["size"] == decode["size"])]
        limit = f"; byte limit {float(base['floor_us'].iloc[0]) / decode['floor_us']:.2f}x" if len(base) else ""
        out.append({"id": "kernels.decode_speedup_byte_limit", "value": float(decode["speedup_vs_baseline"]),
                    "detail": f"{decode['variant']}, {decode['size']}: {decode['time_us']:.0f} µs vs "
                              f"{decode['baseline']} {decode['baseline_us']:.0f} µs on {decode['gpu']}{limit}"})
    return out
