"""The benchmarks package's shared pieces (no timing is asserted: speed claims live in benchmarks/NOTES.md)."""
import pytest
import torch

import turboquant as tq
from benchmarks.suite import OPS, select_ops
from benchmarks.utils import Row, random_packed


def test_unknown_ops_are_named_before_anything_runs():
    assert list(select_ops(["scores", "quantize"])) == ["scores", "quantize"]
    with pytest.raises(ValueError, match=r"unknown kernel ops \['nope'\].*decode_step"):
        select_ops(["scores", "nope"])
    assert set(OPS) == {"quantize", "library", "prod", "scores", "decode", "decode_step"}


@pytest.mark.parametrize("dim, bits", [(10, 3), (7, 1), (6, 4), (5, 2)])
def test_random_packed_rows_are_valid_packed_codes(dim, bits):
    """Spare bits of the last byte are zero, so the bytes are exactly what pack_codes writes for their codes."""
    packed = random_packed((50, 3), dim, bits, torch.device("cpu"))
    assert packed.shape == (50, 3, -(-dim * bits // 8))
    assert torch.equal(tq.pack_codes(tq.unpack_codes(packed, bits, dim), bits), packed)


def test_row_ratios():
    row = Row("op", "v", "s", time_us=200.0, bytes_moved=4_000_000, floor_us=100.0, baseline="b", baseline_us=600.0)
    out = row.as_dict()
    assert (out["gbps"], out["fraction_of_floor"], out["speedup_vs_baseline"]) == (20.0, 0.5, 3.0)
