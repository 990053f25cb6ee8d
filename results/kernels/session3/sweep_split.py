"""Tile / warp / stage sweep of the decode split kernel for the three formats of ncu_split.py (B=8, 32K):
median µs by triton.testing.do_bench (CUDA-graph free, L2 flushed), same inputs for every setting.
Run: python3 results/kernels/session3/sweep_split.py (TRITON_INTERPRET=1 B=1 T=70: CPU check, one setting)."""
import itertools
import os
import sys

import torch
import triton

sys.path.insert(0, "results/kernels/session3")
sys.path.insert(0, ".")
import ncu_split as setup  # noqa: E402 - builds the three cases (and runs each once)
from turboquant.kernels.decode_attention import CacheFormat, decode_attention_groups_triton  # noqa: E402

settings = list(itertools.product((32, 64, 128), (4, 8), (1, 2, 3)))
if setup.dev.type != "cuda":
    settings = settings[:1]
for name, (keys, values) in setup.cases.items():
    fmt = CacheFormat.build([g for g, _ in keys], [g for g, _ in values], setup.dev)
    perm = setup.identity if len(keys) == 2 else None
    ref = None
    for block_n, warps, stages in settings:
        def call(block_n=block_n, warps=warps, stages=stages):
            return decode_attention_groups_triton(setup.q, [f for _, f in keys], [f for _, f in values], setup.seq_lens,
                                                  fmt, key_permutation=perm, value_permutation=perm, block_n=block_n,
                                                  num_warps=warps, num_stages=stages)
        try:
            out = call().float()
        except Exception as error:  # out of shared memory / registers for this tile
            print(f"{name:28s} bn{block_n:<4d} w{warps} st{stages}: failed ({type(error).__name__})")
            continue
        ref = out if ref is None else ref
        err = float((out - ref).abs().max() / ref.abs().max())
        us = triton.testing.do_bench(call, return_mode="median") * 1e3 if setup.dev.type == "cuda" else float("nan")
        print(f"{name:28s} bn{block_n:<4d} w{warps} st{stages}: {us:8.1f} us  (max rel diff vs first {err:.1e})")
