"""One launch each of the decode split kernel (B=8, 32K tokens, 32 query / 8 KV heads, head_dim 128) for ncu:
K4V4 one group, the 3.5-bit preset (32 outlier channels at 4 bits + 96 at 3, keys and values), and the 3.5-bit
preset with prod keys (3/2-bit MSE + QJL signs). Random codes; the channel permutation is the identity.
Run: ncu ... -k regex:decode_split python3 results/kernels/session3/ncu_split.py (TRITON_INTERPRET=1 B=1 T=70: CPU check)."""
import os
import sys

import torch

sys.path.insert(0, ".")
import turboquant as tq
from experiments.kernels import random_norms, random_packed
from turboquant.kernels.decode_attention import CacheFormat, ChannelGroup, GroupFields, decode_attention_groups_triton

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
B, T, HQ, HKV = int(os.environ.get("B", 8)), int(os.environ.get("T", 32768)), 32, 8


def group(dim: int, bits: int, seed: int, prod: bool = False) -> tuple[ChannelGroup, GroupFields]:
    mse_bits = bits - 1 if prod else bits
    rot = tq.make_rotation("haar", dim, seed=seed, device=dev).matrix()
    cb = tq.lloyd_max_codebook(dim, mse_bits)
    sketch = tq.QJL(dim, seed=seed, device=dev).matrix if prod else None
    fields = GroupFields(random_packed((B, HKV, T), dim, mse_bits, dev), random_norms((B, HKV, T), dev),
                         random_packed((B, HKV, T), dim, 1, dev) if prod else None,
                         random_norms((B, HKV, T), dev) if prod else None)
    return ChannelGroup(dim, mse_bits, rot, cb.centroids_tensor(dev), sketch), fields


q = torch.randn(B, HQ, 128, device=dev, dtype=torch.bfloat16)
seq_lens = torch.full((B,), T, dtype=torch.int32, device=dev)
identity = torch.arange(128, device=dev).expand(B, HKV, 128).contiguous()
cases = {
    "K4V4": ([group(128, 4, 0)], [group(128, 4, 1)]),
    "3.5-bit split": ([group(32, 4, 0), group(96, 3, 1)], [group(32, 4, 2), group(96, 3, 3)]),
    "3.5-bit split, prod keys": ([group(32, 4, 0, True), group(96, 3, 1, True)], [group(32, 4, 2), group(96, 3, 3)]),
}
for name, (keys, values) in cases.items():
    fmt = CacheFormat.build([g for g, _ in keys], [g for g, _ in values], dev)
    split = len(keys) == 2
    out = decode_attention_groups_triton(q, [f for _, f in keys], [f for _, f in values], seq_lens, fmt,
                                         key_permutation=identity if split else None,
                                         value_permutation=identity if split else None)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    print(name, tuple(out.shape), float(out.float().abs().mean()))
