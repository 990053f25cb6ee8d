"""experiment=kernels: refuses to run without CUDA unless asked for the interpreter smoke run; the smoke run
writes its rows, the command and the device, and resumes without recomputing."""
import os

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from experiments import kernels
from experiments.io import ResultStore
from run import REPO_ROOT


def _config(tmp_path, overrides=()):
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        cfg = compose("config", overrides=["experiment=kernels", *overrides])
    with open_dict(cfg):
        cfg.paths.results_dir = str(tmp_path / "results")
        cfg.paths.figures_dir = str(tmp_path / "figures")
    return cfg


def test_config_names_no_group_it_does_not_read(tmp_path):
    cfg = _config(tmp_path)
    assert "dataset" not in cfg and "quantizer" not in cfg and "model" not in cfg


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given on a machine without CUDA")
def test_without_cuda_the_error_says_what_to_do(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    store = ResultStore(cfg.paths.results_dir, "kernels", cfg)
    with pytest.raises(ValueError, match="needs a CUDA device.*experiment.smoke=true"):
        kernels.run(cfg, store)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cfg = _config(tmp_path, ["experiment.smoke=true"])
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        kernels.run(cfg, ResultStore(cfg.paths.results_dir, "kernels", cfg))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the smoke sizes are for the CPU interpreter")
def test_smoke_run_records_command_and_device_and_resumes(tmp_path):
    cfg = _config(tmp_path, ["experiment.smoke=true", "experiment.ops=[scores]"])
    with open_dict(cfg):
        cfg.experiment.variants.scores = {"default": {}}
    store = ResultStore(cfg.paths.results_dir, "kernels", cfg)
    frame = kernels.run(cfg, store)
    assert set(frame["op"]) == {"scores"} and set(frame["baseline"]) == {"fp32 matmul", "bf16 matmul"}
    assert (frame["time_us"] > 0).all() and frame["check"].str.startswith("rel err").all()
    report = (store.directory / "kernels.md").read_text()
    assert "command: " in report and "CPU interpreter" in report and "| scores | b=4 default |" in report
    mtime = store.csv_path.stat().st_mtime_ns
    again = kernels.run(cfg, store)  # the unit is done: nothing re-measured
    assert store.csv_path.stat().st_mtime_ns == mtime and len(again) == len(frame)
    figures = kernels.plot(again, cfg, cfg.paths.figures_dir)
    assert {p.suffix for p in figures} == {".png", ".pdf"}


def test_variant_set_replaces_ops_sizes_and_variants(tmp_path):
    """+kernels_set=session5 runs that set's blocks whole (not merged with the session-4 sweep), and every
    variant names only keyword arguments the kernels take."""
    cfg = _config(tmp_path, ["+kernels_set=session5"])
    kernels.apply_variant_set(cfg)
    assert list(cfg.experiment.ops) == ["decode", "scores", "quantize", "prod"]
    assert list(cfg.experiment.variants.quantize) == ["cell table (session 4 default)", "midpoint tree",
                                                      "midpoint tree bn32 st2"]
    assert "no-lookup (diagnostic: no nearest-centroid step)" not in cfg.experiment.variants.quantize
    assert [3.5, 3.5] in [list(case[2:]) for case in cfg.experiment.sizes.quick.decode.extra]
    from turboquant.kernels._decode import DECODERS

    for op, variants in cfg.experiment.variants.items():
        for variant in variants.values():
            assert set(variant) <= {"graph", "decoder", "inner", "block_n", "split_factor", "nearest", "lookup",
                                    "num_stages"}, (op, dict(variant))
            assert variant.get("decoder", "table") in DECODERS and variant.get("inner", "dot") in ("dot", "fma")
    plain = _config(tmp_path)
    kernels.apply_variant_set(plain)  # no set chosen: the experiment's own blocks
    assert "no-lookup (diagnostic: no nearest-centroid step)" in plain.experiment.variants.quantize
