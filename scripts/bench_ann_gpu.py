"""GPU timing of TurboQuant as a nearest-neighbour index (paper Table 2's TurboQuant row, on one GPU).

    python scripts/bench_ann_gpu.py --n 100000 --dims 200 1536 3072 --bits 4 --out results.json

For each dimension d: n random Gaussian vectors (float32, on the GPU) are indexed at ``bits`` bits by

* ``library``:   ``turboquant.TurboQuantMSE(d, bits, device=cuda, backend="torch").quantize`` (PyTorch
                 ops: a GEMM with the Haar rotation, bucketize, bit packing) — haar and hadamard rotations;
* ``triton``:    the fused kernel ``turboquant.kernels.quantize_mse_triton`` (rotation on tensor cores,
                 nearest centroid, packing, norms in one pass) with the same Haar Π;

timed as the median of CUDA-event intervals after warm-up (Triton compilation excluded). Both write the
library's packed layout; the share of identical codes is printed (the kernel rounds Πx through fp16).
Then m queries are searched for their top-k over the n codes — fused Triton scores
(``mse_scores_triton``) + ``torch.topk``, and the exact float32 GEMM + topk as the uncompressed baseline —
with queries/s and recall@1@1 / recall@1@k against the exact top-1. Needs torch + triton (no faiss, no
hydra). Prints a Markdown table and, with ``--out``, writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import turboquant as tq  # noqa: E402
from turboquant.kernels import mse_scores_triton, quantize_mse_triton  # noqa: E402


def time_ms(fn, repeats: int, device: torch.device) -> float:
    """Median wall time of ``fn()`` in milliseconds (CUDA events on a GPU), after two warm-up calls."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            import time

            begin = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - begin))
    return statistics.median(times)


def recall(truth: torch.Tensor, ids: torch.Tensor, k: int) -> float:
    return float((ids[:, :k] == truth[:, None]).any(dim=1).float().mean())


def bench_dim_or_error(dim: int, *args) -> list[dict]:
    """:func:`bench_dim`, or one row naming the error (a kernel failing at one d must not hide the others)."""
    try:
        return bench_dim(dim, *args)
    except Exception as error:  # noqa: BLE001 - reported, not swallowed
        return [{"dim": dim, "what": f"FAILED: {type(error).__name__}: {str(error)[:160]}", "ms": float("nan")}]


def bench_dim(dim: int, n: int, m: int, bits: int, k: int, repeats: int, device: torch.device) -> list[dict]:
    gen = torch.Generator(device="cpu").manual_seed(dim)
    base = torch.randn(n, dim, generator=gen).to(device)
    queries = torch.randn(m, dim, generator=gen).to(device)
    rows = []
    torch_haar = tq.TurboQuantMSE(dim, bits, rotation="haar", seed=0, device=device, backend="torch")
    torch_hadamard = tq.TurboQuantMSE(dim, bits, rotation="hadamard", seed=0, device=device, backend="torch")
    for name, quantizer in (("library torch ops, haar", torch_haar), ("library torch ops, hadamard", torch_hadamard)):
        ms = time_ms(lambda q=quantizer: q.quantize(base), repeats, device)
        rows.append({"dim": dim, "what": f"index {n} vectors: {name}", "ms": ms})
    reference = torch_haar.quantize(base)
    haar = torch_haar
    rotation = haar.rotation.matrix().to(device)
    boundaries = haar.codebook.boundaries
    try:
        ms = time_ms(lambda: quantize_mse_triton(base, rotation, boundaries, bits), repeats, device)
    except Exception as error:  # noqa: BLE001 - reported in the table; search below uses the torch codes
        rows.append({"dim": dim, "what": f"index: fused Triton kernel FAILED: {type(error).__name__}: "
                     f"{str(error)[:120]}", "ms": float("nan")})
        codes, norms = reference.codes, reference.norms
    else:
        codes, norms = quantize_mse_triton(base, rotation, boundaries, bits)
        same = (tq.unpack_codes(codes, bits, dim) == tq.unpack_codes(reference.codes, bits, dim)).float().mean()
        rows.append({"dim": dim, "what": f"index {n} vectors: fused Triton kernel (turboquant.kernels), haar",
                     "ms": ms, "codes_equal_to_library": float(same)})

    truth = (queries @ base.T).argmax(dim=1)
    centroids = haar.codebook.centroids_tensor(device, torch.float32)

    def tq_search():
        q_rot = haar.rotation.apply(queries)
        scores = mse_scores_triton(q_rot[None], codes[None], norms[None], centroids, bits)[0]
        return torch.topk(scores, k, dim=1).indices

    def exact_search():
        return torch.topk(queries @ base.T, k, dim=1).indices

    for name, search in (("TurboQuant (Triton scores + topk)", tq_search), ("exact float32 GEMM + topk", exact_search)):
        ms = time_ms(search, repeats, device)
        ids = search()
        rows.append({"dim": dim, "what": f"search {m} queries, top-{k}: {name}", "ms": ms,
                     "queries_per_s": m / (ms / 1e3), "recall_at_1": recall(truth, ids, 1),
                     f"recall_at_{k}": recall(truth, ids, k)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--dims", type=int, nargs="+", default=[200, 1536, 3072])
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    header = {"gpu": gpu, "torch": torch.__version__, "n": args.n, "bits": args.bits}
    try:
        import triton

        header["triton"] = triton.__version__
    except ImportError:
        pass
    rows = []
    for dim in args.dims:
        rows += bench_dim_or_error(dim, args.n, args.queries, args.bits, args.k, args.repeats, device)
    print(f"# TurboQuant ANN on {gpu} ({', '.join(f'{k}={v}' for k, v in header.items())})\n")
    print("| d | what | median ms | queries/s | recall@1@1 | recall@1@k | codes = library |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        recall_k = next((v for key, v in row.items() if key.startswith("recall_at_") and key != "recall_at_1"), None)
        cells = [row["dim"], row["what"], f"{row['ms']:.3f}", f"{row.get('queries_per_s', float('nan')):.0f}",
                 row.get("recall_at_1", ""), recall_k if recall_k is not None else "",
                 row.get("codes_equal_to_library", "")]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"header": header, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
