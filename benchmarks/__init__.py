"""Benchmarks of the Triton kernels and of TurboQuant as a GPU index (speed claims live here, not in tests).

Layout (after Liger-Kernel's ``benchmark/scripts``):

=========================  ========================================================================================
``utils``                  timer (``do_bench``, CUDA graphs), byte floor at the measured copy bandwidth, result row,
                           GPU-busy time, random packed inputs, the Markdown table
``suite``                  the op registry that ``python run.py experiment=kernels`` runs
``bench_quantize``         ops ``quantize`` and ``prod`` (Algorithms 1 and 2)
``bench_library``          op ``library``: kernels vs the library's torch path
``bench_scores``           op ``scores``: logits from packed keys vs ``torch.matmul``
``bench_decode``           op ``decode``: split-KV decode attention vs bf16 ``sdpa``
``bench_decode_step``      op ``decode_step``: one generated token of a Llama-architecture model per cache
``bench_ann``              TurboQuant as a nearest-neighbour index on one GPU (``python -m benchmarks.bench_ann``)
``decode_split``           the split decode kernel's formats: one launch each for ncu, and its tile sweep
``ncu_quantize_decode``    one launch each of the quantize and one-group decode kernels, for ncu
``profile_decode_step``    where a decode step's time goes (torch.profiler), quantize kernel resources
=========================  ========================================================================================

Run every module from the repository root (``python -m benchmarks.<module>``); measurements, predictions and
outcomes are in ``benchmarks/NOTES.md``, the runs' outputs in ``results/kernels/``.
"""
