"""Suite-wide settings: one BLAS/torch thread per pytest-xdist worker (`make test` runs two workers on
two cores; oversubscribed BLAS threads make small linear algebra many times slower)."""

import torch

torch.set_num_threads(1)
