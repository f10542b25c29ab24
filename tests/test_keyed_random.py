"""Counter-based draws (scale_fpt.keyed_random): SplitMix64 exactly, in torch ops."""

from __future__ import annotations

import pytest
import torch

from scale_fpt.keyed_random import Draws, mix64, stream_key

MASK64 = 2**64 - 1


def reference_splitmix64(state: int, i: int) -> int:
    """SplitMix64's output for ``state`` at counter i + 1, in Python's exact integers."""
    z = (state + (i + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


@pytest.mark.parametrize("key", [0, 1, 123_456_789, 2**62 + 77, 2**63 - 1])
def test_bits_are_splitmix64_with_uint64_wrapping(key):
    bits = Draws(key).bits(2000).tolist()
    expected = [reference_splitmix64(key, i) for i in range(2000)]
    assert [b & MASK64 for b in bits] == expected
    assert min(bits) < 0 < max(bits)  # the top bit is used: values span the whole uint64


def test_successive_calls_continue_the_stream_and_keys_differ():
    draws = Draws(7)
    first, second = draws.bits(5), draws.bits((2, 3))
    assert second.shape == (2, 3)
    assert torch.equal(torch.cat([first, second.flatten()]), Draws(7).bits(11))
    assert not torch.equal(Draws(stream_key(7, 0, 0)).bits(11), Draws(stream_key(7, 1, 0)).bits(11))
    assert stream_key(7, 1, 0) != stream_key(7, 0, 1)
    assert 0 <= mix64(2**64 - 1, 2**64 - 1) < 2**63


def test_rand_randint_permutation_ranges_and_uniformity():
    n = 200_000
    u = Draws(1).rand(n)
    assert u.dtype == torch.float32 and u.min() >= 0 and u.max() < 1
    assert torch.equal(u * 2**24, (u * 2**24).floor())  # on the 2^-24 grid, exact in float32
    assert abs(u.mean().item() - 0.5) < 5 * (1 / 12 / n) ** 0.5
    ints = Draws(2).randint(-4, 5, n)
    counts = torch.bincount(ints + 4, minlength=9).double()
    assert ints.min() == -4 and ints.max() == 4
    expected = n / 9
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 30  # 8 degrees of freedom: p < 0.0003 of exceeding by chance
    perm = Draws(3).permutation(1000)
    assert sorted(perm.tolist()) == list(range(1000))
    assert torch.equal(perm, Draws(3).permutation(1000))
    assert not torch.equal(perm, Draws(4).permutation(1000))
    with pytest.raises(ValueError, match="high - low"):
        Draws(0).randint(3, 3, 4)
