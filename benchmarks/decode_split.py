"""The decode kernel on the three cache formats of the fused decode step (B=8, 32K tokens, 32 query / 8 KV heads,
head_dim 128, random codes, identity channel order): K4V4 one group; the 3.5-bit preset (32 outlier channels at
4 bits + 96 at 3, keys and values); the 3.5-bit preset with prod keys (3/2-bit MSE + QJL signs).

    python -m benchmarks.decode_split launch    # one launch of each format (under ncu: -k regex:decode_split)
    python -m benchmarks.decode_split sweep     # tile / warp / stage sweep, median µs (do_bench, L2 flushed)

``--batch 1 --tokens 70`` with ``TRITON_INTERPRET=1`` checks the code path on the CPU (the sweep then runs one
setting). Outputs of session 3: ``results/kernels/session3/ncu_split.txt``, ``sweep_split.txt``.
"""
from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass

import torch

from .utils import HEAD_DIM, HEADS_KV, HEADS_Q, Timer, random_norms, random_packed

__all__ = ["SplitCase", "launch", "split_cases", "sweep"]


@dataclass
class SplitCase:
    """A cache format with random packed fields, and the channel order of a split stream (None: one group)."""

    cache_format: object  # turboquant.kernels.decode_attention.CacheFormat
    keys: list
    values: list
    permutation: torch.Tensor | None

    def __call__(self, q: torch.Tensor, seq_lens: torch.Tensor, **options) -> torch.Tensor:
        from turboquant.kernels.decode_attention import decode_attention_groups_triton

        return decode_attention_groups_triton(q, self.keys, self.values, seq_lens, self.cache_format,
                                              key_permutation=self.permutation,
                                              value_permutation=self.permutation, **options)


def _group(batch: int, tokens: int, dim: int, bits: int, seed: int, device: torch.device, prod: bool = False):
    """(ChannelGroup, QuantizedVectors) of ``bits``-bit random codes; ``prod``: (bits-1)-bit MSE + QJL signs."""
    import turboquant as tq
    from turboquant.kernels.decode_attention import ChannelGroup

    mse_bits = bits - 1 if prod else bits
    lead = (batch, HEADS_KV, tokens)
    rotation = tq.make_rotation("haar", dim, seed=seed, device=device).matrix()
    centroids = tq.lloyd_max_codebook(dim, mse_bits).centroids_tensor(device)
    qjl = tq.QJL(dim, seed=seed, device=device) if prod else None
    sketch, scale = (qjl.matrix, qjl.scale) if prod else (None, None)
    group = ChannelGroup(dim, mse_bits, rotation, centroids, sketch, scale)
    return group, group.packed(random_packed(lead, dim, mse_bits, device), random_norms(lead, device),
                               random_packed(lead, dim, 1, device) if prod else None,
                               random_norms(lead, device) if prod else None)


def split_cases(batch: int, tokens: int, device: torch.device) -> dict[str, SplitCase]:
    """The three formats by name."""
    from turboquant.kernels.decode_attention import CacheFormat

    def g(dim, bits, seed, prod=False):
        return _group(batch, tokens, dim, bits, seed, device, prod)

    layouts = {
        "K4V4": ([g(128, 4, 0)], [g(128, 4, 1)]),
        "3.5-bit split": ([g(32, 4, 0), g(96, 3, 1)], [g(32, 4, 2), g(96, 3, 3)]),
        "3.5-bit split, prod keys": ([g(32, 4, 0, True), g(96, 3, 1, True)], [g(32, 4, 2), g(96, 3, 3)]),
    }
    identity = torch.arange(HEAD_DIM, device=device).expand(batch, HEADS_KV, HEAD_DIM).contiguous()
    return {name: SplitCase(CacheFormat.build([f for f, _ in keys], [f for f, _ in values], device),
                            [t for _, t in keys], [t for _, t in values], identity if len(keys) == 2 else None)
            for name, (keys, values) in layouts.items()}


def _inputs(batch: int, tokens: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.randn(batch, HEADS_Q, HEAD_DIM, device=device, dtype=torch.bfloat16)
    return q, torch.full((batch,), tokens, dtype=torch.int32, device=device)


def launch(batch: int, tokens: int, device: torch.device) -> None:
    """One call of each format (what ncu profiles), printing the output's shape and mean magnitude."""
    q, seq_lens = _inputs(batch, tokens, device)
    for name, case in split_cases(batch, tokens, device).items():
        out = case(q, seq_lens)
        if device.type == "cuda":
            torch.cuda.synchronize()
        print(name, tuple(out.shape), float(out.float().abs().mean()))


def sweep(batch: int, tokens: int, device: torch.device) -> None:
    """Median µs of every (tokens per tile, warps, stages) per format, with the max relative difference of its
    output to the first setting's (same inputs for every setting)."""
    q, seq_lens = _inputs(batch, tokens, device)
    timer = Timer(device)
    settings = list(itertools.product((32, 64, 128), (4, 8), (1, 2, 3)))
    if device.type != "cuda":
        settings = settings[:1]
    for name, case in split_cases(batch, tokens, device).items():
        ref = None
        for block_n, warps, stages in settings:
            def call(block_n=block_n, warps=warps, stages=stages):
                return case(q, seq_lens, block_n=block_n, num_warps=warps, num_stages=stages)
            try:
                out = call().float()
            except Exception as error:  # noqa: BLE001 - out of shared memory / registers for this tile
                print(f"{name:28s} bn{block_n:<4d} w{warps} st{stages}: failed ({type(error).__name__})")
                continue
            ref = out if ref is None else ref
            err = float((out - ref).abs().max() / ref.abs().max())
            us = timer(call) if device.type == "cuda" else float("nan")
            print(f"{name:28s} bn{block_n:<4d} w{warps} st{stages}: {us:8.1f} us  (max rel diff vs first {err:.1e})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["launch", "sweep"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32768)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    (launch if args.what == "launch" else sweep)(args.batch, args.tokens, device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
