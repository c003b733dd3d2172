"""group_advantages and dynamic_sampling_filter on tiny hand-computed inputs."""

import math

import pytest
import torch

from ulorl.algo import dynamic_sampling_filter, group_advantages


def test_group_advantages_two_groups_population_std():
    # group 0: rewards 1,0,0,1 -> mean 0.5, deviations +-0.5, population var = 4*0.25/4 = 0.25,
    #          std 0.5 -> adv = +-0.5 / (0.5 + 1e-6)
    # group 1: all 1 -> exactly 0
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    a = 0.5 / (0.5 + 1e-6)
    expected = torch.tensor([a, -a, -a, a, 0.0, 0.0, 0.0, 0.0])
    out = group_advantages(r, g)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-7)
    assert torch.equal(out[4:], torch.zeros(4))  # exactly zero, not a residue


def test_group_advantages_one_of_four_and_unbiased_option():
    # rewards 1,0,0,0: mean 0.25, deviations 0.75, -0.25 x3;
    # population var = (0.5625 + 3*0.0625)/4 = 0.1875, std = sqrt(3)/4 = 0.4330127
    # -> adv = 0.75/std = sqrt(3), -0.25/std = -1/sqrt(3)   (eps=0 to compare exactly)
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    g = torch.zeros(4, dtype=torch.long)
    s3 = math.sqrt(3.0)
    torch.testing.assert_close(
        group_advantages(r, g, eps=0.0), torch.tensor([s3, -1 / s3, -1 / s3, -1 / s3], dtype=torch.float64)
    )
    # unbiased: var = 0.75/3 = 0.25, std 0.5 -> 1.5, -0.5
    torch.testing.assert_close(
        group_advantages(r, g, eps=0.0, unbiased=True), torch.tensor([1.5, -0.5, -0.5, -0.5], dtype=torch.float64)
    )


def test_group_advantages_interleaved_noncontiguous_ids_and_singletons():
    # group 7 = {1, 0} -> mean .5, std .5 -> +-1 (eps 0); group 3 = {0, 0} -> 0; group -2 = {1} -> 0
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0])
    g = torch.tensor([7, 3, 7, 3, -2])
    out = group_advantages(r, g, eps=0.0)
    assert torch.equal(out, torch.tensor([1.0, 0.0, -1.0, 0.0, 0.0]))
    assert torch.equal(group_advantages(r, g, eps=0.0, unbiased=True)[4:], torch.zeros(1))


def test_group_advantages_constant_nonbinary_group_is_exact_zero():
    # 0.1*3 sums to 0.30000000000000004; without the min==max guard the residue / eps is ~1e-10..1e-2
    r = torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64)
    assert torch.equal(group_advantages(r, torch.tensor([5, 5, 5])), torch.zeros(3, dtype=torch.float64))


def test_group_advantages_dtypes_empty_and_errors():
    out = group_advantages(torch.tensor([True, False]), torch.tensor([0, 0]))
    assert out.dtype == torch.float32
    assert group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)
    with pytest.raises(ValueError, match="same shape"):
        group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        group_advantages(torch.zeros(2), torch.zeros(2))


def test_dynamic_sampling_filter():
    # groups: 0 -> {1,0,0,0} mixed keep; 1 -> all 1 drop; 9 -> all 0 drop; 4 -> {0,1} keep; 2 -> singleton drop
    r = torch.tensor([1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1], dtype=torch.float32)
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 9, 9, 4, 4, 2])
    keep = dynamic_sampling_filter(r, g)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [True] * 4 + [False] * 4 + [False, False] + [True, True] + [False]
    # kept groups have nonzero advantages, dropped ones exactly zero
    adv = group_advantages(r, g)
    assert torch.all(adv[~keep] == 0) and torch.all(adv[keep] != 0)


def test_dynamic_sampling_filter_empty_and_errors():
    assert dynamic_sampling_filter(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)
    with pytest.raises(ValueError):
        dynamic_sampling_filter(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long))
