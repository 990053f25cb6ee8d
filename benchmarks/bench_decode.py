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
    kernel_kwargs,
    random_norms,
    random_packed,
    rel_err,
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
            lead = (bsz, HEADS_KV, ctx)
            cache = [random_packed(lead, HEAD_DIM, k_bits, device), random_norms(lead, device),
                     random_packed(lead, HEAD_DIM, v_bits, device), random_norms(lead, device)]
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
                                f"rel err {err:.1e} (bf16 out)" if kw.get("lookup", True)
                                else "diagnostic (no lookup)"))
            del cache
        if device.type == "cuda":
            bf16_bytes = 2 * bsz * HEADS_KV * ctx * HEAD_DIM * 2
            rows.append(Row("decode", "bf16 sdpa baseline", size, t_base, bf16_bytes, bench.floor_us(bf16_bytes),
                            f"sdpa bf16 ({base_name})", t_base, ""))
    return rows
