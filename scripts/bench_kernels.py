"""Kernel benchmark entry point kept for old commands: the same as ``python run.py experiment=kernels ...``.

The measurements live in ``experiments/kernels.py`` (one implementation); this wrapper only runs ``run.py``
with ``experiment=kernels`` and its own arguments as further Hydra overrides, e.g.

    python scripts/bench_kernels.py 'experiment.ops=[scores,decode]' scale=paper
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    run_py = Path(__file__).resolve().parents[1] / "run.py"
    sys.path.insert(0, str(run_py.parent))
    sys.argv = [str(run_py), "experiment=kernels", *sys.argv[1:]]
    runpy.run_path(str(run_py), run_name="__main__")
