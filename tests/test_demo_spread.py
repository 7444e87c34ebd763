"""scripts/demo_spread.py: the demo table over seeds, as mean (min-max), on hand-made tables."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _table(out: Path, seed: int, base: list, mse) -> None:
    d = out / ("report" if seed == 0 else f"report_s{seed}")
    d.mkdir(parents=True)
    rows = [{"row": "marks only (the floor)", "cells": {"T512": 21.0, "T1024": 22.0}},
            {"row": "tiny (no fine-tune)", "key": "base", "cells": {"T512": base[0], "T1024": base[1]},
             "mse_ie_ib": mse, "loss_above": seed == 1}]
    (d / "demo.json").write_text(json.dumps({"columns": ["T512", "T1024"], "rows": rows}), encoding="utf-8")


def test_spread_over_seeds(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    import demo_spread

    _table(tmp_path, 0, [40.0, 10.0], 2.0)
    _table(tmp_path, 1, [50.0, None], 4.0)
    _table(tmp_path, 2, [45.0, 20.0], None)
    (tmp_path / "report" / "baseline_prompts").mkdir()  # not a seed's table
    assert sorted(demo_spread.seed_tables(tmp_path)) == [0, 1, 2]
    header, rows = demo_spread.spread(demo_spread.seed_tables(tmp_path))
    assert header == ["row", "seeds", "T512", "T1024", "MSE (P-IE vs P-IB)"]
    assert rows[0] == ["marks only (the floor)", "3", "21.0 (21.0–21.0)", "22.0 (22.0–22.0)", None]
    # 40/50/45 -> mean 45; T1024 only from the seeds that have it; MSE 2 and 4 -> 3
    assert rows[1] == ["tiny (no fine-tune) (answer loss > 1 nat in 1 of 3 seeds)", "3", "45.0 (40.0–50.0)",
                       "15.0 (10.0–20.0)", "3.0 (2.0–4.0)"]
    assert demo_spread.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| tiny (no fine-tune) (answer loss > 1 nat in 1 of 3 seeds) | 3 | 45.0 (40.0–50.0) |" in out
    assert demo_spread.main(["--out", str(tmp_path / "none")]) == 2


def _seed_table(out: Path, seed: int, shift: float, ieib: list) -> None:
    """A seed's demo table with per-sample scores: base and a free row on 3 samples at T512 and T1024; the free
    row's IE - IB per column from ``ieib``; table C's free - base difference."""
    d = out / ("report" if seed == 0 else f"report_s{seed}")
    d.mkdir(parents=True)
    rows, samples = [], {}
    for key, level in (("base", 80.0), ("free", 60.0)):
        smp = {}
        for k, c in enumerate(("T512", "T1024")):
            gap = ieib[k] if key == "free" else 0.0
            ie = {str(i): level + shift + i + gap / 2 for i in range(3)}
            ib = {str(i): level + shift + i - gap / 2 for i in range(3)}
            smp[c] = {"IE": ie, "IB": ib}
        samples[key] = smp
        rows.append({"row": key, "key": key, "cells": {c: level + shift + 1 for c in ("T512", "T1024")},
                     "ie_minus_ib": {c: {"mean": ieib[k] if key == "free" else 0.0, "p": 0.01 if k else 0.5}
                                     for k, c in enumerate(("T512", "T1024"))},
                     "samples": smp, "mse_ie_ib": 1.0, "mse_p": 0.2 + seed / 10})
    comps = [{"label": "free - base", "cells": {c: {"mean": -20.0 + seed} for c in ("T512", "T1024")}}]
    (d / "demo.json").write_text(json.dumps({"columns": ["T512", "T1024"], "rows": rows, "comparisons": comps}),
                                 encoding="utf-8")


def test_spread_tests_over_seeds(tmp_path, capsys):
    """The t interval over the seeds' cells (scipy), t over seeds for table C with BH q over the table, sign
    consistency of IE - IB by hand."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import demo_spread
    import numpy as np
    import scipy.stats

    from ropescale.common.stats.tests import t_over_seeds

    for seed, shift, ieib in ((0, 0.0, [2.0, -1.0]), (1, 3.0, [1.0, 1.0]), (2, -1.0, [4.0, -2.0])):
        _seed_table(tmp_path, seed, shift, ieib)
    tables = demo_spread.seed_tables(tmp_path)
    header, rows = demo_spread.spread(tables)
    per_seed = [np.mean([np.mean(list(t["rows"][0]["samples"]["T512"][k].values())) for k in ("IE", "IB")])
                for t in tables.values()]
    lo, hi = scipy.stats.t.interval(0.95, 2, loc=np.mean(per_seed), scale=scipy.stats.sem(per_seed))
    assert rows[0][2] == f"81.7 [{lo:.1f}, {hi:.1f}] (80.0–84.0)"
    _, c_rows, recs = demo_spread.comparisons_over_seeds(tables)
    t = t_over_seeds([-20.0, -19.0, -18.0])
    assert recs[0]["p"] == t.p and c_rows[0][1].startswith(f"{t.statistic:+.1f} [{t.lo:+.1f}, {t.hi:+.1f}]")
    q = scipy.stats.false_discovery_control([r["p"] for r in recs])
    assert [r["q"] for r in recs] == [float(x) for x in q] and recs[0]["family"] == len(recs)
    ieib = demo_spread.ie_ib_over_seeds(tables)
    # 4 cells (base and free x 2 lengths); base's are 0 (no sign); free T512 is + in all 3, T1024 changes sign:
    # 1 of 4 consistent, each with probability 1/4: P(X >= 1) = 1 - (3/4)^4
    assert ieib["consistent"]["statistic"] == 1 and ieib["consistent"]["n"] == 4
    assert abs(ieib["consistent"]["p"] - (1 - 0.75 ** 4)) < 1e-12
    assert (ieib["resolved"], ieib["tested"]) == (6, 12)  # every T1024 cell has p = 0.01
    assert demo_spread.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 of 4 cells keep one sign in all 3 seeds" in out and "free - base" in out
