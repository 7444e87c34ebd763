"""scripts/probe_tables.py's cells and tests on hand-made probe runs: items pooled over seeds and paired by target,
the cell's bootstrap interval, the paired sign-flip p and the binomial p against chance, by hand."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import probe_tables  # noqa: E402


def _run(d: Path, rows: list[tuple]) -> Path:
    d.mkdir(parents=True)
    (d / "items.jsonl").write_text("".join(json.dumps({"id": i, "group": g, "col": c, "value": v}) + "\n"
                                           for i, g, c, v in rows), encoding="utf-8")
    return d


def test_items_pool_seeds_and_pair_by_target(tmp_path):
    from ropescale.common.stats.means import cell

    a = _run(tmp_path / "s0", [("doc@1:N512", "", 512, 3.0), ("doc@1:N1024", "", 1024, 4.0),
                               ("doc@9:N512", "", 512, 2.0), ("doc@9:N1024", "", 1024, 5.0)])
    b = _run(tmp_path / "s1", [("doc@1:N512", "", 512, 3.5), ("doc@1:N1024", "", 1024, 3.5)])
    it = probe_tables.items([a, b])
    # the same target id in two seeds is two items (another draw); pairs across columns by (seed, target)
    assert it[512] == {(0, "doc@1"): 3.0, (0, "doc@9"): 2.0, (1, "doc@1"): 3.5}
    est = cell([3.0, 2.0, 3.5])
    assert probe_tables.row("m", it, [512], ".2f") == f"| m | {est.mean:.2f} [{est.lo:.2f}, {est.hi:.2f}] |"
    # differences 1, 3, 0: mean 4/3; sign flips of (1, 3, 0): |sum| >= 4 in 4 of 8 vectors -> p = 0.5
    assert probe_tables.paired(it[1024], it[512], ".2f").startswith("+1.33 [") and "p=0.50" in \
        probe_tables.paired(it[1024], it[512], ".2f")


def test_above_chance_by_hand():
    vals = {k: float(k < 3) for k in range(6)}  # 3 of 6 right at chance 1/6
    # P(X >= 3), X ~ Bin(6, 1/6) = 1 - (5/6)^6 - 6 (1/6)(5/6)^5 - 15 (1/6)^2 (5/6)^4
    p = 1 - (5 / 6) ** 6 - 6 * (1 / 6) * (5 / 6) ** 5 - 15 * (1 / 36) * (5 / 6) ** 4
    assert probe_tables.above_chance(vals, 1 / 6) == f"3/6 p={p:.3f}"
    assert p == pytest.approx(0.0623, abs=1e-4)
