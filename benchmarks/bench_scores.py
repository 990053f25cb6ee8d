"""scores op: attention logits from packed 4/3-bit keys (``mse_scores_triton``) against ``torch.matmul`` with fp32
and with bf16 keys, ``python run.py experiment=kernels 'experiment.ops=[scores]'``. Bytes that must move: codes,
norms, queries and the logits written."""
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
    failed_row,
    kernel_kwargs,
    random_norms,
    random_packed,
    rel_err,
    skip_off_gpu,
)

__all__ = ["bench_scores"]


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
                if skip_off_gpu("scores", name, kw, device):
                    continue
                graph = kw.pop("graph", False)
                out_dtype = kw.get("out_dtype", torch.float32)
                moved = (codes.numel() + norms.numel() * 2 + q.numel() * 4
                         + batch * group * ctx * torch.finfo(out_dtype).bits // 8)
                try:
                    err = rel_err(mse_scores_triton(q[sl], codes[sl, :n_check], norms[sl, :n_check], cent, bits,
                                                    **kw), ref)
                    if kw.get("lookup", True) and not err < (2e-3 if out_dtype == torch.float32 else 1e-2):
                        raise AssertionError(f"rel err {err} against the float64 reference")
                    t = bench.timer(partial(mse_scores_triton, q, codes, norms, cent, bits, **kw), graph=graph)
                except Exception as exc:  # a failed check, compile or launch: recorded, the run goes on
                    rows.append(failed_row("scores", f"b={bits} {name}", size, exc))
                    continue
                check = f"rel err {err:.1e}" if kw.get("lookup", True) else "diagnostic (no lookup)"
                for base_name, t_base in baselines.items():
                    rows.append(Row("scores", f"b={bits} {name}", size, t, moved, bench.floor_us(moved),
                                    base_name, t_base, check))
            del codes, norms
    return rows
