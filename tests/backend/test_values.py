import pytest
import torch
import torch.distributed as dist

from prism_debug.backend.values import Values

R = dist.ReduceOp


@pytest.mark.parametrize("op,expected", [
    (R.SUM, [8.0, -16.0]), (R.AVG, [1.0, -2.0]), (R.MAX, [1.0, -2.0]), (R.MIN, [1.0, -2.0]),
    (R.PRODUCT, [1.0, 256.0]),
])
def test_mirror_reductions_over_eight_identical_peers(op, expected):
    tensor = torch.tensor([1.0, -2.0])
    Values("mirror", 0).reduce_peers(tensor, op, 8, ())
    assert tensor.tolist() == expected


def test_mirror_premul_sum_scales_the_sum():
    tensor = torch.tensor([2.0])
    Values("mirror", 0).reduce_peers(tensor, R.PREMUL_SUM(0.25), 8, ())
    assert tensor.tolist() == [4.0]


@pytest.mark.parametrize("op,expected", [
    (R.SUM, [1.0, -2.0]), (R.AVG, [0.25, -0.5]), (R.MAX, [1.0, 0.0]), (R.MIN, [0.0, -2.0]),
    (R.PRODUCT, [0.0, 0.0]),
])
def test_zero_peers(op, expected):
    tensor = torch.tensor([1.0, -2.0])
    Values("zeros", 0).reduce_peers(tensor, op, 4, ())
    assert tensor.tolist() == expected


def test_bitwise_xor_of_an_even_number_of_mirrors_is_zero():
    tensor = torch.tensor([5, 3])
    Values("mirror", 0).reduce_peers(tensor, R.BXOR, 4, ())
    assert tensor.tolist() == [0, 0]


def test_seeded_values_depend_on_seed_and_key_only():
    a, b, c, d = (torch.empty(16) for _ in range(4))
    Values("mirror", 1).fill_seeded(a, (3, 7))
    Values("mirror", 1).fill_seeded(b, (3, 7))
    Values("mirror", 2).fill_seeded(c, (3, 7))
    Values("mirror", 1).fill_seeded(d, (3, 8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert not torch.equal(a, d)


def test_seeded_integer_data_is_ones():
    flags = torch.zeros(3, dtype=torch.int32)
    Values("random", 0).fill_seeded(flags, (1,))
    assert flags.tolist() == [1, 1, 1]


def test_random_sum_is_deterministic_and_has_the_spread_of_n_minus_one_peers():
    tensor = torch.zeros(20000)
    Values("random", 5).reduce_peers(tensor, R.SUM, 101, (1, 2))
    assert tensor.std().item() == pytest.approx(10.0, rel=0.03)
    again = torch.zeros(20000)
    Values("random", 5).reduce_peers(again, R.SUM, 101, (1, 2))
    assert torch.equal(tensor, again)


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="unknown value policy 'ones'"):
        Values("ones", 0)
