"""The bound-matched ABF base (rope_scaling.bounds.matched_base): the base whose angle bound equals a target, on
SmolLM2-135M's config numbers (head_dim 64, base 1e5, 8,192 positions), checked against ``reach`` itself and against
the first bounded pair worked out by hand."""
import math

import pytest

from rope_scaling.bounds import matched_base, reach

D, BASE, L = 64, 1e5, 8192  # SmolLM2-135M's config.json


def inv(base: float, d: int = D) -> list[float]:
    """RoFormer's theta_i = base^(-2i/d), written out here."""
    return [base ** (-2 * i / d) for i in range(d // 2)]


def test_smollm2_x2_bound_matched_base_by_hand_and_by_reach():
    # pair 19: 8192 * 1e5^(-38/64) = 8.81 rad > 2 pi (it turned a full circle); pair 20: 8192 * 1e5^(-40/64) = 6.14
    # rad < 2 pi: the first bounded pair is 20, so reach(b') = 8192 (b'/1e5)^(40/64) = 16384 gives b' = 1e5 * 2^(64/40)
    assert L * BASE ** (-38 / 64) > 2 * math.pi > L * BASE ** (-40 / 64)
    hand = 1e5 * 2 ** 1.6
    b = matched_base(L, D, BASE, 2 * L)
    assert b == pytest.approx(hand, rel=1e-12)
    assert 3.03e5 < b < 3.04e5  # the "base ~3.03e5"
    assert reach(L, inv(BASE), inv(b)) == pytest.approx(2 * L, rel=1e-6)


@pytest.mark.parametrize("target", [8192, 12812.0, 16384, 34545.0, 65536])
def test_matched_base_inverts_reach(target):
    b = matched_base(L, D, BASE, target)
    assert reach(L, inv(BASE), inv(b)) == pytest.approx(target, rel=1e-6)


def test_base_1e6_is_matched_to_its_own_bound():
    # ABF at 1e6 (the real-model page's row): its bound, then the base matched to that bound is 1e6 again
    bound = reach(L, inv(BASE), inv(1e6))
    assert 34545 < bound < 34546
    assert matched_base(L, D, BASE, bound) == pytest.approx(1e6, rel=1e-9)


def test_small_model_by_hand():
    # d 8, base 100, L 10: thetas 1, 0.316, 0.1, 0.0316; L*theta = 10, 3.16, ...: pair 1 is the first bounded;
    # reach = 10 (b'/100)^(2/8), so a target of 20 needs b' = 100 * 2^4 = 1600
    assert matched_base(10, 8, 100, 20) == pytest.approx(1600)
    assert reach(10, inv(100, 8), inv(1600, 8)) == pytest.approx(20)


def test_refusals():
    with pytest.raises(ValueError, match="below the original context"):
        matched_base(L, D, BASE, L - 1)
    with pytest.raises(ValueError, match="no rotary pair is bounded"):
        matched_base(10, 8, 1.5, 20)  # every pair turns a full circle in 10 tokens
