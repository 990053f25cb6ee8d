"""quantize and prod ops: fused TurboQuant_mse (Algorithm 1) and TurboQuant_prod (Algorithm 2) quantization
against the copy floor, each checked against its float64 reference first (``python run.py experiment=kernels
'experiment.ops=[quantize,prod]'``). Bytes that must move: the input vectors, the packed codes and the norms."""
from __future__ import annotations

from functools import partial
from typing import Any

import torch

from .utils import DTYPES, Bench, Row, failed_row, kernel_kwargs, skip_off_gpu

__all__ = ["bench_quantize", "bench_quantize_prod", "check_quantize"]


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
    """Every variant at the first (dim, bits) and dtype (with ``sizes.all_widths``, at every width and, at the first
    width, every dtype); the first variant at the other widths and dtypes."""
    from turboquant.codebook import lloyd_max_codebook
    from turboquant.kernels.quantize import quantize_mse_triton
    from turboquant.rotation import make_rotation

    rows = []
    n = int(sizes.vectors)
    dims_bits = [tuple(pair) for pair in sizes.dims_bits]
    dtypes = [DTYPES[name] for name in sizes.dtypes]
    first = dict(list(variants.items())[:1])
    others = variants if sizes.get("all_widths", False) else first
    cases = [(dims_bits[0], dtypes[0], variants)] + [(db, dtypes[0], others) for db in dims_bits[1:]]
    cases += [(dims_bits[0], dtype, others) for dtype in dtypes[1:]]
    for (dim, bits), dtype, chosen in cases:
        cb = lloyd_max_codebook(dim, bits)
        rot = make_rotation("haar", dim, seed=0, device=bench.device).matrix()
        x = torch.randn(n, dim, device=bench.device, dtype=dtype)
        moved = x.numel() * x.element_size() + n * (-(-dim * bits // 8) + 2)
        for name, variant in chosen.items():
            kw, label = kernel_kwargs(variant), f"b={bits} {str(dtype)[6:]} {name}"
            if skip_off_gpu("quantize", name, kw, bench.device):
                continue
            try:
                check = "diagnostic (no nearest-centroid step)" if not kw.get("lookup", True) else check_quantize(
                    torch.randn(min(n, 1 << 16), dim, device=bench.device).to(dtype) * 3, rot, cb, bits, **kw)
                t = bench.timer(partial(quantize_mse_triton, x, rot, cb.boundaries, bits, norms_dtype=torch.float16,
                                        **kw))
            except Exception as exc:  # a failed check, compile or launch: recorded, the run goes on
                rows.append(failed_row("quantize", label, f"{n}x{dim}", exc))
                continue
            rows.append(Row("quantize", label, f"{n}x{dim}", t, moved, bench.floor_us(moved), "copy",
                            bench.floor_us(moved), check))
        del x
    return rows



def bench_quantize_prod(bench: Bench, sizes: Any, variants: dict[str, dict]) -> list[Row]:
    """TurboQuant_prod ((b-1)-bit codes + QJL signs + two norms) from fp16, each variant (kernel keyword arguments;
    none: the default) checked against float64 first."""
    from turboquant.kernels.quantize_prod import quantize_prod_reference
    from turboquant.quantizers import TurboQuantProd

    rows = []
    n, dim = int(sizes.vectors), int(sizes.dim)
    for bits in sizes.bits:
        quantizer = TurboQuantProd(dim, bits, rotation="haar", seed=0, device=bench.device)
        mse = quantizer.mse
        args = (mse.rotation.matrix(), mse.codebook.boundaries, mse.codebook.centroids_tensor(bench.device))
        s = quantizer.qjl.matrix
        x_check = torch.randn(min(n, 1 << 16), dim, device=bench.device).to(torch.float16)
        ref = quantize_prod_reference(x_check, *args, bits - 1, s)
        x = torch.randn(n, dim, device=bench.device, dtype=torch.float16)
        for name, variant in (variants or {"default": {}}).items():
            kw = kernel_kwargs(variant)
            if skip_off_gpu("quantize_prod", name, kw, bench.device):
                continue
            try:
                rows.append(_time_prod(bench, x, x_check, ref, args, s, bits, name, kw))
            except Exception as exc:  # a failed check, compile or launch: recorded, the run goes on
                rows.append(failed_row("quantize_prod", f"b={bits} float16 {name}", f"{n}x{dim}", exc))
        del x
    return rows


def _time_prod(bench: Bench, x, x_check, ref, args, s, bits: int, name: str, kw: dict) -> Row:
    """Check one TurboQuant_prod variant on ``x_check`` against ``ref``, then time it on ``x``."""
    from turboquant.kernels.quantize_prod import quantize_prod_triton

    n, dim = x.shape
    codes, signs, _, residual_norms = quantize_prod_triton(x_check, *args, bits - 1, s, **kw)
    code_ties = float((codes != ref["codes"]).double().mean())
    same = (codes == ref["codes"]).all(dim=-1)
    sign_flips = float((signs[same] != ref["signs"][same]).double().mean())
    res_err = float(((residual_norms.double() - ref["residual_norms"]).abs()[same]
                     / ref["residual_norms"][same]).max())
    if code_ties > 0.01 or sign_flips > 0.01 or res_err > 2e-2:
        raise AssertionError(f"quantize_prod b={bits} {name}: ties {code_ties}, sign flips {sign_flips}, "
                             f"residual norm err {res_err}")
    moved = x.numel() * 2 + n * (codes.shape[-1] + signs.shape[-1] + 4)
    t = bench.timer(partial(quantize_prod_triton, x, *args, bits - 1, s, norms_dtype=torch.float16, **kw))
    return Row("quantize_prod", f"b={bits} float16 {name}", f"{n}x{dim}", t, moved, bench.floor_us(moved), "copy",
               bench.floor_us(moved), f"code ties {code_ties:.1e}, sign flips {sign_flips:.1e}, "
               f"residual-norm err {res_err:.1e}")
