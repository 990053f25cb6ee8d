"""decode op: split-KV decode attention over a packed K/V cache (``decode_attention_groups_triton``) against
``scaled_dot_product_attention`` over a bf16 cache (the fastest backend that runs), ``python run.py
experiment=kernels 'experiment.ops=[decode]'``. Bytes that must move: the packed cache and the queries / output."""
from __future__ import annotations

from functools import partial
from typing import Any

import torch

from .utils import (
    HEAD_DIM,
    HEADS_KV,
    HEADS_Q,
    Bench,
    Row,
    Timer,
    failed_row,
    kernel_kwargs,
    random_norms,
    random_packed,
    rel_err,
    skip_off_gpu,
)

__all__ = ["bench_decode", "sdpa_best"]


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



def packed_cache(bsz: int, ctx: int, k_bits: float, v_bits: float, head_dim: int, device: torch.device) -> tuple:
    """Random packed K/V codes, their :class:`CacheFormat` and per-(row, KV head) channel orders: ``bits`` 1-4 is one
    TurboQuant_mse group per stream, 3.5 the paper's outlier preset (32 channels at 4 bits, the other
    ``head_dim - 32`` at 3, each group with its own Haar rotation, a random channel order per row and KV head, as the
    cache stores it)."""
    from turboquant.codebook import lloyd_max_codebook
    from turboquant.kernels.decode_attention import CacheFormat, ChannelGroup
    from turboquant.rotation import make_rotation

    lead = (bsz, HEADS_KV, ctx)

    def stream(bits: float, seed: int) -> tuple[list, list]:
        layout = [(head_dim, int(bits))] if bits == int(bits) else [(32, 4), (head_dim - 32, 3)]
        if bits not in (1, 2, 3, 4, 3.5):
            raise ValueError(f"decode bits must be 1-4 or 3.5 (the outlier preset), got {bits}")
        groups = [ChannelGroup(m, b, make_rotation("haar", m, seed=seed + i, device=device).matrix(),
                               lloyd_max_codebook(m, b).centroids_tensor(device)) for i, (m, b) in enumerate(layout)]
        fields = [group.packed(random_packed(lead, m, b, device), random_norms(lead, device))
                  for group, (m, b) in zip(groups, layout)]
        return fields, groups

    (keys, key_groups), (values, value_groups) = stream(k_bits, 0), stream(v_bits, 10)
    cache_format = CacheFormat.build(key_groups, value_groups, device)
    perms = {}
    for name, groups in (("key_permutation", key_groups), ("value_permutation", value_groups)):
        if len(groups) == 2:
            perms[name] = torch.rand(bsz, HEADS_KV, head_dim, device=device).argsort(dim=-1)
    return keys, values, cache_format, perms


def _head_slice(fields: list, rows: int, tokens: int) -> list:
    """The first ``rows`` batch rows and ``tokens`` tokens of every group's codes (the reference check's subset)."""
    return [f[:rows, :, :tokens] for f in fields]


def bench_decode(bench: Bench, sizes: Any, variants: dict[str, dict]) -> list[Row]:
    """Split-KV decode attention over a packed K/V cache vs SDPA over a bf16 cache (32 q / 8 KV heads), at every
    (batch, context) x (key bits, value bits) of ``sizes`` and the ``extra`` (batch, context, k, v) cases, for each
    head dimension of ``sizes.head_dims`` (default [128], Llama-3.1-8B's; 64 is Qwen2.5-0.5B's). Variants whose
    decoder is inline PTX are skipped off CUDA (the interpreter cannot run PTX)."""
    from turboquant.kernels.decode_attention import (
        decode_attention_groups_reference,
        decode_attention_groups_triton,
        split_plan,
    )

    rows, device, baselines = [], bench.device, {}
    cases = [(b, c, kb, vb) for b, c in sizes.batch_context for kb, vb in sizes.bits]
    cases += [tuple(case) for case in sizes.get("extra", [])]
    head_dims = [int(d) for d in sizes.get("head_dims", [HEAD_DIM])]
    for (bsz, ctx, k_bits, v_bits), head_dim in ((case, d) for d in head_dims for case in cases):
        size = f"B={bsz} ctx={ctx}" + ("" if head_dim == HEAD_DIM else f" d={head_dim}")
        q = torch.randn(bsz, HEADS_Q, head_dim, device=device, dtype=torch.bfloat16)
        if size not in baselines:
            if device.type == "cuda":
                k = torch.randn(bsz, HEADS_KV, ctx, head_dim, device=device, dtype=torch.bfloat16)
                baselines[size] = sdpa_best(bench.timer, q[:, :, None], k, torch.randn_like(k))
                del k
                bf16_bytes = 2 * bsz * HEADS_KV * ctx * head_dim * 2
                rows.append(Row("decode", "bf16 sdpa baseline", size, baselines[size][1], bf16_bytes,
                                bench.floor_us(bf16_bytes), f"sdpa bf16 ({baselines[size][0]})", baselines[size][1],
                                ""))
            else:
                baselines[size] = ("none (cpu)", float("nan"))
        base_name, t_base = baselines[size]
        keys, values, cache_format, perms = packed_cache(bsz, ctx, k_bits, v_bits, head_dim, device)
        seq_lens = torch.full((bsz,), ctx, dtype=torch.int32, device=device)
        rb, n_check = min(bsz, 2), min(ctx, 4096)
        check_lens = torch.randint(1, n_check + 1, (rb,), dtype=torch.int32, device=device)
        check_perms = {name: perm[:rb] for name, perm in perms.items()}
        check_args = (q[:rb], _head_slice(keys, rb, n_check), _head_slice(values, rb, n_check), check_lens,
                      cache_format)
        ref = decode_attention_groups_reference(*check_args, **check_perms)
        moved = sum(f.nbytes for f in (*keys, *values))
        moved += 2 * q.numel() * 2
        # timed as the cache layer calls it: the format (codebooks, query map) built once, not per call
        timed = partial(decode_attention_groups_triton, q, keys, values, seq_lens, cache_format, **perms)
        for name, variant in variants.items():
            kw = kernel_kwargs(variant)
            if skip_off_gpu("decode", name, kw, device):
                continue
            factor, graph = kw.pop("split_factor", 1), kw.pop("graph", False)
            options = {k: v for k, v in kw.items() if k in ("kernel", "decoder", "inner", "lookup", "block_n",
                                                           "num_stages", "num_splits")}
            label = f"K{k_bits}V{v_bits} {name}"
            try:  # a plan the cache refuses (a decoder for other widths), a failed check, compile or launch: recorded
                plan = split_plan(cache_format, bsz, HEADS_Q, HEADS_KV, ctx, device, **options)  # what is timed
                if factor != 1:  # a multiple of that kernel's default split count
                    kw["num_splits"] = options["num_splits"] = max(1, round(factor * plan.num_splits))
                    plan = split_plan(cache_format, bsz, HEADS_Q, HEADS_KV, ctx, device, **options)
                # the kernel and decoder that "auto" chose for the timed shape, pinned, so that the check (fewer rows
                # and tokens, where "auto" may choose otherwise) runs what is timed
                kw.update(kernel=plan.kernel, decoder=plan.decoder)
                err = rel_err(decode_attention_groups_triton(*check_args, **check_perms, **kw), ref)
                if kw.get("lookup", True) and not err < 1e-2:
                    raise AssertionError(f"rel err {err} against the float64 reference")
                t = bench.timer(partial(timed, **kw), graph=graph)
            except Exception as exc:  # the run goes on
                rows.append(failed_row("decode", label, size, exc))
                continue
            rows.append(Row("decode", label, size, t, moved, bench.floor_us(moved),
                            f"sdpa bf16 ({base_name})", t_base,
                            f"{plan.kernel} kernel ({plan.decoder}), rel err {err:.1e} (bf16 out)"
                            if kw.get("lookup", True) else "diagnostic (no lookup)"))
        del keys, values
    return rows
