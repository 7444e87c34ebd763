#!/usr/bin/env python
"""The paper's Table 2 comparison on the tiny default (docs/demo.md, "The paper's Table 2 comparison").

CNNSum's Table 2 (Sec 4.3) evaluates models as they are, with the baseline prompts of its Appendix F.1 (Prompt-IE:
the instruction at the end; Prompt-IB: at the beginning), at four lengths, and marks in red an MSE(P-IE vs P-IB) of
5.0 or more. The demo's own IE/IB table runs the F.2 prompts, which the tiny default was pre-trained with (the
analogue of the paper's fine-tuned models, Sec 4.5). This script runs the paper's setting on the tiny default: the
F.1 prompts, which it never saw, at all four lengths (1x-8x its 512-token context), on the base model and on NTK x8
and YaRN x8 applied at load time (no fine-tune), and prints per row and length the mean of the two prompts [95 %
bootstrap interval], IE - IB [paired interval] with its sign-flip permutation p, and the MSE beside its noise floor
with its permutation p and P(MSE >= 5) under no prompt effect (``ropescale/common/stats/tests.py``);
then the same rows with the F.2 prompts (the demo's runs) and F.1 - F.2 per row and length.

It reuses the demo's model, eval sets (made for all four prompts: every F.1 sample fits its length too) and F.2
runs, so run it after the demo of the same seed; its generation runs go to OUT/gen_f1[_sK]/ beside the demo's F.1
runs at 1x (reused)::

    bash scripts/demo.sh                                  # seed 0 (make demo)
    .venv/bin/python scripts/table2_tiny.py --seeds 0     # + 22 generation runs a seed

Tables to stdout (``--json``: the records); OUT/report[_sK]/table2_f1.{md,json}.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # demo_spread (over seeds)

from rope_scaling.formulas import PLAIN  # noqa: E402
from ropescale import demo  # noqa: E402  (the demo's model, data and table helpers: ropescale/demo/)
from ropescale.demo.tables import add_q  # noqa: E402

ROWS = (("base", "tiny (no fine-tune)", PLAIN), ("free-ntk-x8", "tiny, ntk x8 at load time", "ntk"),
        ("free-yarn-x8", "tiny, yarn x8 at load time", "yarn"))


def say(msg: str) -> None:
    print(f"[table2 {time.time() - demo.T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def the_demo(out: str, seed: int, samples: int) -> "demo.Demo":
    """The demo's settings for this seed (its model and eval sets, reused where they are)."""
    from ropescale.common.paths import CHAPTERS_JSONL

    d = demo.Demo(Path(out), "tiny", (), ("ntk", "yarn"), 8.0, (1, 2, 4, 8), samples, 128, 2, 4, 256, "python", (),
                  seed, str(CHAPTERS_JSONL), None, True)
    d.out.mkdir(parents=True, exist_ok=True)
    demo.the_model(d)
    demo.the_data(d)
    return d


def rows_of(d: "demo.Demo") -> list:
    return [demo.Row(key, label, "tiny", method, ("--rope", method, "--scale", "8") if demo.scaled(method) else ())
            for key, label, method in ROWS]


def generate(d: "demo.Demo") -> None:
    """Every row with both F.1 prompts at every length (a finished run is reused)."""
    for r in rows_of(d):
        for pr in demo.F1:
            for tg in d.targets:
                demo.generate_once(d, r.model, r.flags, pr, tg, d.gen_f1 / f"{r.key}_{pr}_T{tg}")


def records(d: "demo.Demo") -> dict:
    """{"F.1": [row record], "F.2": [row record], "f1_minus_f2": [comparison]}: the demo's row records
    (``demo.table_row``: cells, intervals, IE - IB with p, MSE with floor and p) of the F.1 and F.2 runs."""
    cols = [f"T{tg}" for tg in d.targets]
    out: dict = {"columns": cols, "seed": d.seed}
    for fam, where, prompts in (("F.1", d.gen_f1, demo.F1), ("F.2", d.gen, demo.F2)):
        recs = []
        for r in rows_of(d):
            st = demo.row_stats([where / f"{r.key}_{pr}_T{tg}" for pr in prompts for tg in d.targets])
            recs.append({**demo.table_row(d, r, st, cols, None), "prompts": fam})
        add_q(recs)  # each family's IE - IB cells, and its MSE tests: BH q beside p
        out[fam] = recs
    out["f1_minus_f2"] = f1_minus_f2(out["F.1"], out["F.2"], cols)
    return out


def f1_minus_f2(f1: list[dict], f2: list[dict], cols: list[str]) -> list[dict]:
    """Per row and length: F.1 - F.2 over the same eval samples (each sample's two prompts averaged), with its
    paired sign-flip p and its BH q over the table (one family)."""
    from ropescale.common.stats.multiplicity import family
    from ropescale.common.stats.tests import paired_sign_flip

    tests = {}
    for k, (a, b) in enumerate(zip(f1, f2)):
        for c in cols:
            x, y = demo.sample_means(a, c), demo.sample_means(b, c)
            if x and y:
                tests[k, c] = paired_sign_flip(x, y)
    tests = family(tests)
    return [{"label": f"{a['row']}: F.1 - F.2", "cells": {
        c: {"mean": t.statistic, "ci": [t.lo, t.hi], "p": t.p, "q": t.q, "n": t.n, "reading": t.reading()}
        for (j, c), t in tests.items() if j == k}} for k, a in enumerate(f1)]


def markdown(rec: dict) -> str:
    from ropescale.common.tables import markdown as md

    cols = rec["columns"]

    parts = []
    for fam in ("F.1", "F.2"):
        rows = [[r["row"], *[demo.cell_text(r, c) for c in cols], demo.mse_text(r),
                 "-" if r.get("mse_p_red") is None else f"{r['mse_p_red']:.2f}"] for r in rec[fam]]
        diffs = [[r["row"], *[demo.diff_text(r["ie_minus_ib"].get(c)) for c in cols]] for r in rec[fam]]
        what = ("F.1 baseline prompts (never seen by the tiny default; the paper's Table 2 setting)" if fam == "F.1"
                else "F.2 prompts (the tiny default's pre-training prompts; the demo's runs)")
        parts.append(f"#### Seed {rec['seed']}, {what}: the mean of Prompt-IE and Prompt-IB [95% bootstrap "
                     f"interval], MSE(P-IE vs P-IB) [noise floor] p, P(MSE >= 5) under no prompt effect\n"
                     + md(["row", *cols, "MSE [floor] p", "P(MSE >= 5) under no effect"], rows))
        parts.append(f"IE - IB [paired 95% bootstrap interval] p (paired sign-flip permutation) q (BH over the "
                     f"table), {fam}:\n"
                     + md(["row", *cols], diffs))
    parts.append("F.1 - F.2 on the same eval samples [95% bootstrap interval] p q (BH over the table):\n"
                 + md(["row", *cols], [[c["label"], *[demo.diff_text(c["cells"].get(col)) for col in cols]]
                                       for c in rec["f1_minus_f2"]]))
    reds = [r["mse_p_red"] for fam in ("F.1", "F.2") for r in rec[fam] if r.get("mse_p_red") is not None]
    parts.append(f"n = 16 eval samples a cell, each under both prompts of its family. Red rows expected from noise "
                 f"alone (the sum of P(MSE >= 5) over these {len(reds)} rows): {sum(reds):.1f}.")
    return "\n\n".join(parts)


def over_seeds(recs: list[dict]) -> str:
    """With several seeds: each family's rows over the seeds (``scripts/demo_spread.py``'s tables: mean [two-level
    interval] (min-max), MSE mean (min-max)), every IE - IB cell's and every F.1 - F.2 cell's t test over the seeds,
    and each row's MSE permutation p per seed."""
    import demo_spread

    from ropescale.common.tables import markdown as md
    from ropescale.common.tables import number

    seeds = ", ".join(str(r["seed"]) for r in recs)
    parts = []
    for fam in ("F.1", "F.2"):
        tables = {r["seed"]: {"columns": r["columns"], "rows": r[fam],
                              "comparisons": r["f1_minus_f2"] if fam == "F.1" else []} for r in recs}
        header, rows = demo_spread.spread(tables)
        parts.append(f"#### {fam} prompts over seeds {seeds}: mean [95% t interval over the seeds] (min-max of the "
                     f"seeds' cells)\n" + md(header, rows, number()))
        ieib = demo_spread.ie_ib_over_seeds(tables)
        tr = ieib["t_resolved"]
        parts.append(f"{fam} IE - IB over seeds: {len(tr)} of {ieib['t_tested']} cells' t tests resolve at BH q < 0.05"
                     + (": " + ", ".join(f"{k} {v['mean']:+.1f} (p = {v['p']:.2g}, q = {v['q']:.2g})"
                                         for k, v in tr.items())
                        if tr else "") + ". MSE permutation p per seed: " + "; ".join(
                            f"{k} " + " / ".join("-" if p is None else f"{p:.2g}" for p in ps.values())
                            for k, ps in ieib["mse_p"].items()))
        if fam == "F.1":
            c_header, c_rows, _ = demo_spread.comparisons_over_seeds(tables)
            parts.append("F.1 - F.2 over seeds: mean [95% t interval] p (each seed's difference)\n"
                         + md(c_header, c_rows, number()))
    return "\n\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo", help="the demo's --out (default runs/demo)")
    ap.add_argument("--seeds", default="0", help="comma-separated demo seeds (default 0)")
    ap.add_argument("--samples", type=int, default=16, help="eval samples per length (the demo's, default 16)")
    ap.add_argument("--json", action="store_true", help="print the records as JSON")
    args = ap.parse_args(argv)
    from ropescale.common.io import write_text_atomic
    from ropescale.common.process import prepare_process
    from ropescale.common.tables import json_text

    prepare_process()
    demos: dict = {}

    def one(seed: int) -> dict:
        d = demos[seed] = the_demo(args.out, seed, args.samples)
        generate(d)
        return records(d)

    def write(seed: int, rec: dict) -> None:
        report = demos[seed].report
        report.mkdir(parents=True, exist_ok=True)
        write_text_atomic(report / "table2_f1.json", json_text(rec))
        write_text_atomic(report / "table2_f1.md", markdown(rec) + "\n")

    recs = demo.over_seeds(args.seeds, one, say, write)
    if args.json:
        print(json_text(recs))
        return 0
    text = "\n\n".join(markdown(r) for r in recs)
    if len(recs) > 1:
        text += "\n\n" + over_seeds(recs)
        write_text_atomic(Path(args.out) / "table2_f1_over_seeds.md", over_seeds(recs) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
