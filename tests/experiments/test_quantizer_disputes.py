"""experiments/quantizer_disputes.py: EDEN's scales, the per-draw measurements, and the check rows."""

from __future__ import annotations

import math
import pandas as pd
import pytest
import torch

from experiments import quantizer_disputes as qd
from experiments.compare import load_paper_numbers
from experiments.quantized_embeddings import UnitEmbeddings


def unit_rows(n: int, dim: int, seed: int) -> torch.Tensor:
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))
    return x / x.norm(dim=1, keepdim=True)


DATA = UnitEmbeddings(base=unit_rows(400, 32, 0), queries=unit_rows(40, 32, 1), name="toy", description="toy",
                      substitution=None, source={})


def test_eden_scales_make_the_reconstruction_unbiased_or_least_squares() -> None:
    x = unit_rows(50, 16, 2)
    x_hat = 0.8 * x + 0.05 * unit_rows(50, 16, 3)
    unbiased = qd.eden_scales(x, x_hat, "eden_unbiased")[:, None] * x_hat
    assert torch.allclose((unbiased * x.double()).sum(dim=1), torch.ones(50, dtype=torch.float64))  # <x, x~> = |x|^2
    least = qd.eden_scales(x, x_hat, "eden_mse")[:, None] * x_hat
    for scale in (0.9, 1.1):  # the least-squares scale minimises |x - f x^|^2 per vector
        assert ((x - least) ** 2).sum(dim=1).le(((x - scale * least) ** 2).sum(dim=1) + 1e-12).all()
    with pytest.raises(ValueError, match="unknown EDEN scale"):
        qd.eden_scales(x, x_hat, "eden_typo")


def test_measure_gives_one_row_per_method_and_eden_costs_no_bits() -> None:
    rows = pd.DataFrame(qd.measure("haar", 2, 0, DATA, list(qd.METHODS), [1, 10]))
    assert list(rows["method"]) == list(qd.METHODS)
    by = rows.set_index("method")
    assert by.loc["mse", "bits_per_coordinate"] == by.loc["eden_unbiased", "bits_per_coordinate"]
    assert by.loc["eden_mse", "d_mse"] <= by.loc["mse", "d_mse"] + 1e-12
    assert abs(by.loc["eden_unbiased", "mean_ip_error"]) < abs(by.loc["mse", "mean_ip_error"]) + 1e-3
    assert rows["recall_at_1"].between(0, 1).all() and (rows["recall_at_10"] >= rows["recall_at_1"]).all()


def test_matched_turboquant_stores_at_most_rabitqs_bits_and_one_more_coordinate_would_not_fit() -> None:
    data = UnitEmbeddings(base=unit_rows(300, 256, 4), queries=unit_rows(30, 256, 5), name="toy", description="toy",
                          substitution=None, source={})
    rows = pd.DataFrame(qd.measure("hadamard", 2, 1, data, ["rabitq", "mse_matched", "prod_matched"], [1])).set_index("method")
    budget = rows.loc["rabitq", "bits_per_coordinate"] * data.dim
    assert budget > 2 * data.dim  # RaBitQ's per-vector factors cost bits beyond its nominal b
    for method, kind in qd.MATCHED.items():
        high = int(rows.loc[method, "high_bit_coordinates"])
        assert 0 < high < data.dim
        assert rows.loc[method, "bits_per_coordinate"] * data.dim <= budget  # measured from the codes' nbytes
        one_more = qd.stored_bits(kind, high + 1, 3) + qd.stored_bits(kind, data.dim - high - 1, 2)
        assert one_more > budget
    assert rows.loc["mse_matched", "d_mse"] < 0.117  # more than 2 bits on part of the coordinates: below D_mse(2)


def test_stored_bits_and_split_refuse_what_cannot_be_stored() -> None:
    assert qd.stored_bits("mse", 89, 3) == 8 * 38 and qd.stored_bits("prod", 89, 3) == 8 * 43
    assert qd.split_for_budget("mse", 64, 2, qd.stored_bits("mse", 64, 3)) == 64
    assert qd.split_for_budget("mse", 64, 2, qd.stored_bits("mse", 64, 2)) == 0
    with pytest.raises(ValueError, match="cannot hold"):
        qd.split_for_budget("mse", 64, 2, 100)
    with pytest.raises(ValueError, match="unknown quantizer"):
        qd.stored_bits("qjl", 64, 2)


def test_check_rows_are_paired_by_seed_and_known_to_the_paper_numbers() -> None:
    rows = [{**row, "rotation": rotation, "bits": bits, "quantizer_seed": seed}
            for rotation in ("haar", "hadamard") for bits in (2, 3) for seed in (0, 1)
            for row in qd.measure(rotation, bits, seed, DATA, list(qd.METHODS), [1])]
    items = {item["id"]: item for item in qd.paper_comparison(pd.DataFrame(rows))}
    assert set(items) <= {n.id for n in load_paper_numbers()}
    assert "disputes.eden_2bit_vs_prod_3bit" in items and "disputes.hadamard_vs_haar.d_mse.b3" in items
    assert {"disputes.rabitq_vs_mse_equal_bits.recall_at_1.b2", "disputes.mse_vs_prod_equal_bits.recall_at_1.b3"} <= set(items)
    assert all(item["se"] >= 0 and "2 quantizer seeds" in item["detail"] for item in items.values())


def needle_rows(scores: dict[str, list[list[float]]]) -> pd.DataFrame:
    """Needle-format rows: per method, per seed, one score per (context, depth) cell of a 2 x 2 grid."""
    cells = [(1024, 0.0), (1024, 0.5), (2048, 0.0), (2048, 0.5)]
    return pd.DataFrame([{"method": method, "method_seed": seed, "context": c, "depth": d, "score": score,
                          "unit_id": f"{method}-{seed}-{c}-{d}", "model_label": "toy"}
                         for method, per_seed in scores.items() for seed, values in enumerate(per_seed)
                         for (c, d), score in zip(cells, values)])


def test_the_needle_rotation_row_is_the_mean_per_cell_difference_of_the_seed_means() -> None:
    hadamard, haar = qd.NEEDLE_ROTATION_PAIR
    df = needle_rows({hadamard: [[1, 0, 1, 1], [1, 1, 1, 0]], haar: [[1, 1, 1, 1]], "full": [[1, 1, 1, 1]]})
    (item,) = qd.needle_rotation_comparison(df)
    # per-cell differences: 0, -0.5, 0, -0.5 -> mean -0.25, SE = std / 2
    assert item["id"] == "disputes.hadamard_vs_haar.needle" and item["value"] == pytest.approx(-0.25)
    assert item["se"] == pytest.approx(pd.Series([0, -0.5, 0, -0.5]).std() / 2)
    assert "(2 seeds)" in item["detail"] and "4 per-cell differences" in item["detail"]
    df.attrs["provenance"] = {"unit_ids": list(df.loc[df["context"] == 1024, "unit_id"])}  # the latest run's cells
    assert "2 per-cell differences" in qd.needle_rotation_comparison(df)[0]["detail"]
    assert qd.needle_rotation_comparison(df[df["method"] != hadamard]) == []


def test_the_comparison_reads_the_needle_rotation_row_from_needle_runs() -> None:
    from experiments.compare import _producers

    numbers = load_paper_numbers()
    assert "disputes.hadamard_vs_haar.needle" in {n.id for n in numbers}
    names = [name for name, _ in _producers("needle", numbers.comparisons["needle"])]
    assert names == ["experiments.needle.paper_comparison", "experiments.quantizer_disputes:needle_rotation_comparison"]
    with pytest.raises(ValueError, match="is not a module:function"):
        _producers("needle", ["experiments.quantizer_disputes:no_such_function"])


def disputes_config(tmp_path, *overrides: str):
    from hydra import compose, initialize_config_dir

    from experiments.coverage import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=["experiment=quantizer_disputes", "scale=smoke",
                                                        "experiment.bits=[2]", "experiment.seeds=[0,1]",
                                                        f"paths.results_dir={tmp_path}", *overrides])


def test_run_measures_rabitq_and_the_matched_methods_under_the_rabitq_rotations_only(tmp_path, monkeypatch) -> None:
    from experiments.io import ResultStore

    monkeypatch.setattr(qd, "load_unit_embeddings", lambda cfg: DATA)
    cfg = disputes_config(tmp_path)
    df = qd.run(cfg, ResultStore(tmp_path, "quantizer_disputes", cfg, qd.RESULT_KEYS))
    methods = df.groupby("rotation")["method"].agg(set)
    assert methods["haar"] == set(qd.METHODS) and methods["hadamard"] == {"mse", "eden_unbiased", "eden_mse", "prod"}
    assert df.groupby(["method", "rotation"]).size().eq(2).all()  # one row per method and seed
    bad = disputes_config(tmp_path, "experiment.rabitq_rotations=[haar,qr]")
    with pytest.raises(ValueError, match="rabitq_rotations"):
        qd.run(bad, ResultStore(tmp_path, "quantizer_disputes", bad, qd.RESULT_KEYS))


def test_the_needle_rotation_se_covers_the_spread_over_seeds() -> None:
    """With two seeds each, a rotation that helps every cell in one seed and hurts every cell in the other is a
    spread over seeds that the per-cell SE (zero here: every cell differs by the same amount) does not see."""
    hadamard, haar = qd.NEEDLE_ROTATION_PAIR
    df = needle_rows({hadamard: [[1, 1, 1, 1], [0, 0, 0, 0]], haar: [[0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]]})
    (item,) = qd.needle_rotation_comparison(df)
    assert item["value"] == pytest.approx(0.0)
    assert item["se"] == pytest.approx(math.sqrt(pd.Series([1.0, 0.0]).var() / 2))
