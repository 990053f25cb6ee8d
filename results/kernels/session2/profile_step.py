"""Diagnostics for the session-2 H200 run (not part of the repo): where a decode step's time goes; kernel resources."""
import sys
import time

import torch

sys.path.insert(0, ".")
import transformers
from omegaconf import OmegaConf

from experiments.kernels import decode_step, decode_step_model, fill_cache
from turboquant.kvcache import build_cache

dev = torch.device("cuda")
sizes = OmegaConf.create({"layers": 4, "intermediate_size": 14336, "vocab_size": 32000})
model = decode_step_model(sizes, dev)
B, T = 8, 32768
tok = torch.randint(0, 32000, (B, 1), device=dev)

def timed(cache, fused, n=10):
    for _ in range(3):
        decode_step(model, tok, cache, fused)
    torch.cuda.synchronize()
    t0 = time.perf_counter(); s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        decode_step(model, tok, cache, fused)
    e.record(); torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3, s.elapsed_time(e) / n

for name in ("full", "workspace", "fused"):
    if name == "full":
        cache = transformers.DynamicCache()
    elif name == "workspace":
        cache = build_cache("turboquant", model.config, key_bits=4, value_bits=4)
    else:
        cache = build_cache("turboquant", model.config, fused_decode=True, key_bits=4, value_bits=4)
    fill_cache(cache, model, B, T, dev)
    wall, ev = timed(cache, name == "fused")
    print(f"{name}: wall {wall:.2f} ms/step, events {ev:.2f} ms/step, mem {torch.cuda.memory_allocated()/1e9:.1f} GB "
          f"reserved {torch.cuda.memory_reserved()/1e9:.1f} GB", flush=True)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            decode_step(model, tok, cache, name == "fused")
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60), flush=True)
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60), flush=True)
    del cache
    torch.cuda.empty_cache()

# resources of the quantize kernel variants (after the sweep compiled them in this process)
import turboquant as tq
from turboquant.kernels.quantize import _quantize_mse_kernel, quantize_mse_triton

cb = tq.lloyd_max_codebook(128, 4); rot = tq.make_rotation("haar", 128, seed=0, device=dev).matrix()
x = torch.randn(1 << 20, 128, device=dev, dtype=torch.float16)
for kw in ({}, {"num_stages": 1}, {"block_n": 32, "num_stages": 2}, {"block_n": 128, "num_warps": 8, "num_stages": 2}, {"block_n": 16, "num_stages": 2}):
    quantize_mse_triton(x, rot, cb.boundaries, 4, **kw)
torch.cuda.synchronize()
try:
    caches = _quantize_mse_kernel.device_caches
    for entry in caches.values():
        for key, k in entry[0].items():
            md = k.metadata
            print("quantize kernel:", "block_n", [c for c in str(key).split(",") if "BLOCK_N" in c][:1], "warps", md.num_warps, "stages", md.num_stages,
                  "regs", k.n_regs, "spills", k.n_spills, "shared", md.shared)
except Exception as exc:  # noqa: BLE001 - a diagnostic: report and go on
    print("no resource report:", repr(exc))
