"""LongBench-E with compressed KV caches (paper Table 1): ``python run.py experiment=longbench``.

Modules: ``metrics`` (LongBench's scoring), ``prompts`` (templates, generation lengths, truncation),
``table`` (category columns and the weighted Average), ``sample`` / ``data_real`` / ``data`` (the real
jsonl files, hub or local), ``sources`` / ``builders`` (the embedded LongBench-style substitute built from
real shipped data), ``experiment`` (run / plot / paper_comparison).
"""

from experiments.longbench.experiment import RESULT_KEYS, paper_comparison, plot, run, stored_frame, write_tables

__all__ = ["RESULT_KEYS", "run", "stored_frame", "plot", "paper_comparison", "write_tables"]
