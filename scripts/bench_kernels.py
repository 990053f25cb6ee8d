"""Kernel benchmark entry point kept for old commands: the same as ``python run.py experiment=kernels ...``.

The measurements live in ``experiments/kernels.py`` (one implementation); this wrapper only forwards its
arguments as Hydra overrides, e.g.

    python scripts/bench_kernels.py 'experiment.ops=[scores,decode]' scale=paper
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import run

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "experiment=kernels", *sys.argv[1:]]
    run.main()
