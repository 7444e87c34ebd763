"""scripts/bound_tiny.py's measuring functions: per-token losses against HF's own loss, the binning by hand, the rise
over the in-window positions with its sign-flip p by hand, and where a rise is read to start."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import bound_tiny  # noqa: E402


def test_token_losses_are_hf_loss_per_position(make_tiny_model):
    model, _ = make_tiny_model("qwen2", orig_ctx=64, save=False)
    model.eval()
    ids = list(np.random.default_rng(0).integers(5, 200, 40))
    got = bound_tiny.token_losses(model, ids)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    assert got.shape == (39,) and float(got.mean()) == pytest.approx(ref, rel=1e-5)


def test_binned_by_hand():
    # losses at predicted positions 1..9 = 1..9; bins of 4: positions 1-3 (bin 0), 4-7, 8-9
    got = bound_tiny.binned(np.arange(1.0, 10.0), width=4)
    assert list(got) == [2.0, 5.5, 8.5]


def test_position_table_rise_and_p_by_hand():
    # 3 windows, bins of 2 positions; reference = bins 1 (positions 2-3): per window 1.0, 2.0, 3.0
    per = [[9.0, 1.0, 2.0], [9.0, 2.0, 4.0], [9.0, 3.0, 6.0]]
    rows = bound_tiny.position_table(per, width=2, ref=(2, 4))
    # bin 2 rises by 1, 2, 3 over the windows: mean 2, exact sign-flip p = 2/8 (|sum| >= 6 in 2 of 8 sign vectors)
    assert rows[2]["start"] == 4 and rows[2]["rise"] == pytest.approx(2.0) and rows[2]["p"] == pytest.approx(0.25)
    assert rows[1]["rise"] == 0.0 and rows[1]["p"] == 1.0
    assert rows[0]["loss"] == pytest.approx(9.0)


def test_first_rise_reads_where_every_later_bin_is_resolved():
    def row(start, rise, p):
        return {"start": start, "rise": rise, "p": p}

    rows = [row(0, 0.0, 1.0), row(512, 0.1, 0.01), row(640, -0.1, 0.4), row(768, 0.3, 0.01), row(896, 1.0, 0.001)]
    assert bound_tiny.first_rise(rows) == 768  # 512 rises but 640 does not: the rise that lasts starts at 768
    assert bound_tiny.first_rise(rows, min_rise=0.5) == 896
    assert bound_tiny.first_rise(rows[:3]) is None  # the last bin is not resolved


def test_add_q_is_bh_per_table_and_first_rise_reads_q():
    import scipy.stats

    def row(start, rise, p):
        return {"start": start, "rise": rise, "p": p}

    pos = {"a": [row(0, 0.0, 1.0), row(512, 0.3, 0.03), row(640, 0.3, 0.04)],
           "b": [row(0, 0.0, 0.9), row(512, 0.4, 0.001), row(640, 0.5, 0.002)]}
    grid = {"a": {"T512": {"p": 0.01}, "T1024": {"p": 0.2}}, "b": {"T512": {"p": 0.04}, "T1024": {"p": None}}}
    rec = {"grid": grid, "positions": pos}
    bound_tiny.add_q(rec)
    want = scipy.stats.false_discovery_control([x["p"] for xs in pos.values() for x in xs])
    assert [x["q"] for xs in pos.values() for x in xs] == pytest.approx(list(want))
    want = scipy.stats.false_discovery_control([0.01, 0.2, 0.04])
    assert [grid["a"]["T512"]["q"], grid["a"]["T1024"]["q"], grid["b"]["T512"]["q"]] == pytest.approx(list(want))
    assert "q" not in grid["b"]["T1024"]
    # the walk reads q: bins at p < 0.05 whose q is not below 0.05 do not count
    assert bound_tiny.first_rise(pos["b"]) == 512
    pos["a"][1]["q"], pos["a"][2]["q"] = 0.06, 0.06
    assert bound_tiny.first_rise(pos["a"]) is None
