"""Grid coverage: a run that leaves out part of its config's grid is labelled partial, in its figure names
and titles, and a reduced needle run leaves every committed figure byte-identical."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import run
from experiments import needle
from experiments.compare import PARTIAL, compare, load_paper_numbers, load_runs
from experiments.coverage import CONFIG_DIR, frame_coverage, grid_coverage
from experiments.io import ResultStore, config_to_dict
from experiments.data.haystack import Haystack
from experiments.plotting import save_figure
from tests.experiments.llm_fixtures import haystack_text, save_tiny_llama

REPO = Path(run.__file__).resolve().parent


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def test_the_configs_own_grid_is_full_and_a_larger_one_too() -> None:
    assert grid_coverage(composed("experiment=needle")).full
    assert grid_coverage(composed("experiment=distortion", "scale=paper")).full
    larger = composed("experiment=needle", "experiment.sizes.quick.contexts=[1024,1536,2048,3072]",
                      "experiment.method_seeds=[0,1,2,3]", "experiment.sizes.paper.contexts=[4000]")
    assert grid_coverage(larger).full, "more contexts / seeds cover the grid; another scale's sizes are not this run's"


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        (["experiment=needle", "experiment.sizes.quick.contexts=[1024]"], "experiment.sizes.quick.contexts"),
        (["experiment=needle", "experiment.sizes.quick.depths=[0.0,1.0]"], "experiment.sizes.quick.depths"),
        (["experiment=needle", "experiment.method_seeds=[0]"], "experiment.method_seeds"),
        (["experiment=needle", "~experiment.methods.snapkv"], "experiment.methods.snapkv"),
        (["experiment=distortion", "experiment.sizes.quick.n_base=500"], "experiment.sizes.quick.n_base"),
        (["experiment=ip_histogram", "experiment.bias.seeds=2"], "experiment.bias.seeds"),
        (["experiment=longbench", "experiment.sizes.quick.samples_per_dataset=1"],
         "experiment.sizes.quick.samples_per_dataset"),
    ],
)
def test_each_kind_of_reduction_is_named(overrides: list[str], path: str) -> None:
    coverage = grid_coverage(composed(*overrides))
    assert not coverage.full and [r.path for r in coverage.reduced] == [path]
    assert coverage.stem("fig") == "fig_partial" and coverage.title("t").startswith("PARTIAL RUN")


def test_a_run_cut_short_is_partial_although_its_config_is_the_grid(tmp_path: Path) -> None:
    cfg = composed("experiment=needle")
    store = ResultStore(tmp_path, "needle", config_to_dict(cfg))
    units = [{"cell": 0}, {"cell": 1}]
    store.save_unit(units[0], [{"score": 1.0}])
    cut_short = frame_coverage(cfg, store.frame(units))
    assert grid_coverage(cfg).full and not cut_short.full
    assert cut_short.stem("t") == "t_partial" and "1 of 2 units stored" in cut_short.summary()
    store.save_unit(units[1], [{"score": 0.0}])
    assert frame_coverage(cfg, store.frame(units)).full


def test_an_experiment_without_a_config_has_no_grid_to_cover() -> None:
    coverage = grid_coverage({"experiment": {"name": "no_such_experiment"}, "scale": {"name": "quick"}})
    assert not coverage.full and "no configs/experiment/no_such_experiment.yaml" in coverage.summary()
    with pytest.raises(ValueError, match="experiment.name and scale.name"):
        grid_coverage({"experiment": {}})


def test_save_figure_renames_and_retitles_a_partial_run(tmp_path: Path) -> None:
    for overrides, stem in ((["experiment=distortion"], "fig"), (["experiment=distortion", "experiment.bits=[1]"], "fig_partial")):
        fig, _ = plt.subplots()
        fig.suptitle("distortion")
        paths = save_figure(fig, tmp_path, "fig", grid_coverage(composed(*overrides)))
        assert [p.name for p in paths] == [f"{stem}.png", f"{stem}.pdf"]
        assert (fig.get_suptitle().startswith("PARTIAL RUN") and "experiment.bits" in fig.get_suptitle()) == (stem != "fig")


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_reduced_needle_run_leaves_the_committed_figures_byte_identical(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a fresh clone: a one-context, one-depth, one-method needle run writes its figure beside the
    committed ones under a "partial" name, and its verdicts are "partial, not judged"."""
    monkeypatch.setattr(needle.experiment, "load_haystack",
                        lambda name: Haystack(haystack_text(400), {"package": "synthetic", "version": "0", "name": name}))
    figures = tmp_path / "figures"
    shutil.copytree(REPO / "figures", figures)
    committed = _digests(figures)
    assert any(name.startswith("fig4_needle_") for name in committed), "the committed needle figure is in the copy"
    methods = [f"~experiment.methods.{m}" for m in composed("experiment=needle").experiment.methods if m != "full"]
    cfg = composed("experiment=needle", "experiment.sizes.quick.contexts=[400]", "experiment.sizes.quick.depths=[0.5]",
                   "experiment.generation.max_new_tokens=4", *methods,
                   f"paths.results_dir={tmp_path / 'results'}", f"paths.figures_dir={figures}")
    OmegaConf.set_struct(cfg, False)
    cfg.model = {"name": "smollm2_135m", "display_name": "tiny random Llama", "dtype": "float32",
                 "pretrained": str(save_tiny_llama(tmp_path / "tiny"))}  # the committed figure's model name
    outputs = run.run_experiment(cfg)
    assert [p.name for p in outputs.figures] == ["fig4_needle_smollm2_135m_partial.png", "fig4_needle_smollm2_135m_partial.pdf"]
    after = _digests(figures)
    assert {name: after[name] for name in committed} == committed, "a committed figure changed"
    verdicts = {c.paper.id: c.verdict for c in compare(load_paper_numbers(), load_runs(tmp_path / "results"))}
    assert verdicts["needle.score.full"] == PARTIAL


def test_a_record_of_several_subset_invocations_covers_their_union() -> None:
    """Parallel processes that each ran some methods or contexts into one store: the record keeps each one's
    config, and the run covers the grid when together they do (compare judges the union)."""
    from experiments.coverage import record_config

    full = config_to_dict(composed("experiment=needle"))
    methods = list(full["experiment"]["methods"])
    contexts = full["experiment"]["sizes"]["quick"]["contexts"]
    subsets = [config_to_dict(composed("experiment=needle", *[f"~experiment.methods.{m}" for m in methods[1:]],
                                       f"experiment.sizes.quick.contexts=[{contexts[0]}]")),
               config_to_dict(composed("experiment=needle", f"~experiment.methods.{methods[0]}"))]
    record = {"config": subsets[1], "configs": {str(i): {"config": c} for i, c in enumerate(subsets)}}
    assert not grid_coverage(subsets[1]).full and not grid_coverage(subsets[0]).full
    assert grid_coverage(record_config(record)).full
    assert record_config({"config": subsets[0]}) == subsets[0]  # a record written before configs were kept
