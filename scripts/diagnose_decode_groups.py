"""Relative error of ``decode_attention_groups_triton`` against its float64 reference over value groups x token tile
x value permutation x decoder: the run that located session 9's GPU-only failure (benchmarks/NOTES.md, Session 10).

    python scripts/diagnose_decode_groups.py            # on a CUDA machine; about two minutes of compiles
    TRITON_INTERPRET=1 python scripts/diagnose_decode_groups.py --device cpu   # the CPU interpreter (no prmt)

On the H200, before the fix, every case above 1e-3 had a 16-token tile with a 3-bit group decoded whole in channel
order, with every decoder (``results/kernels/session10/diagnose_decode_groups_before.txt``); channel order is now
used only in tiles of ``CHANNEL_ORDER_MIN_TOKENS`` tokens or more. One line per configuration; the fields come from
the kernel tests' own generator (``random_stream``).
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
from test_kernel_decode_attention import random_permutation, random_stream, rel_err  # noqa: E402

from turboquant.kernels.decode_attention import (CacheFormat, decode_attention_groups_reference,  # noqa: E402
                                                 decode_attention_groups_triton)

#: (label, key groups (dim, bits, qjl), value groups (dim, bits))
CASES = [
    ("K16@4+48@3 V16@4+48@3 (failed)", [(16, 4, False), (48, 3, False)], [(16, 4), (48, 3)]),
    ("K64@4 V16@4+48@3", [(64, 4, False)], [(16, 4), (48, 3)]),
    ("K64@4 V16@2+48@3 (select-dot failed)", [(64, 4, False)], [(16, 2), (48, 3)]),
    ("K64@4 V48@3+16@4 (3-bit first)", [(64, 4, False)], [(48, 3), (16, 4)]),
    ("K64@4 V64@3 (one group)", [(64, 4, False)], [(64, 3)]),
    ("K128@4 V32@4+96@3 (preset shape, passed at 64-128 tokens)", [(128, 4, False)], [(32, 4), (96, 3)]),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    device = torch.device(parser.parse_args(argv).device)
    decoders = ("table", "select", "prmt") if device.type == "cuda" else ("table", "select")
    for (label, key_groups, value_groups), block_n, permute, decoder in itertools.product(
            CASES, (16, 32, 64, 128), (False, True), decoders):
        generator = torch.Generator().manual_seed(0)
        lens = [61, 23]
        batch, dim = len(lens), sum(g[0] for g in key_groups)
        keys, key_format = random_stream(batch, 2, max(lens), key_groups, generator, device, seed=3)
        values, value_format = random_stream(batch, 2, max(lens), [(m, b, False) for m, b in value_groups],
                                             generator, device, seed=7)
        cache_format = CacheFormat.build(key_format, value_format, device)
        perms = {"key_permutation": random_permutation(batch, 2, dim, generator, device) if permute else None,
                 "value_permutation": (random_permutation(batch, 2, dim, generator, device)
                                       if permute and len(value_groups) == 2 else None)}
        q = torch.randn(batch, 8, dim, generator=generator).to(device)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        try:
            out = decode_attention_groups_triton(q, keys, values, seq_lens, cache_format, num_splits=3,
                                                 block_n=block_n, decoder=decoder, **perms)
            ref = decode_attention_groups_reference(q, keys, values, seq_lens, cache_format, **perms)
            error = f"{rel_err(out, ref):.2e}"
        except Exception as problem:  # a compile error is a finding too
            error = f"{type(problem).__name__}: {str(problem)[:80]}"
        print(f"{label} | bn{block_n} | permute={permute} | {decoder} | {error}", flush=True)


if __name__ == "__main__":
    main()
