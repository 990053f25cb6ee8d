"""TurboQuant as a nearest-neighbour index on one GPU (the paper's Table 2 TurboQuant row; arXiv v1 §4.4).

    python -m benchmarks.bench_ann --n 100000 --dims 200 1536 3072 --bits 4 --out ann.json

For each dimension d, n random Gaussian vectors (float32, on the GPU) are indexed at ``bits`` bits by

* the library: ``TurboQuantMSE(d, bits, device=cuda, backend="torch").quantize`` (PyTorch ops: a GEMM with the
  rotation, bucketize, bit packing), with the Haar and the Hadamard rotation;
* the fused kernel ``turboquant.kernels.quantize_mse_triton`` (rotation on tensor cores, nearest centroid,
  packing, norms in one pass) with the same Haar Π; the share of codes equal to the library's is printed (the
  kernel rounds Πx through fp16).

Then m queries are searched for their top-k over the n codes, by the fused scores kernel (``mse_scores_triton``)
+ ``torch.topk`` and by the exact float32 GEMM + topk (the uncompressed baseline), with queries/s and recall@1@1 /
recall@1@k against the exact top-1 (:func:`turboquant.ann.recall_at_1_at_k`). Times: :class:`benchmarks.utils.Timer`.
Prints a Markdown table and, with ``--out``, writes the rows as JSON.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .utils import Timer, device_name

__all__ = ["bench_dim", "main"]


def bench_dim(dim: int, n: int, m: int, bits: int, k: int, timer: Timer) -> list[dict]:
    """Index and search rows at dimension ``dim``; a failing fused kernel is one row naming the error."""
    import turboquant as tq
    from turboquant.ann import recall_at_1_at_k
    from turboquant.kernels import mse_scores_triton, quantize_mse_triton

    device = timer.device
    gen = torch.Generator(device="cpu").manual_seed(dim)
    base = torch.randn(n, dim, generator=gen).to(device)
    queries = torch.randn(m, dim, generator=gen).to(device)
    rows = []
    haar = tq.TurboQuantMSE(dim, bits, rotation="haar", seed=0, device=device, backend="torch")
    hadamard = tq.TurboQuantMSE(dim, bits, rotation="hadamard", seed=0, device=device, backend="torch")
    for name, quantizer in (("library torch ops, haar", haar), ("library torch ops, hadamard", hadamard)):
        rows.append({"dim": dim, "what": f"index {n} vectors: {name}",
                     "ms": timer(lambda q=quantizer: q.quantize(base)) / 1e3})
    reference = haar.quantize(base)
    rotation, boundaries = haar.rotation.matrix().to(device), haar.codebook.boundaries
    try:
        ms = timer(lambda: quantize_mse_triton(base, rotation, boundaries, bits)) / 1e3
    except Exception as error:  # noqa: BLE001 - reported in the table; the search below uses the torch codes
        rows.append({"dim": dim, "what": f"index: fused Triton kernel FAILED: {type(error).__name__}: "
                     f"{str(error)[:120]}", "ms": float("nan")})
        codes, norms = reference.codes, reference.norms
    else:
        codes, norms = quantize_mse_triton(base, rotation, boundaries, bits)
        same = (tq.unpack_codes(codes, bits, dim) == tq.unpack_codes(reference.codes, bits, dim)).float().mean()
        rows.append({"dim": dim, "what": f"index {n} vectors: fused Triton kernel (turboquant.kernels), haar",
                     "ms": ms, "codes_equal_to_library": float(same)})

    truth = (queries @ base.T).argmax(dim=1).cpu().numpy()
    centroids = haar.codebook.centroids_tensor(device, torch.float32)

    def tq_search() -> torch.Tensor:
        scores = mse_scores_triton(haar.rotation.apply(queries)[None], codes[None], norms[None], centroids, bits)[0]
        return torch.topk(scores, k, dim=1).indices

    def exact_search() -> torch.Tensor:
        return torch.topk(queries @ base.T, k, dim=1).indices

    for name, search in (("TurboQuant (Triton scores + topk)", tq_search), ("exact float32 GEMM + topk", exact_search)):
        ms = timer(search) / 1e3
        recall = recall_at_1_at_k(truth, search().cpu().numpy(), [1, k])
        rows.append({"dim": dim, "what": f"search {m} queries, top-{k}: {name}", "ms": ms,
                     "queries_per_s": m / (ms / 1e3), "recall_at_1": recall[1], f"recall_at_{k}": recall[k]})
    return rows


def markdown(rows: list[dict], k: int) -> str:
    lines = ["| d | what | median ms | queries/s | recall@1@1 | recall@1@k | codes = library |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [row["dim"], row["what"], f"{row['ms']:.3f}", f"{row.get('queries_per_s', float('nan')):.0f}",
                 row.get("recall_at_1", ""), row.get(f"recall_at_{k}", ""), row.get("codes_equal_to_library", "")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--dims", type=int, nargs="+", default=[200, 1536, 3072])
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import triton

    device = torch.device(args.device)
    timer = Timer(device)
    header = {"gpu": device_name(device), "torch": torch.__version__, "triton": triton.__version__, "n": args.n,
              "bits": args.bits}
    rows = [row for dim in args.dims for row in bench_dim(dim, args.n, args.queries, args.bits, args.k, timer)]
    print(f"# TurboQuant ANN on {header['gpu']} ({', '.join(f'{k}={v}' for k, v in header.items())})\n")
    print(markdown(rows, args.k))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"header": header, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
