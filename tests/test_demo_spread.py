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
