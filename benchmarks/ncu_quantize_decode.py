"""One launch of the quantize kernel (16M x 128 fp16, 4-bit) and of the one-group decode split kernel (B=8, 32K
tokens, K4V4), for ncu:

    ncu ... -k regex:"quantize_mse|decode_split|merge|rotate" python -m benchmarks.ncu_quantize_decode
    ncu ... -k regex:"mma_split|merge|rotate" python -m benchmarks.ncu_quantize_decode --kernel mma --no-quantize

Output of session 2: ``results/kernels/session2/ncu_quantize_decode.txt``."""
from __future__ import annotations

import argparse

import torch

from .utils import HEAD_DIM, HEADS_KV, HEADS_Q, random_norms, random_packed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernel", choices=["tiles", "mma"], default="tiles", help="the decode split kernel")
    parser.add_argument("--no-quantize", action="store_true", help="launch the decode kernels only")
    args = parser.parse_args(argv)
    import turboquant as tq
    from turboquant.kernels.decode_attention import decode_attention_triton
    from turboquant.kernels.quantize import quantize_mse_triton

    device = torch.device("cuda")
    codebook = tq.lloyd_max_codebook(HEAD_DIM, 4)
    rotation = tq.make_rotation("haar", HEAD_DIM, seed=0, device=device).matrix()
    if not args.no_quantize:
        x = torch.randn(1 << 24, HEAD_DIM, device=device, dtype=torch.float16)
        quantize_mse_triton(x, rotation, codebook.boundaries, 4)
    batch, tokens = 8, 32768
    lead = (batch, HEADS_KV, tokens)
    cache = [random_packed(lead, HEAD_DIM, 4, device), random_norms(lead, device),
             random_packed(lead, HEAD_DIM, 4, device), random_norms(lead, device)]
    q = torch.randn(batch, HEADS_Q, HEAD_DIM, device=device, dtype=torch.bfloat16)
    centroids = codebook.centroids_tensor(device)
    decode_attention_triton(q, *cache, torch.full((batch,), tokens, dtype=torch.int32, device=device),
                            k_centroids=centroids, v_centroids=centroids, k_bits=4, v_bits=4, rotation=rotation,
                            kernel=args.kernel)
    torch.cuda.synchronize()
    print("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
