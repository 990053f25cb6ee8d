"""Benchmark the Triton kernels against the byte floor and against PyTorch baselines in the same run.

Usage (on a CUDA GPU; needs torch, triton, numpy, scipy, no Hydra):

    python scripts/bench_kernels.py --out results/kernels            # full sizes (an H200: ~5 minutes)
    TRITON_INTERPRET=1 python scripts/bench_kernels.py --smoke       # tiny sizes on the CPU: checks the script

For every op and size it first checks the kernel against the float64 torch reference on fresh random
inputs, then times it with ``triton.testing.do_bench`` (median, L2 flushed between repetitions) and prints
time, achieved GB/s (bytes that must move / time), the floor (those bytes at the copy bandwidth measured
in this run) and ratios to baselines timed in this run:

- quantize: copy bandwidth (device-to-device copy, bytes read + written);
- scores: ``torch.matmul`` of the query group with fp32 keys and with bf16 keys;
- decode attention: ``scaled_dot_product_attention`` over a bf16 cache (GQA), the fastest of the
  flash / efficient / cuDNN / default backends that run.

Outputs: ``<out>/kernels.csv``, ``<out>/kernels.md`` (with the command, GPU, versions).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from turboquant.codebook import lloyd_max_codebook  # noqa: E402
from turboquant.kernels.decode_attention import (  # noqa: E402
    decode_attention_reference,
    decode_attention_triton,
    default_num_splits,
)
from turboquant.kernels.quantize import quantize_mse_reference, quantize_mse_triton  # noqa: E402
from turboquant.kernels.quantize_prod import quantize_prod_reference, quantize_prod_triton  # noqa: E402
from turboquant.quantizers import TurboQuantMSE, TurboQuantProd  # noqa: E402
from turboquant.kernels.scores import mse_scores_reference, mse_scores_triton  # noqa: E402
from turboquant.packing import unpack_codes  # noqa: E402
from turboquant.rotation import make_rotation  # noqa: E402

HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128


@dataclasses.dataclass
class Row:
    op: str
    variant: str
    size: str
    time_us: float
    bytes_moved: int
    floor_us: float
    baseline: str = ""
    baseline_us: float = float("nan")
    check: str = ""

    @property
    def gbps(self) -> float:
        return self.bytes_moved / self.time_us / 1e3

    @property
    def speedup(self) -> float:
        return self.baseline_us / self.time_us

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(gbps=round(self.gbps, 1), fraction_of_floor=round(self.floor_us / self.time_us, 3),
                   speedup_vs_baseline=round(self.speedup, 3))
        return out


class Timer:
    """Median time in µs: do_bench on CUDA (L2 flushed between reps), wall clock on the CPU interpreter.

    ``graph=True`` captures ``fn`` (wrapper, Triton launches and all) in a CUDA graph and times its
    replay: device time without the Python/launch overhead, which dominates at small sizes.
    """

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, fn, graph: bool = False) -> float:
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


# ----------------------------------------------------------------------------------------------- quantize
def check_quantize(x, rot, cb, bits, **kw) -> str:
    """Tie-aware code check + norm error on ``x`` (fresh data)."""
    codes, norms = quantize_mse_triton(x, rot, cb.boundaries, bits, norms_dtype=torch.float32, **kw)
    ref_codes, ref_norms, y = quantize_mse_reference(x, rot, cb.boundaries, bits)
    dim = x.shape[-1]
    got = unpack_codes(codes, bits, dim).long()
    want = unpack_codes(ref_codes, bits, dim).long()
    wrong = got != want
    bnd = torch.as_tensor(cb.boundaries, device=x.device)
    gap = (y[..., None] - bnd).abs().min(dim=-1).values
    bad = wrong & ((gap > 2e-3) | ((got - want).abs() > 1))
    if bad.any():
        raise AssertionError(f"quantize: {int(bad.sum())} codes wrong away from a midpoint")
    norm_err = float(((norms.double() - ref_norms) / ref_norms.clamp_min(1e-30)).abs().max())
    if norm_err > 1e-5:
        raise AssertionError(f"quantize: norm error {norm_err}")
    return f"ties {float(wrong.double().mean()):.1e}, norm err {norm_err:.1e}"


def bench_quantize(timer, device, copy_bw, n_vectors, dims_bits, dtypes, variants) -> list[Row]:
    rows = []
    for dim, bits in dims_bits:
        cb = lloyd_max_codebook(dim, bits)
        rot = make_rotation("haar", dim, seed=0, device=device).matrix()
        for dtype in dtypes:
            check = check_quantize(torch.randn(min(n_vectors, 1 << 16), dim, device=device).to(dtype) * 3,
                                   rot, cb, bits)
            x = torch.randn(n_vectors, dim, device=device, dtype=dtype)
            row_bytes = -(-dim * bits // 8)
            moved = x.numel() * x.element_size() + n_vectors * (row_bytes + 2)
            for name, kw in variants.items():
                t = timer(lambda: quantize_mse_triton(x, rot, cb.boundaries, bits, norms_dtype=torch.float16, **kw))
                rows.append(Row("quantize", f"b={bits} {str(dtype)[6:]} {name}", f"{n_vectors}x{dim}", t, moved,
                                1e6 * moved / copy_bw, "copy", 1e6 * moved / copy_bw, check))
            del x
    return rows


def bench_quantize_prod(timer, device, copy_bw, n_vectors, dim, bits_list) -> list[Row]:
    """TurboQuant_prod (b-1 bit codes + QJL signs + two norms) from fp16, checked against float64 first."""
    rows = []
    for bits in bits_list:
        quantizer = TurboQuantProd(dim, bits, rotation="haar", seed=0, device=device)
        mse = quantizer.mse
        args = (mse.rotation.matrix(), mse.codebook.boundaries, mse.codebook.centroids_tensor(device))
        s = quantizer.qjl.matrix
        x = torch.randn(min(n_vectors, 1 << 16), dim, device=device).to(torch.float16)
        codes, signs, norms, residual_norms = quantize_prod_triton(x, *args, bits - 1, s)
        ref = quantize_prod_reference(x, *args, bits - 1, s)
        code_ties = float((codes != ref["codes"]).double().mean())
        same = (codes == ref["codes"]).all(dim=-1)
        sign_flips = float((signs[same] != ref["signs"][same]).double().mean())
        res_err = float(((residual_norms.double() - ref["residual_norms"]).abs()[same]
                         / ref["residual_norms"][same]).max())
        if code_ties > 0.01 or sign_flips > 0.01 or res_err > 2e-2:
            raise AssertionError(f"quantize_prod b={bits}: ties {code_ties}, sign flips {sign_flips}, "
                                 f"residual norm err {res_err}")
        x = torch.randn(n_vectors, dim, device=device, dtype=torch.float16)
        moved = x.numel() * 2 + n_vectors * (codes.shape[-1] + signs.shape[-1] + 4)
        t = timer(lambda: quantize_prod_triton(x, *args, bits - 1, s, norms_dtype=torch.float16))
        rows.append(Row("quantize_prod", f"b={bits} float16", f"{n_vectors}x{dim}", t, moved, 1e6 * moved / copy_bw,
                        "copy", 1e6 * moved / copy_bw,
                        f"code ties {code_ties:.1e}, sign flips {sign_flips:.1e}, residual-norm err {res_err:.1e}"))
        del x
    return rows


def bench_library_paths(timer, device, copy_bw, n_vectors, dim, bits) -> list[Row]:
    """The kernels against the library's torch path on the same GPU (what backend dispatch would replace)."""
    quantizer = TurboQuantMSE(dim, bits, rotation="haar", seed=0, device=device)
    rotation, boundaries = quantizer.rotation.matrix(), quantizer.codebook.boundaries
    x = torch.randn(n_vectors, dim, device=device, dtype=torch.float16)
    qv = quantizer.quantize(x)
    moved = x.numel() * 2 + n_vectors * (qv.codes.shape[-1] + 4)
    t_torch = timer(lambda: quantizer.quantize(x))
    t_kernel = timer(lambda: quantize_mse_triton(x, rotation, boundaries, bits))
    rows = [Row("quantize vs library", f"b={bits} float16, float32 norms", f"{n_vectors}x{dim}", t_kernel, moved,
                1e6 * moved / copy_bw, "TurboQuantMSE.quantize (torch)", t_torch, "")]
    queries = torch.randn(32, dim, device=device)
    t_torch = timer(lambda: quantizer.inner_product(queries, qv))
    centroids = quantizer.codebook.centroids_tensor(device)
    t_kernel = timer(lambda: mse_scores_triton(quantizer.rotation.apply(queries)[None], qv.codes[None],
                                               qv.norms[None], centroids, bits))
    moved = qv.codes.numel() + qv.norms.numel() * 4 + 32 * n_vectors * 4
    rows.append(Row("scores vs library", f"b={bits}, 32 queries", f"{n_vectors}x{dim}", t_kernel, moved,
                    1e6 * moved / copy_bw, "TurboQuantMSE.inner_product (torch)", t_torch, ""))
    return rows


# ----------------------------------------------------------------------------------------------- scores
def random_packed(shape: tuple[int, ...], dim: int, bits: int, device) -> torch.Tensor:
    """Uniform random codes, packed: uniform random bytes are exactly that (the last byte's spare bits zeroed)."""
    row_bytes = -(-dim * bits // 8)
    packed = torch.randint(0, 256, (*shape, row_bytes), dtype=torch.uint8, device=device)
    spare = row_bytes * 8 - dim * bits
    if spare:
        packed[..., -1] &= (1 << (8 - spare)) - 1
    return packed


def packed_keys(batch: int, n: int, dim: int, bits: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    codes = random_packed((batch, n), dim, bits, device)
    norms = (torch.rand(batch, n, device=device) * 10 + 1).to(torch.float16)
    return codes, norms


def bench_scores(timer, device, copy_bw, sizes, bits_list, variants) -> list[Row]:
    rows = []
    group = HEADS_Q // HEADS_KV
    for bsz, ctx in sizes:
        batch = bsz * HEADS_KV
        q = torch.randn(batch, group, HEAD_DIM, device=device)
        keys32 = torch.randn(batch, ctx, HEAD_DIM, device=device)
        t32 = timer(lambda: torch.matmul(q, keys32.transpose(1, 2)), graph=True)
        del keys32
        keys16 = torch.randn(batch, ctx, HEAD_DIM, device=device, dtype=torch.bfloat16)
        q16 = q.to(torch.bfloat16)
        t16 = timer(lambda: torch.matmul(q16, keys16.transpose(1, 2)), graph=True)
        del keys16
        size = f"B={bsz} ctx={ctx}"
        for bits in bits_list:
            cb = lloyd_max_codebook(HEAD_DIM, bits)
            cent = cb.centroids_tensor(device, torch.float32)
            codes, norms = packed_keys(batch, ctx, HEAD_DIM, bits, device)
            sl = slice(0, min(batch, 4))
            ref = mse_scores_reference(q[sl], codes[sl, :4096], norms[sl, :4096], cent, bits)
            for name, kw in variants.items():
                out_dtype = kw.get("out_dtype", torch.float32)
                kw = dict(kw)
                check_kw = {k: v for k, v in kw.items() if k != "graph"}
                err = rel_err(mse_scores_triton(q[sl], codes[sl, :4096], norms[sl, :4096], cent, bits, **check_kw), ref)
                tolerance = 2e-3 if out_dtype == torch.float32 else 1e-2
                if kw.get("lookup", True) and not err < tolerance:
                    raise AssertionError(f"scores {name}: rel err {err}")
                moved = codes.numel() + norms.numel() * 2 + q.numel() * 4 + batch * group * ctx * (
                    torch.finfo(out_dtype).bits // 8)
                graph = kw.pop("graph", False)
                t = timer(lambda: mse_scores_triton(q, codes, norms, cent, bits, **kw), graph=graph)
                check = f"rel err {err:.1e}" if kw.get("lookup", True) else "diagnostic (no lookup)"
                rows.append(Row("scores", f"b={bits} {name}", size, t, moved, 1e6 * moved / copy_bw,
                                "fp32 matmul", t32, check))
                rows.append(Row("scores", f"b={bits} {name}", size, t, moved, 1e6 * moved / copy_bw,
                                "bf16 matmul", t16, check))
            del codes, norms
    return rows


# ----------------------------------------------------------------------------------------------- decode
def sdpa_best(timer, q, k, v) -> tuple[str, float]:
    """Fastest SDPA backend (bf16, GQA) that runs on these shapes: (name, µs)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    best = ("none", float("inf"))
    candidates = {"flash": [SDPBackend.FLASH_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
                  "cudnn": [SDPBackend.CUDNN_ATTENTION], "default": None}
    for name, backends in candidates.items():
        def run():
            if backends is None:
                return sdpa(q, k, v, enable_gqa=True)
            with sdpa_kernel(backends):
                return sdpa(q, k, v, enable_gqa=True)
        try:
            run()
            torch.cuda.synchronize() if q.is_cuda else None
            t = timer(run, graph=True)
        except RuntimeError as exc:  # backend refuses these shapes
            print(f"  sdpa {name}: unavailable ({str(exc).splitlines()[0][:80]})")
            continue
        print(f"  sdpa {name}: {t:.1f} us")
        if t < best[1]:
            best = (name, t)
    return best


def random_cache(bsz, ctx, bits, device):
    codes = random_packed((bsz, HEADS_KV, ctx), HEAD_DIM, bits, device)
    norms = (torch.rand(bsz, HEADS_KV, ctx, device=device) * 10 + 1).to(torch.float16)
    return codes, norms


def bench_decode(timer, device, copy_bw, sizes, bits_pairs, variants) -> list[Row]:
    rows = []
    rot = make_rotation("haar", HEAD_DIM, seed=0, device=device).matrix()
    for bsz, ctx in sizes:
        size = f"B={bsz} ctx={ctx}"
        q = torch.randn(bsz, HEADS_Q, HEAD_DIM, device=device, dtype=torch.bfloat16)
        if device.type == "cuda":
            k = torch.randn(bsz, HEADS_KV, ctx, HEAD_DIM, device=device, dtype=torch.bfloat16)
            v = torch.randn_like(k)
            base_name, t_base = sdpa_best(timer, q[:, :, None], k, v)
            del k, v
        else:
            base_name, t_base = "none (cpu)", float("nan")
        for k_bits, v_bits in bits_pairs:
            kcb, vcb = lloyd_max_codebook(HEAD_DIM, k_bits), lloyd_max_codebook(HEAD_DIM, v_bits)
            k_codes, k_norms = random_cache(bsz, ctx, k_bits, device)
            v_codes, v_norms = random_cache(bsz, ctx, v_bits, device)
            seq_lens = torch.full((bsz,), ctx, dtype=torch.int32, device=device)
            common = dict(k_centroids=kcb.centroids_tensor(device), v_centroids=vcb.centroids_tensor(device),
                          k_bits=k_bits, v_bits=v_bits, rotation=rot)
            rb = min(bsz, 2)
            check_lens = torch.randint(1, min(ctx, 4096) + 1, (rb,), dtype=torch.int32, device=device)
            args = (q[:rb], k_codes[:rb, :, :4096], k_norms[:rb, :, :4096], v_codes[:rb, :, :4096],
                    v_norms[:rb, :, :4096], check_lens)
            ref = decode_attention_reference(*args, **common)
            moved = sum(t.numel() * t.element_size() for t in (k_codes, k_norms, v_codes, v_norms)) + 2 * q.numel() * 2
            for name, kw in variants.items():
                kw = dict(kw)
                factor = kw.pop("split_factor", 1)
                graph = kw.pop("graph", False)
                kw["num_splits"] = max(1, round(factor * default_num_splits(bsz, HEADS_KV, ctx, device,
                                                                               kw.get("block_n", 64))))
                err = rel_err(decode_attention_triton(*args, **common, **kw), ref)
                if kw.get("lookup", True) and not err < 1e-2:
                    raise AssertionError(f"decode {name}: rel err {err}")
                t = timer(lambda: decode_attention_triton(q, k_codes, k_norms, v_codes, v_norms, seq_lens,
                                                          **common, **kw), graph=graph)
                rows.append(Row("decode", f"K{k_bits}V{v_bits} {name}", size, t, moved, 1e6 * moved / copy_bw,
                                f"sdpa bf16 ({base_name})", t_base,
                                f"rel err {err:.1e} (bf16 out)" if kw.get("lookup", True) else "diagnostic (no lookup)"))
            del k_codes, k_norms, v_codes, v_norms
        bf16_bytes = 2 * bsz * HEADS_KV * ctx * HEAD_DIM * 2
        if device.type == "cuda":
            rows.append(Row("decode", "bf16 sdpa baseline", size, t_base, bf16_bytes, 1e6 * bf16_bytes / copy_bw,
                            f"sdpa bf16 ({base_name})", t_base, ""))
    return rows


# ----------------------------------------------------------------------------------------------- report
def markdown_table(rows: list[Row]) -> str:
    head = ("| op | variant | size | time µs | GB/s | floor µs | floor/time | baseline | baseline µs | speedup | check |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r.op} | {r.variant} | {r.size} | {r.time_us:.1f} | {r.gbps:.0f} | {r.floor_us:.1f} | "
                     f"{r.floor_us / r.time_us:.2f} | {r.baseline} | {r.baseline_us:.1f} | {r.speedup:.2f} | {r.check} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/kernels"))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CPU interpreter): checks the script")
    parser.add_argument("--ops", default="quantize,prod,library,scores,decode")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    timer = Timer(device)
    ops = set(args.ops.split(","))
    if args.smoke:
        n_vectors, s_sizes, d_sizes = 300, [(1, 70)], [(2, 100)]
        q_variants = {"bn64 w4": {}}
        s_variants = {"bn64 w4": {}, "bf16-out": dict(out_dtype=torch.bfloat16)}
        d_variants = {"default": {}}
        copy_bytes = 1 << 20
    else:
        n_vectors = 1 << 24
        s_sizes = [(8, 8192), (8, 32768), (32, 32768), (16, 131072)]
        d_sizes = [(1, 8192), (8, 8192), (8, 32768), (32, 32768), (16, 131072)]
        q_variants = {"default (bn64 w4 st3)": {}, "bn64 w4 st2": dict(num_stages=2),
                      "bn128 w8 st3": dict(block_n=128, num_warps=8)}
        s_variants = {"default (bn128 w4)": {}, "default, CUDA graph": dict(graph=True), "bn64 w4": dict(block_n=64),
                      "bf16-out": dict(out_dtype=torch.bfloat16),
                      "no-lookup": dict(lookup=False), "no-lookup, CUDA graph": dict(lookup=False, graph=True)}
        d_variants = {"default (bn64 w4, 8/SM)": {}, "default, CUDA graph": dict(graph=True),
                      "bn64 w4 4/SM": dict(split_factor=0.5), "bn64 w4 4/SM, CUDA graph": dict(split_factor=0.5, graph=True),
                      "bn32 w4": dict(block_n=32), "no-lookup": dict(lookup=False),
                      "no-lookup, CUDA graph": dict(lookup=False, graph=True)}
        copy_bytes = 1 << 31
    copy_bw = copy_bandwidth(timer, device, copy_bytes)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    import triton

    header = (f"command: {' '.join([Path(sys.executable).name] + sys.argv)}\n"
              f"device: {gpu}; torch {torch.__version__}; triton {triton.__version__}; "
              f"copy bandwidth {copy_bw / 1e9:.0f} GB/s (read + write)")
    print(header, flush=True)
    rows: list[Row] = []

    def save() -> None:
        """Write CSV + Markdown after every op, so a run cut short keeps what it measured."""
        if not rows:
            return
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "kernels.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0].as_dict()))
            writer.writeheader()
            writer.writerows(r.as_dict() for r in rows)
        (args.out / "kernels.md").write_text(f"# Triton kernel benchmark\n\n```\n{header}\n```\n\n"
                                             f"{markdown_table(rows)}\n")

    if "quantize" in ops:
        dims_bits = [(128, 4), (128, 3), (128, 2)] if not args.smoke else [(128, 4), (96, 3)]
        first = dict(list(q_variants.items())[:1])
        rows += bench_quantize(timer, device, copy_bw, n_vectors, dims_bits[:1], [torch.float16], q_variants)
        rows += bench_quantize(timer, device, copy_bw, n_vectors, dims_bits[1:], [torch.float16], first)
        rows += bench_quantize(timer, device, copy_bw, n_vectors, dims_bits[:1], [torch.bfloat16, torch.float32],
                               first)
        save()
        print(markdown_table(rows), flush=True)
    if "library" in ops:
        rows += bench_library_paths(timer, device, copy_bw, n_vectors, 128, 4)
        save()
        print(markdown_table([r for r in rows if "library" in r.op]), flush=True)
    if "prod" in ops:
        rows += bench_quantize_prod(timer, device, copy_bw, n_vectors, 128, [4, 3, 2])
        save()
        print(markdown_table([r for r in rows if r.op == "quantize_prod"]), flush=True)
    if "scores" in ops:
        rows += bench_scores(timer, device, copy_bw, s_sizes, [4, 3] if not args.smoke else [4], s_variants)
        save()
        print(markdown_table([r for r in rows if r.op == "scores"]), flush=True)
    if "decode" in ops:
        rows += bench_decode(timer, device, copy_bw, d_sizes, [(4, 4), (3, 3)] if not args.smoke else [(4, 4)],
                             d_variants)
        save()
    print(header)
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
