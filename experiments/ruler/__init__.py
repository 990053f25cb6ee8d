"""RULER with compressed KV caches: ``python run.py experiment=ruler``.

Modules: ``library`` (the shipped ``nvidia-long-context-eval`` package's tasks, generators and metric, used as a
library), ``worker`` (runs one of its generator scripts in a child process), ``samples`` (chat-templated samples
per model, cached), ``table`` (mean ± SE, gap to the full cache with paired SE), ``experiment`` (run / plot).
"""

from experiments.ruler.experiment import RESULT_KEYS, plot, run, stored_frame, write_tables

__all__ = ["RESULT_KEYS", "run", "stored_frame", "plot", "write_tables"]
