"""Compile kernel variants for a CUDA target without a GPU and count what the SASS does per launch.

    python -m benchmarks.compile_offline                 # decode + scores variants of session 5, sm_90
    python -m benchmarks.compile_offline --arch 90 --ops decode
    python -m benchmarks.compile_offline --ops mma      # the register-operand kernel (Gluon), 16-64 tokens
    python -m benchmarks.compile_offline --ops quantize # the warpgroup-MMA quantize kernel (Gluon), 4-1 bits

Each launch of the entry points (called on small CPU tensors of the benchmark's shapes: 32 query / 8 KV heads,
d = 128) is compiled by ``triton.compile`` for the target instead of being run (Triton's argument binder and
specialization, then ptxas, which ships with Triton), and its cubin read with ``cuobjdump`` / ``nvdisasm``:
registers, spills, static shared memory, the count of SASS instructions by opcode class in the whole kernel
(loads from global / shared memory, shared stores, MMA, FMA, byte permutes), and the length of the longest loop
body (the instructions between a backward branch and its target) with the shared-memory loads and stores in it.
Static counts, not timings: they show whether a variant stages its decoded tile through shared memory (``STS`` /
``LDSM``) or gathers from a table (``LDG`` inside the loop), which is what ``benchmarks/NOTES.md`` found limiting.
Catches compile errors before any GPU time is spent.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import torch

_CLASSES = {
    "LDG": r"^LDG", "LDS": r"^LDS(?!M)", "LDSM": r"^LDSM", "STS": r"^STS", "HMMA": r"^HMMA", "HGMMA": r"^HGMMA",
    "FFMA": r"^FFMA", "HFMA2": r"^HFMA2", "PRMT": r"^PRMT", "SEL": r"^F?SEL", "SHFL": r"^SHFL", "BAR": r"^BAR",
}


def _tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def sass_profile(cubin: bytes) -> dict[str, int]:
    """Registers, spill bytes and SASS instruction counts (total and per class of :data:`_CLASSES`) of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                               text=True).stdout
        sass = subprocess.run([_tool("nvdisasm"), "-hex", f.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    spills = re.search(r"STACK:(\d+)", usage)
    ops, labels, branches = [], {}, []
    for line in sass.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(ops)
            continue
        op = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)", line)
        if op:
            ops.append(op.group(1))
            target = re.search(r"(\.L_x_\d+)", op.group(2)) if op.group(1).startswith("BRA") else None
            if target:
                branches.append((len(ops) - 1, target.group(1)))
    counts = Counter(ops)
    out = {"regs": int(regs.group(1)) if regs else -1, "stack": int(spills.group(1)) if spills else -1,
           "sass": len(ops)}
    for name, pattern in _CLASSES.items():
        out[name] = sum(n for op, n in counts.items() if re.match(pattern, op))
    loops = [(labels[target], at) for at, target in branches if labels.get(target, at + 1) <= at]
    start, end = max(loops, key=lambda span: span[1] - span[0], default=(0, -1))
    body = ops[start:end + 1]
    out["loop"] = len(body)
    out["loop shared"] = sum(1 for op in body if re.match(r"^(LDS|STS)", op))
    return out


def _gluon_source():
    from triton.experimental.gluon._runtime import GluonASTSource

    return GluonASTSource


def compile_launches(arch: int, calls) -> list[tuple[str, str, dict[str, int], int]]:
    """Run ``calls()`` with every Triton launch replaced by an offline compile for ``sm_<arch>``; per launch:
    (kernel name, label set by the caller, :func:`sass_profile`, static shared memory bytes)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as triton_compile, make_backend
    from triton.runtime import jit

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    launches, label = [], {"now": ""}
    original = jit.JITFunction.run

    def compile_instead(self, *args, grid, warmup, **kwargs):
        binder = jit.create_function_from_signature(self.signature, self.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, specialization, options)
        source = _gluon_source() if getattr(self, "is_gluon", lambda: False)() else ASTSource
        kernel = triton_compile(source(self, signature, constexprs, attrs), target=target, options=options.__dict__)
        launches.append((self.fn.__name__, label["now"], sass_profile(kernel.asm["cubin"]),
                         int(kernel.metadata.shared)))

    jit.JITFunction.run = compile_instead
    try:
        calls(label)
    finally:
        jit.JITFunction.run = original
    return launches


def _session5_calls(ops: list[str]):
    import turboquant as tq
    from turboquant.kernels import _layout
    from turboquant.kernels.decode_attention import (CacheFormat, ChannelGroup, decode_attention_groups_triton,
                                                     decode_attention_triton, launch)
    from turboquant.kernels.scores import mse_scores_triton

    for module in (_layout, launch):
        module.check_device = lambda device: None
    from turboquant.backends import decode_kernel

    launch.decode_kernel = lambda requested, device, layout: decode_kernel(requested, None, layout)  # judge the layout
    import turboquant.kernels.scores as scores_module

    scores_module.check_device = lambda device: None
    gen = torch.Generator().manual_seed(0)
    dim = 128

    def run(label):
        rot = tq.make_rotation("haar", dim, seed=0).matrix()
        if "quantize" in ops:  # the warpgroup-MMA quantize kernels (Gluon; rows staged by TMA), through their launchers
            from turboquant.kernels import quantize_wgmma

            x = torch.randn(1000, dim, generator=gen).half()
            for bits in (4, 3, 2, 1):
                label["now"] = f"quantize b={bits} wgmma"
                quantize_wgmma.quantize_mse_wgmma(x, rot, tq.lloyd_max_codebook(dim, bits).boundaries, bits)
            label["now"] = "quantize b=4 wgmma 3 stages"  # three tiles in flight
            quantize_wgmma.quantize_mse_wgmma(x, rot, tq.lloyd_max_codebook(dim, 4).boundaries, 4, stages=3)
            sketch = torch.randn(dim, dim, generator=gen)
            for bits in (4, 3, 2):
                label["now"] = f"quantize prod b={bits} wgmma"
                codebook = tq.lloyd_max_codebook(dim, bits - 1)
                quantize_wgmma.quantize_prod_wgmma(x, rot, codebook.boundaries, codebook.centroids_tensor(), bits - 1,
                                                   sketch)
            label["now"] = "quantize b=4 wgmma bf16 rows"
            quantize_wgmma.quantize_mse_wgmma(x.bfloat16(), rot, tq.lloyd_max_codebook(dim, 4).boundaries, 4)
            label["now"] = "quantize prod b=4 wgmma bf16 rows"
            codebook = tq.lloyd_max_codebook(dim, 3)
            quantize_wgmma.quantize_prod_wgmma(x.bfloat16(), rot, codebook.boundaries, codebook.centroids_tensor(), 3,
                                               sketch)
        if "mma" in ops:  # the register-operand kernel (Gluon): 4-bit K/V only
            cb = tq.lloyd_max_codebook(dim, 4).centroids_tensor()
            lead = (1, 8, 64)
            codes = tq.pack_codes(torch.randint(0, 16, (*lead, dim), generator=gen), 4)
            norms = torch.rand(*lead, generator=gen).half()
            for block_n, stages in ((16, 2), (32, 2), (32, 1), (64, 1)):
                label["now"] = f"decode K4V4 mma bn{block_n}" + (" prefetch" if stages > 1 else "")
                decode_attention_triton(torch.randn(1, 32, dim, generator=gen), codes, norms, codes, norms,
                                        torch.tensor([64], dtype=torch.int32), k_centroids=cb, v_centroids=cb,
                                        k_bits=4, v_bits=4, rotation=rot, num_splits=1, block_n=block_n,
                                        num_stages=stages, kernel="mma")
            for decoder in ("lut", "lut-keys", "lut-values"):  # two codes per load from a shared-memory table
                label["now"] = f"decode K4V4 mma bn32 prefetch {decoder}"
                decode_attention_triton(torch.randn(1, 32, dim, generator=gen), codes, norms, codes, norms,
                                        torch.tensor([64], dtype=torch.int32), k_centroids=cb, v_centroids=cb,
                                        k_bits=4, v_bits=4, rotation=rot, num_splits=1, kernel="mma", decoder=decoder)
            label["now"] = "scores b=4 mma"
            mse_scores_triton(torch.randn(8, 4, dim, generator=gen), codes[0], norms[0], cb, 4, kernel="mma")
            cb3 = tq.lloyd_max_codebook(dim, 3).centroids_tensor()
            codes3 = tq.pack_codes(torch.randint(0, 8, (*lead, dim), generator=gen), 3)
            for (k_bits, k_codes, k_cb), (v_bits, v_codes, v_cb) in (((3, codes3, cb3), (3, codes3, cb3)),
                                                                     ((4, codes, cb), (3, codes3, cb3))):
                label["now"] = f"decode K{k_bits}V{v_bits} mma bn32 prefetch"
                decode_attention_triton(torch.randn(1, 32, dim, generator=gen), k_codes, norms, v_codes, norms,
                                        torch.tensor([64], dtype=torch.int32), k_centroids=k_cb, v_centroids=v_cb,
                                        k_bits=k_bits, v_bits=v_bits, rotation=rot, num_splits=1, kernel="mma")
            label["now"] = "scores b=3 mma"
            mse_scores_triton(torch.randn(8, 4, dim, generator=gen), codes3[0], norms[0], cb3, 3, kernel="mma")
            label["now"] = "decode 3.5-bit split mma bn32 prefetch"  # 32 outlier channels at 4 bits + 96 at 3
            split = [(32, 4), (dim - 32, 3)]
            streams = [[ChannelGroup(m, b, tq.make_rotation("haar", m, seed=seed + i).matrix(),
                                     tq.lloyd_max_codebook(m, b).centroids_tensor()) for i, (m, b) in enumerate(split)]
                       for seed in (0, 5)]
            split_format = CacheFormat.build(*streams, "cpu")
            fields = [[g.packed(tq.pack_codes(torch.randint(0, 2 ** g.bits, (*lead, g.dim), generator=gen), g.bits),
                                norms) for g in groups] for groups in (split_format.key_groups,
                                                                        split_format.value_groups)]
            decode_attention_groups_triton(torch.randn(1, 32, dim, generator=gen), *fields,
                                           torch.tensor([64], dtype=torch.int32), split_format, num_splits=1,
                                           kernel="mma")
        for bits in (4, 3) if {"decode", "scores"} & set(ops) else ():
            cb = tq.lloyd_max_codebook(dim, bits).centroids_tensor()
            lead = (1, 8, 64)
            codes = tq.pack_codes(torch.randint(0, 2 ** bits, (*lead, dim), generator=gen), bits)
            norms = torch.rand(*lead, generator=gen).half()
            q = torch.randn(1, 32, dim, generator=gen)
            if "decode" in ops:
                for decoder in ("table", "select", "prmt"):
                    for inner, block_n in (("dot", 64), ("fma", 32), ("fma", 64)):
                        label["now"] = f"decode K{bits}V{bits} {decoder} {inner} bn{block_n}"
                        decode_attention_triton(q, codes, norms, codes, norms, torch.tensor([64], dtype=torch.int32),
                                                k_centroids=cb, v_centroids=cb, k_bits=bits, v_bits=bits,
                                                rotation=rot, num_splits=1, block_n=block_n, decoder=decoder,
                                                inner=inner)
            if "scores" in ops:
                for decoder in ("table", "select", "prmt"):
                    label["now"] = f"scores b={bits} {decoder}"
                    mse_scores_triton(torch.randn(8, 4, dim, generator=gen), codes[0], norms[0], cb, bits,
                                      decoder=decoder)
    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--ops", nargs="+", default=["decode", "scores"])
    args = parser.parse_args(argv)
    launches = compile_launches(args.arch, _session5_calls(args.ops))
    keys = ["regs", "stack", "sass", *_CLASSES, "loop", "loop shared"]
    print("| launch | kernel | shared B | " + " | ".join(keys) + " |")
    print("|---|---|---|" + "---|" * len(keys))
    for name, label, profile, shared in launches:
        if name in ("merge_kernel", "rotate_kernel"):
            continue
        print(f"| {label} | {name} | {shared} | " + " | ".join(str(profile[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
