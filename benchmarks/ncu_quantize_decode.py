"""One launch of each kernel the benchmark's default rows run, at the issue-12 shapes, for ncu:

    ncu ... -k regex:"quantize|mma_" python -m benchmarks.ncu_quantize_decode            # every op
    ncu ... -k regex:"mma_split|merge|rotate" python -m benchmarks.ncu_quantize_decode --ops decode
    ncu ... -k regex:mma_split python -m benchmarks.ncu_quantize_decode --ops decode --bits 4 --decoders prmt lut
    ncu ... -k regex:"mma_split|merge|rotate" python -m benchmarks.ncu_quantize_decode --ops decode --bits 4 \
        --shapes 1x8192 8x8192                                                  # where a small launch's time goes

``quantize``: 16M x 128 fp16 rows at 4, 3 and 2 bits (``quantize_mse_triton``, ``kernel="auto"``); ``prod``: the
same rows, TurboQuant_prod at 4 bits (3-bit codes + QJL signs); ``scores``: logits of B=8, 32K 4-bit keys through
the register-operand kernel; ``decode``: B=8, 32K decode attention over K4V4, K3V3 and the 3.5-bit outlier preset
(``kernel="auto"``; the benchmark's random caches; ``--bits`` a subset, ``--decoders`` the register-operand
kernel's decoders to run at 4 bits, each one launch of that kernel; ``--shapes`` other BATCHxTOKENS). Profiled by
``scripts/h200_kernels.sh`` with ``NCU=1``; outputs of earlier sessions under ``results/kernels/session*/ncu_*.txt``."""
from __future__ import annotations

import argparse

import torch

from turboquant.kernels.decode_attention.mma import MMA_DECODERS

from .utils import HEAD_DIM, HEADS_KV, HEADS_Q, random_norms, random_packed

OPS = ("quantize", "prod", "scores", "decode")
BATCH, TOKENS, ROWS = 8, 32768, 1 << 24


def _quantize(device: torch.device, prod: bool) -> None:
    import turboquant as tq
    from turboquant.kernels.quantize import quantize_mse_triton
    from turboquant.kernels.quantize_prod import quantize_prod_triton

    x = torch.randn(ROWS, HEAD_DIM, device=device, dtype=torch.float16)
    rotation = tq.make_rotation("haar", HEAD_DIM, seed=0, device=device).matrix()
    if prod:
        codebook = tq.lloyd_max_codebook(HEAD_DIM, 3)
        qjl = torch.randn(HEAD_DIM, HEAD_DIM, device=device)
        quantize_prod_triton(x, rotation, codebook.boundaries, codebook.centroids_tensor(device), 3, qjl)
        return
    for bits in (4, 3, 2):
        quantize_mse_triton(x, rotation, tq.lloyd_max_codebook(HEAD_DIM, bits).boundaries, bits,
                            norms_dtype=torch.float16)


def _scores(device: torch.device) -> None:
    import turboquant as tq
    from turboquant.kernels.scores import mse_scores_triton

    batch = BATCH * HEADS_KV
    q = torch.randn(batch, HEADS_Q // HEADS_KV, HEAD_DIM, device=device)
    codes, norms = random_packed((batch, TOKENS), HEAD_DIM, 4, device), random_norms((batch, TOKENS), device)
    mse_scores_triton(q, codes, norms, tq.lloyd_max_codebook(HEAD_DIM, 4).centroids_tensor(device, torch.float32), 4,
                      kernel="mma")


def _decode(device: torch.device, widths: list[float], decoders: list[str], batch: int, tokens: int) -> None:
    from turboquant.kernels.decode_attention import decode_attention_groups_triton

    from .bench_decode import packed_cache

    seq_lens = torch.full((batch,), tokens, dtype=torch.int32, device=device)
    q = torch.randn(batch, HEADS_Q, HEAD_DIM, device=device, dtype=torch.bfloat16)
    for bits in widths:
        keys, values, cache_format, perms = packed_cache(batch, tokens, bits, bits, HEAD_DIM, device)
        for decoder in decoders if bits == 4 else ["auto"]:
            decode_attention_groups_triton(q, keys, values, seq_lens, cache_format, decoder=decoder,
                                           kernel="auto" if decoder == "auto" else "mma", **perms)
        del keys, values


def _shape(text: str) -> tuple[int, int]:
    """``BATCHxTOKENS`` -> (batch, tokens)."""
    try:
        batch, tokens = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a decode shape is BATCHxTOKENS, e.g. 8x32768; got {text!r}") from None
    return batch, tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--bits", nargs="+", type=float, choices=(4, 3, 3.5), default=[4, 3, 3.5])
    parser.add_argument("--decoders", nargs="+", choices=MMA_DECODERS, default=["auto"])
    parser.add_argument("--shapes", nargs="+", type=_shape, default=[(BATCH, TOKENS)])
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    for op in args.ops:
        if op in ("quantize", "prod"):
            _quantize(device, prod=op == "prod")
        elif op == "scores":
            _scores(device)
        else:
            for batch, tokens in args.shapes:
                _decode(device, [int(b) if b == int(b) else b for b in args.bits], args.decoders, batch, tokens)
        torch.cuda.synchronize()
        print(op, "done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
