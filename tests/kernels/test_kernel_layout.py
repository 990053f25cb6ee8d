"""Group geometry of the packed layout the kernels read (turboquant.kernels._layout)."""
import pytest

from turboquant.kernels._layout import group_geometry, num_groups


@pytest.mark.parametrize("bits, expected", [(1, (1, 8)), (2, (1, 4)), (3, (3, 8)), (4, (1, 2))])
def test_group_geometry(bits, expected):
    assert group_geometry(bits) == expected


@pytest.mark.parametrize("bits", [0, 5, 8])
def test_unsupported_bits_raise(bits):
    with pytest.raises(ValueError, match="bits"):
        group_geometry(bits)


@pytest.mark.parametrize("dim", [2, 37, 100, 128, 1536])
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_groups_cover_the_row(dim, bits):
    _, codes_per_group = group_geometry(bits)
    assert num_groups(dim, bits) * codes_per_group >= dim > (num_groups(dim, bits) - 1) * codes_per_group
