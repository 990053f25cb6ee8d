"""TurboQuant: online vector quantization with near-optimal distortion rate.

A reproduction of Zandieh, Daliri, Hadian, Mirrokni (ICLR 2026, arXiv 2504.19874)::

    import torch, turboquant as tq
    x = torch.randn(10_000, 128)
    q = tq.TurboQuantProd(dim=128, bits=3)        # unbiased inner products (Algorithm 2)
    codes = q.quantize(x)                          # packed 2-bit indices + 1-bit QJL signs + norms
    scores = q.inner_product(torch.randn(5, 128), codes)   # (5, 10_000) estimates of <y, x>
    x_hat = q.dequantize(codes)                    # (10_000, 128) reconstruction
"""

from . import bounds
from .codebook import Codebook, lloyd_max_codebook
from .packing import pack_codes, packed_size, unpack_codes
from .codes import QuantizedVectors
from .quantizers import QJL, ScoreStage, TurboQuantMSE, TurboQuantProd
from .rotation import HaarRotation, RandomizedHadamard, Rotation, fast_walsh_hadamard, make_rotation

__all__ = [
    "bounds", "Codebook", "lloyd_max_codebook", "pack_codes", "packed_size", "unpack_codes", "QJL",
    "QuantizedVectors", "ScoreStage", "TurboQuantMSE", "TurboQuantProd", "HaarRotation", "RandomizedHadamard",
    "Rotation", "fast_walsh_hadamard", "make_rotation",
]
__version__ = "0.1.0"
