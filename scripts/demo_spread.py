#!/usr/bin/env python
"""The demo's seed-to-seed spread: reads the demo tables that ``scripts/demo.py --seed K`` wrote under one
``--out`` (``report/demo.json`` for seed 0, ``report_sK/demo.json`` for seed K) and prints, for every row of the
demo table, each column as ``mean (min-max)`` over the seeds found, the MSE(P-IE vs P-IB) column included, and in
how many seeds a fine-tune's answer loss stayed above 1 nat (the demo table's mark).

A seed moves the training pairs, the fine-tunes' seeds, the eval passages (other windows of the held-out chapters)
and their marked sentences, so the spread is over all of these::

    bash scripts/demo.sh --seed 1; bash scripts/demo.sh --seed 2     # after make demo (seed 0)
    .venv/bin/python scripts/demo_spread.py                          # runs/demo: seeds 0, 1, 2
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def seed_tables(out: Path) -> dict[int, dict]:
    """{seed: demo.json} for every seed's demo table under ``out``."""
    found = {}
    for p in sorted(out.glob("report*/demo.json")):
        m = re.fullmatch(r"report(?:_s(\d+))?", p.parent.name)
        if m:
            found[int(m.group(1) or 0)] = json.loads(p.read_text(encoding="utf-8"))
    return found


def spread(tables: dict[int, dict]) -> tuple[list[str], list[list]]:
    """(header, rows): each demo-table row (in seed 0's order, or the first seed's) x each column and the MSE, as
    ``mean (min-max)`` over the seeds that have that cell."""
    first = tables[min(tables)]
    cols = list(first["columns"])
    header = ["row", "seeds", *cols, "MSE (P-IE vs P-IB)"]
    out = []
    for row in first["rows"]:
        key = row.get("key", "floor")
        per_seed = [r for t in tables.values() for r in t["rows"] if r.get("key", "floor") == key]
        cells = []
        for c in cols:
            cells.append(summary([r["cells"].get(c) for r in per_seed]))
        cells.append(summary([r.get("mse_ie_ib") for r in per_seed]))
        above = sum(bool(r.get("loss_above", r.get("under_trained"))) for r in per_seed)
        label = row["row"] + (f" (answer loss > 1 nat in {above} of {len(per_seed)} seeds)" if above else "")
        out.append([label, str(len(per_seed)), *cells])
    return header, out


def summary(values: list) -> str | None:
    vals = [float(v) for v in values if isinstance(v, (int, float))]
    if not vals:
        return None
    mean = sum(vals) / len(vals)
    return f"{mean:.1f}" if len(vals) == 1 else f"{mean:.1f} ({min(vals):.1f}–{max(vals):.1f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo", help="the demo's --out (default runs/demo)")
    ap.add_argument("--json", action="store_true", help="print the table as JSON")
    args = ap.parse_args(argv)
    from ropescale.common.tables import markdown, number

    tables = seed_tables(Path(args.out))
    if not tables:
        print(f"error: {args.out}: no demo table (report*/demo.json): run scripts/demo.sh first", file=sys.stderr)
        return 2
    header, rows = spread(tables)
    if args.json:
        print(json.dumps({"seeds": sorted(tables), "header": header, "rows": rows}, ensure_ascii=False, indent=1))
        return 0
    print(f"### The demo table over seeds {', '.join(map(str, sorted(tables)))}: mean (min–max)")
    print(markdown(header, rows, number()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
