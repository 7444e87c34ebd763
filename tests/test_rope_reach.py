"""The angle bound (rope_scaling.formulas.reach, shown by ``describe``; a bound, not a prediction: issue 31.4),

A rotary pair i turns theta_i radians per token. Over the original context L it saw the angles [0, L*theta_i];
a pair with L*theta_i >= 2*pi saw every angle. After scaling (theta'_i) a context of N tokens keeps pair i inside
what it saw while N*theta'_i <= L*theta_i, so the reach is L * min(theta_i / theta'_i) over the pairs with
wavelength 2*pi/theta_i > L.
"""
import json
import math

import pytest

from rope_scaling.bounds import reach
from rope_scaling.describe import main as describe_main


def _describe(capsys, *argv):
    assert describe_main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_reach_pure_function_by_hand():
    # L = 10: pair 0 (theta 1, wavelength 6.28 < 10) saw every angle and bounds nothing; pair 1 (theta 0.1,
    # wavelength 62.8) saw [0, 1] rad; halving it lets 20 tokens through, dividing it by 4 lets 40
    assert reach(10, [1.0, 0.1], [1.0, 0.05]) == pytest.approx(20.0)
    assert reach(10, [1.0, 0.1], [0.25, 0.025]) == pytest.approx(40.0)
    assert reach(10, [1.0, 0.1], [1.0, 0.1]) == pytest.approx(10.0)  # unchanged: the original context
    assert reach(10, [1.0, 0.1], [1.0, 0.2]) == pytest.approx(5.0)  # a faster pair: less than the original
    assert math.isinf(reach(10, [1.0, 0.7], [0.5, 0.1]))  # every pair turned a full circle (0.7*10 > 2*pi)


def test_reach_small_model_by_hand(capsys):
    # head_dim 8, base 100, L 10: theta = 1, 100^-1/4 = 0.3162, 0.1, 0.03162; wavelengths 6.3, 19.9, 62.8, 198.7:
    # pairs 1-3 are bounded.
    base = ["--head-dim", "8", "--rope-theta", "100", "--orig-ctx", "10"]
    none = _describe(capsys, *base)
    assert none["reach"] == pytest.approx(10.0) and none["bounded_pairs"] == [1, 2, 3]
    # PI s=2 halves every theta: 2 x 10
    assert _describe(capsys, *base, "--rope", "pi", "--scale", "2")["reach"] == pytest.approx(20.0)
    # NTK s=4: base' = 100 * 4^(8/6), so theta_i/theta'_i = 4^(2i/6); pair 1 (the smallest ratio) gives 10 * 4^(1/3)
    ntk = _describe(capsys, *base, "--rope", "ntk", "--scale", "4")
    assert ntk["reach"] == pytest.approx(10 * 4 ** (1 / 3)) and ntk["reach_pair"] == 1
    assert [r["reach"] for r in ntk["dims"]][1:] == pytest.approx([10 * 4 ** (k / 3) for k in (1, 2, 3)])
    assert ntk["dims"][0]["reach"] is None


def test_reach_of_the_tiny_default(capsys):
    # head_dim 64, base 1e4, L 512: pair i has wavelength 2*pi*1e4^(i/32) > 512 from i = 16 (628) on (i = 15: 471)
    d = ["--config", "assets/tiny"]
    none = _describe(capsys, *d)
    assert none["bounded_pairs"] == list(range(16, 32)) and none["reach"] == pytest.approx(512)
    # NTK x8: ratio 8^(2i/62); pair 16: 512 * 8^(16/31) = 512 * 2^(48/31) ~ 1,498 tokens, far short of 4,096
    ntk = _describe(capsys, *d, "--rope", "ntk", "--scale", "8")
    assert ntk["reach"] == pytest.approx(512 * 2 ** (48 / 31)) and ntk["reach_pair"] == 16
    assert 1497 < ntk["reach"] < 1498
    # PI x8 divides every pair by 8; YaRN x8 (alpha 1, beta 32) interpolates fully every pair from
    # ceil(64 ln(512 / 2pi) / (2 ln 1e4)) = ceil(15.29) = 16 on, i.e. every bounded pair: both reach 8 x 512
    for m in ("pi", "yarn"):
        assert _describe(capsys, *d, "--rope", m, "--scale", "8")["reach"] == pytest.approx(4096)


def test_reach_in_the_table(capsys):
    assert describe_main(["--config", "assets/tiny", "--rope", "ntk", "--scale", "8"]) == 0
    out = capsys.readouterr().out
    assert "angle bound (pre-training): 1498 tokens" in out and "pair 16 is the first" in out
    assert "not a prediction" in out
