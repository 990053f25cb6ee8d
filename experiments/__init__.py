"""The paper's experiments, one module each (``experiments/<name>.py``), run through ``run.py``.

Every module defines ``run(cfg, store) -> pandas.DataFrame`` and ``plot(df, cfg, figures_dir) ->
list[Path]``, may define ``RESULT_KEYS`` (config paths its numbers depend on) and
``paper_comparison(df) -> list[dict]`` (rows for ``scripts/compare_to_paper.py``), and has
a config ``configs/experiment/<name>.yaml``. See configs/README.md.
"""
