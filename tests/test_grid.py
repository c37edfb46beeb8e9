"""The DP x TP grid arithmetic and data sharding (no MPI needed)."""

import pytest
import torch

from tp.grid import check_grid, coords, dp_group, split_data, tp_group


@pytest.mark.parametrize("world,tp,dp", [(4, 2, 2), (4, 4, 1), (4, 1, 4), (6, 3, 2), (1, 1, 1)])
def test_grid_sizes(world, tp, dp):
    assert check_grid(world, tp) == dp


@pytest.mark.parametrize("world,tp", [(4, 3), (6, 4), (4, 0), (4, -2), (2, 4)])
def test_tp_must_divide_the_world(world, tp):
    with pytest.raises(ValueError, match=f"TP size {tp} must be >= 1 and divide the world size"):
        check_grid(world, tp)


def test_two_by_two_is_model_major():
    assert [coords(r, 2) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [tp_group(r, 2) for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [dp_group(r, 2, 4) for r in range(4)] == [[0, 2], [1, 3], [0, 2], [1, 3]]


def test_one_by_four_is_one_tp_group():
    assert [tp_group(r, 4) for r in range(4)] == [[0, 1, 2, 3]] * 4
    assert [dp_group(r, 4, 4) for r in range(4)] == [[0], [1], [2], [3]]


def test_split_data_gives_equal_contiguous_shards_and_drops_the_remainder():
    data = list(range(10))
    shards = [split_data(data, d, 3) for d in range(3)]
    assert shards == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]  # item 9 (10 % 3 = 1 item) dropped
    batch = torch.arange(16).reshape(8, 2)
    assert torch.equal(split_data(batch, 1, 4), batch[2:4])
    assert split_data([], 0, 2) == []


@pytest.mark.parametrize("rank,size,n", [(2, 2, 8), (-1, 2, 8), (0, 0, 8), (0, 4, 3)])
def test_split_data_errors(rank, size, n):
    with pytest.raises(ValueError):
        split_data(list(range(n)), rank, size)
