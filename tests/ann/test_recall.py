"""recall@1@k (paper Fig. 5 metric) on hand-made hit patterns."""

import numpy as np
import pytest

from turboquant.ann import powers_of_two_up_to, recall_at_1_at_k


def test_recall_counts_the_rank_of_the_true_neighbour():
    truth = np.array([7, 3, 5, 9])
    found = np.array([[7, 1, 2, 0], [0, 3, 1, 2], [0, 1, 2, 5], [0, 1, 2, 4]])
    assert recall_at_1_at_k(truth, found, [1, 2, 4]) == {1: 0.25, 2: 0.5, 4: 0.75}


def test_powers_of_two_axis():
    assert powers_of_two_up_to(64) == [1, 2, 4, 8, 16, 32, 64]
    with pytest.raises(ValueError, match="power of two"):
        powers_of_two_up_to(48)


@pytest.mark.parametrize(
    ("truth", "found", "ks", "message"),
    [
        (np.zeros((2, 1)), np.zeros((2, 4)), [1], "1-D"),
        (np.zeros(3), np.zeros((2, 4)), [1], "n_queries=3"),
        (np.zeros(2), np.zeros((2, 4)), [8], "1..4"),
        (np.zeros(2), np.zeros((2, 4)), [0], "1..4"),
    ],
)
def test_recall_rejects_bad_shapes(truth, found, ks, message):
    with pytest.raises(ValueError, match=message):
        recall_at_1_at_k(truth, found, ks)
