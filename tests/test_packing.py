"""b-bit packing: round trips, exact sizes, layout."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

import turboquant as tq


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [1, 3, 7, 8, 9, 63, 127, 1536])
def test_round_trip_and_size(bits, n):
    codes = torch.randint(0, 2 ** bits, (4, 3, n), dtype=torch.uint8)
    packed = tq.pack_codes(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (4, 3, (n * bits + 7) // 8) == (4, 3, tq.packed_size(n, bits))
    assert torch.equal(tq.unpack_codes(packed, bits, n), codes)


def test_three_bits_really_take_three_bits():
    assert tq.packed_size(128, 3) == 48


def test_little_endian_stream_layout():
    assert tq.pack_codes(torch.tensor([1, 2, 3]), 4).tolist() == [0x21, 0x03]
    # 3-bit codes 7, 0, …, 0, 1: bits 0-2 set, then code 7 at stream bits 21-23 → byte 2, bit 5.
    assert tq.pack_codes(torch.tensor([7, 0, 0, 0, 0, 0, 0, 1]), 3).tolist() == [7, 0, 32]
    assert tq.pack_codes(torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1]), 1).tolist() == [0b1101, 1]


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 8), shape=st.lists(st.integers(1, 5), min_size=0, max_size=2),
       n=st.integers(1, 70), seed=st.integers(0, 2 ** 31 - 1))
def test_round_trip_property(bits, shape, n, seed):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2 ** bits, (*shape, n), generator=gen).to(torch.int64)
    assert torch.equal(tq.unpack_codes(tq.pack_codes(codes, bits), bits, n).long(), codes)


def test_errors():
    with pytest.raises(ValueError, match=r"bits must be an integer in \[1, 8\]"):
        tq.pack_codes(torch.zeros(8, dtype=torch.uint8), 9)
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 4\)"):
        tq.pack_codes(torch.tensor([0, 4]), 2)
    with pytest.raises(ValueError, match="codes must be an integer tensor"):
        tq.pack_codes(torch.zeros(8), 2)
    with pytest.raises(ValueError, match="must have last dimension 3"):
        tq.unpack_codes(torch.zeros(2, 4, dtype=torch.uint8), 3, 8)
    with pytest.raises(ValueError, match="packed codes must be uint8"):
        tq.unpack_codes(torch.zeros(3, dtype=torch.int32), 3, 8)
