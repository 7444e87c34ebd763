"""scripts/probe_tables.py's cells and tests on hand-made probe runs: items pooled over seeds and paired by target,
the cell's interval (t below 8 items, Wilson for an accuracy: scipy), the paired sign-flip p, the binomial p against
chance by hand, and a table of tests' BH q (scipy)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import probe_tables  # noqa: E402


def _run(d: Path, rows: list[tuple]) -> Path:
    d.mkdir(parents=True)
    (d / "items.jsonl").write_text("".join(json.dumps({"id": i, "group": g, "col": c, "value": v}) + "\n"
                                           for i, g, c, v in rows), encoding="utf-8")
    return d


def test_items_pool_seeds_and_pair_by_target(tmp_path):
    a = _run(tmp_path / "s0", [("doc@1:N512", "", 512, 3.0), ("doc@1:N1024", "", 1024, 4.0),
                               ("doc@9:N512", "", 512, 2.0), ("doc@9:N1024", "", 1024, 5.0)])
    b = _run(tmp_path / "s1", [("doc@1:N512", "", 512, 3.5), ("doc@1:N1024", "", 1024, 3.5)])
    it = probe_tables.items([a, b])
    # the same target id in two seeds is two items (another draw); pairs across columns by (seed, target)
    assert it[512] == {(0, "doc@1"): 3.0, (0, "doc@9"): 2.0, (1, "doc@1"): 3.5}
    # 3 items: the t interval (below 8 items the floor does not bootstrap), as scipy's
    lo, hi = scipy.stats.t.interval(0.95, 2, loc=np.mean([3.0, 2.0, 3.5]), scale=scipy.stats.sem([3.0, 2.0, 3.5]))
    assert probe_tables.row("m", it, [512], ".2f") == f"| m | {np.mean([3.0, 2.0, 3.5]):.2f} [{lo:.2f}, {hi:.2f}] |"
    # differences 1, 3, 0: mean 4/3; sign flips of (1, 3, 0): |sum| >= 4 in 4 of 8 vectors -> p = 0.5
    text, p = probe_tables.paired(it[1024], it[512], ".2f")
    assert text.startswith("+1.33 [") and p == pytest.approx(0.5)


def test_an_accuracy_cell_is_wilsons_and_a_table_of_tests_carries_bh_q():
    it = {512: {k: float(k < 2) for k in range(9)}, 1024: {k: 0.0 for k in range(9)}}
    w0 = scipy.stats.binomtest(0, 9).proportion_ci(0.95, method="wilson")  # 0 of 9: never [0, 0]
    w2 = scipy.stats.binomtest(2, 9).proportion_ci(0.95, method="wilson")
    assert probe_tables.row("m", it, [512, 1024], ".3f") == (f"| m | 0.222 [{w2.low:.3f}, {w2.high:.3f}] | "
                                                          f"0.000 [0.000, {w0.high:.3f}] |")
    rows = [("a", [("x", 0.01), ("y", 0.04)]), ("b", [("–", None), ("z", 0.03)])]
    md = probe_tables.tests_table("t", ["model", "c1", "c2"], rows)
    q = scipy.stats.false_discovery_control([0.01, 0.04, 0.03])
    assert f"| a | x p=0.010 q={q[0]:.3f} | y p=0.040 q={q[1]:.3f} |" in md and "| b | – | z p=0.030 q=0.040 |" in md


def test_above_chance_by_hand():
    vals = {k: float(k < 3) for k in range(6)}  # 3 of 6 right at chance 1/6
    # P(X >= 3), X ~ Bin(6, 1/6) = 1 - (5/6)^6 - 6 (1/6)(5/6)^5 - 15 (1/6)^2 (5/6)^4
    p = 1 - (5 / 6) ** 6 - 6 * (1 / 6) * (5 / 6) ** 5 - 15 * (1 / 36) * (5 / 6) ** 4
    assert probe_tables.above_chance(vals, 1 / 6) == ("3/6", pytest.approx(p))
    assert p == pytest.approx(0.0623, abs=1e-4)
