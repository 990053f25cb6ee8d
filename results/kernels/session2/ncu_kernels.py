"""One launch of the quantize kernel (16M x 128 fp16, 4-bit) and of the decode split kernel (B=8, 32K, K4V4) for ncu."""
import sys

import torch

sys.path.insert(0, ".")
import turboquant as tq
from experiments.kernels import random_norms, random_packed
from turboquant.kernels.decode_attention import decode_attention_triton
from turboquant.kernels.quantize import quantize_mse_triton

dev = torch.device("cuda")
cb = tq.lloyd_max_codebook(128, 4)
rot = tq.make_rotation("haar", 128, seed=0, device=dev).matrix()
x = torch.randn(1 << 24, 128, device=dev, dtype=torch.float16)
quantize_mse_triton(x, rot, cb.boundaries, 4)
B, T = 8, 32768
cache = [random_packed((B, 8, T), 128, 4, dev), random_norms((B, 8, T), dev), random_packed((B, 8, T), 128, 4, dev), random_norms((B, 8, T), dev)]
q = torch.randn(B, 32, 128, device=dev, dtype=torch.bfloat16)
decode_attention_triton(q, *cache, torch.full((B,), T, dtype=torch.int32, device=dev), k_centroids=cb.centroids_tensor(dev),
                        v_centroids=cb.centroids_tensor(dev), k_bits=4, v_bits=4, rotation=rot)
torch.cuda.synchronize()
print("done")
