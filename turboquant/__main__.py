"""``python -m turboquant``: which backend and read path serve each configuration on this machine
(:func:`turboquant.backends.capability_table`)."""

import torch

from turboquant.backends import capability_table

print(capability_table("cuda" if torch.cuda.is_available() else "cpu"))
