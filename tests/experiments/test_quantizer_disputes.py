"""experiments/quantizer_disputes.py: EDEN's scales, the per-draw measurements, and the check rows."""

from __future__ import annotations

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
    assert list(rows["method"]) == ["mse", "eden_unbiased", "eden_mse", "prod"]
    by = rows.set_index("method")
    assert by.loc["mse", "bits_per_coordinate"] == by.loc["eden_unbiased", "bits_per_coordinate"]
    assert by.loc["eden_mse", "d_mse"] <= by.loc["mse", "d_mse"] + 1e-12
    assert abs(by.loc["eden_unbiased", "mean_ip_error"]) < abs(by.loc["mse", "mean_ip_error"]) + 1e-3
    assert rows["recall_at_1"].between(0, 1).all() and (rows["recall_at_10"] >= rows["recall_at_1"]).all()


def test_check_rows_are_paired_by_seed_and_known_to_the_paper_numbers() -> None:
    rows = [{**row, "rotation": rotation, "bits": bits, "quantizer_seed": seed}
            for rotation in ("haar", "hadamard") for bits in (2, 3) for seed in (0, 1)
            for row in qd.measure(rotation, bits, seed, DATA, list(qd.METHODS), [1])]
    items = {item["id"]: item for item in qd.paper_comparison(pd.DataFrame(rows))}
    assert set(items) <= {n.id for n in load_paper_numbers()}
    assert "disputes.eden_2bit_vs_prod_3bit" in items and "disputes.hadamard_vs_haar.d_mse.b3" in items
    assert all(item["se"] >= 0 and "2 quantizer seeds" in item["detail"] for item in items.values())
