#!/usr/bin/env python
"""The angle bound tested where it claims to hold, on the tiny default (docs/demo.md, "The bound, tested").

Two numbers claim where NTK x8 on the tiny default (original context 512) stops working: this project's angle bound
(``formulas.reach``: the longest context in which every rotary pair stays inside the angles it saw in pre-training,
1,498 tokens) and Liu et al. 2023's closed form (``formulas.critical_period``: T_extra, the full period of the
critical pair under the new base, 1,838 tokens). Liu et al. derive theirs for a model *fine-tuned with the new base
at its original training length* ("Scaling Laws of RoPE-based Extrapolation", arXiv 2310.05209, Sec. 3: the
critical dimension is set by the training length), so this script trains exactly that: NTK x8, the demo's recipe,
on recall pairs of 256-512 tokens packed several a sample with positions reset per pair and a document mask (every
position id and query-key distance trained is <= 512, see docs/positions.md), and evaluates it, and NTK x8 at load
time (no fine-tune: the bound's own setting), on a grid fine enough to tell the two numbers apart:

- recall (the demo's task, F.2 prompts, 16 held-out samples) at a total of 512 and 1,024 to 2,560 tokens every 256:
  per length the mean [95 % bootstrap interval], the difference from the marks-only floor on the same samples with
  its paired sign-flip p, and the row's share of its own 512-token score (NoLiMa's 85 % rule);
- loss by position: the mean next-token loss (nats) per 128 positions of held-out 3,072-token windows, against the
  row's own loss at positions 256-511 (inside the original window) on the same windows, with a paired sign-flip p
  over the windows (the unscaled model as a control: it breaks at 512).

    .venv/bin/python scripts/bound_tiny.py --seeds 0 --out runs/bound

Tables to stdout (``--json``: the records), OUT/bound.{md,json}. Re-running reuses finished runs.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # positions_tiny (the short-pair data)

from ropescale import demo  # noqa: E402  (the demo's model, data, launch and table helpers: ropescale/demo/)

GRID = (512, 1024, 1280, 1536, 1792, 2048, 2304, 2560)
BIN = 128
WINDOW = 3072
REF = (256, 512)  # the positions a row's in-window loss is read over
FLAGS = ("--positions", "reset", "--attention", "document")


def say(msg: str) -> None:
    print(f"[bound {time.time() - demo.T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ loss by position
def token_losses(model, ids: list[int]):
    """The next-token loss (nats) at every position 1..n-1 of one sequence (position i: predicting token i from
    tokens 0..i-1), fp32."""
    import torch

    with torch.no_grad():
        x = torch.tensor([ids])
        logits = model(input_ids=x).logits[0, :-1].float()
        return torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="none").numpy()


def binned(losses, width: int = BIN):
    """Mean loss per ``width`` positions: bin k covers predicted positions [k w, (k+1) w) (position 0 is never
    predicted, so bin 0 has w - 1)."""
    import numpy as np

    pos = np.arange(1, len(losses) + 1)
    bins = pos // width
    return np.array([losses[bins == k].mean() for k in range(int(bins.max()) + 1)])


def position_table(per_window, width: int = BIN, ref: tuple = REF) -> list[dict]:
    """Per bin: the mean over windows [bootstrap interval] and the paired difference from the window's own mean
    over the ``ref`` positions' bins, with its sign-flip p. ``per_window``: (windows, bins)."""
    import numpy as np

    from ropescale.common.stats.means import cell
    from ropescale.common.stats.tests import sign_flip

    a = np.asarray(per_window)
    r = a[:, ref[0] // width:ref[1] // width].mean(axis=1)
    out = []
    for k in range(a.shape[1]):
        est = cell(list(a[:, k]))
        t = sign_flip(list(a[:, k] - r))
        out.append({"start": k * width, "loss": est.mean, "ci": [est.lo, est.hi], "rise": t.statistic,
                    "rise_ci": [t.lo, t.hi], "p": t.p})
    return out


def first_rise(rows: list[dict], after: int = 0, min_rise: float = 0.0) -> int | None:
    """The start of the first bin at or past ``after`` from which every later bin's loss is above the reference
    by a resolved amount (q < 0.05, its BH q in the table's family when :func:`add_q` set one, else p; rise >
    ``min_rise``); None when the last bin is not."""
    from ropescale.common.stats.distributions import ALPHA

    def resolved(x: dict) -> bool:
        q = x.get("q", x["p"])
        return q is not None and q < ALPHA and x["rise"] > min_rise and x["start"] >= after

    k = len(rows)
    while k > 0 and resolved(rows[k - 1]):
        k -= 1
    return None if k == len(rows) else rows[k]["start"]


def loss_by_position(model_name: str, spec, windows) -> list[dict]:
    from ropescale.probes.common import load_model

    loaded = load_model(model_name, spec)
    per = [binned(token_losses(loaded.model, w.prefix + w.target)) for w in windows]
    return position_table(per)


# ------------------------------------------------------------------------------------------------ the runs
def the_demo(out: str, seed: int, samples: int) -> "demo.Demo":
    from ropescale.common.paths import CHAPTERS_JSONL

    d = demo.Demo(Path(out), "tiny", ("ntk",), ("ntk",), 8.0, tuple(t / 512 for t in GRID), samples, 128, 2, 4,
                  256, "python", (), seed, str(CHAPTERS_JSONL), None, False)
    d.out.mkdir(parents=True, exist_ok=True)
    demo.the_model(d)
    if d.orig != 512:
        raise SystemExit(f"[bound] the grid is for a 512-token model, got {d.orig}")
    demo.the_data(d)
    return d


def fine_tune(d: "demo.Demo") -> Path:
    """NTK x8 on short pairs (256-512 tokens) packed into 1-2K samples, reset positions + document mask: every
    trained position and distance <= 512 (the tiny_demo recipe, one process); merged; reused when merged."""
    import positions_tiny

    from ropescale.training.cli import main as finetune_main

    data = positions_tiny.short_data(d, d.orig // 2, d.orig, "multi", 2 * d.orig, 4 * d.orig)
    run = d.out / "train" / f"ntk-x8-reset-document-short-s{d.seed}"
    merged = run / "merged"
    if not (merged / "config.json").is_file():
        demo.sh([sys.executable, "finetune.py", "--rope", "ntk", "--scale", "8", "--data", str(data), "--out",
                 str(run), "--seed", str(d.seed), *FLAGS, *(["--resume", "auto"] if run.exists() else [])])
        demo.in_process("python finetune.py", finetune_main, ["merge", "--run", str(run), "--out", str(merged)])
    return merged


def rows_of(d: "demo.Demo", merged: Path) -> list:
    return [demo.Row("ft-ntk-x8-short", "fine-tuned ntk x8 at <= 512 positions", str(merged), "ntk",
                     train_dir=merged.parent),
            demo.Row("free-ntk-x8", "tiny, ntk x8 at load time", "tiny", "ntk", ("--rope", "ntk", "--scale", "8"))]


def generate(d: "demo.Demo", rows: list) -> dict:
    """{row key: its run dirs}: every row with both F.2 prompts at every length (a finished run is reused)."""
    return {r.key: [demo.generate_once(d, r.model, r.flags, pr, tg, d.out / f"gen_s{d.seed}" / f"{r.key}_{pr}_T{tg}")
                    for pr in demo.F2 for tg in d.targets] for r in rows}


def grid_row(run_dirs: list[Path]) -> dict:
    """Per length: the row's cell [interval], the paired difference from the marks-only floor on the same samples
    with its sign-flip p, and the share of the row's 512-token score."""
    from ropescale.common.stats.tests import paired_sign_flip
    from ropescale.evaluation.report.intake import build_report

    rep = build_report([str(p) for p in run_dirs])
    s = rep.series[0]
    cols = list(rep.columns)
    floor: dict = {}
    for r in rep.runs:
        for smp in r.samples:
            sub = smp.get("subset") or r.summary.get("subset")
            floor.setdefault(sub, {})[r.sample_key(smp, sub)] = float(smp["marks_only_rouge_l"])
    out = {}
    first = None
    for c in cols:
        est = rep.estimate(s, c)
        first = est.mean if first is None else first
        groups = [rep.samples[(s, k, c)] for k in ("IE", "IB") if (s, k, c) in rep.samples]
        per = {i: sum(g[i] for g in groups if i in g) / sum(1 for g in groups if i in g) for g in groups for i in g}
        t = paired_sign_flip(per, floor.get(c, {}))
        out[c] = {"mean": est.mean, "ci": [est.lo, est.hi], "n": est.n, "above_floor": t.statistic,
                  "above_floor_ci": [t.lo, t.hi], "p": t.p, "share_of_1x": est.mean / first if first else None,
                  "ci_share": [est.lo / first, est.hi / first] if first and est.lo is not None else None}
    return out


def measure(d: "demo.Demo", windows: int) -> dict:
    from rope_scaling import RopeSpec
    from ropescale.common.runs.record import read_train_record
    from ropescale.probes.data import load_docs, tiny_heldout_file
    from ropescale.probes.rope_search import draw_windows

    merged = fine_tune(d)
    rows = rows_of(d, merged)
    runs = generate(d, rows)
    grid = {r.key: grid_row(runs[r.key]) for r in rows}
    bounds = {r.key: demo.row_bound(str(d.model_dir), RopeSpec("ntk", scale=8)) if r.train_dir is None else
              demo.row_bound(r.model, None, read_train_record(r.model) or {}) for r in rows}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(d.model_dir))
    wins = draw_windows(tok, load_docs(tiny_heldout_file("tiny")), windows, WINDOW, WINDOW - 1, 20_000 + d.seed)
    pos = {"ft-ntk-x8-short": loss_by_position(str(merged), None, wins),
           "free-ntk-x8": loss_by_position("tiny", RopeSpec("ntk", scale=8), wins),
           "base": loss_by_position("tiny", None, wins)}
    liu = bounds["free-ntk-x8"]["liu"]
    return {"seed": d.seed, "grid": grid, "bounds": bounds, "liu": liu, "positions": pos, "windows": len(wins),
            "rows": {r.key: r.label for r in rows}}


# ------------------------------------------------------------------------------------------------ tables
def add_q(rec: dict) -> None:
    """The record's two declared families, each test with its Benjamini-Hochberg q: the recall grid's differences
    from the floor (every row and length) and the loss table's rises (every row and bin)."""
    from ropescale.common.stats.multiplicity import bh_q

    for cells in ([x for g in rec["grid"].values() for x in g.values()],
                  [x for xs in rec["positions"].values() for x in xs]):
        cells = [x for x in cells if x.get("p") is not None]
        for x, q in zip(cells, bh_q([x["p"] for x in cells])):
            x["q"] = q


def markdown(rec: dict) -> str:
    from ropescale.common.stats.tests import p_text
    from ropescale.common.tables import markdown as md

    add_q(rec)

    cols = list(next(iter(rec["grid"].values())))
    rows = []
    for key, label in rec["rows"].items():
        g = rec["grid"][key]
        rows.append([f"{label}: ROUGE-L"] + [f"{g[c]['mean']:.1f} [{g[c]['ci'][0]:.1f}, {g[c]['ci'][1]:.1f}]"
                                             for c in cols])
        rows.append(["  - floor, same samples [interval] p q"] + [
            f"{g[c]['above_floor']:+.1f} [{g[c]['above_floor_ci'][0]:+.1f}, {g[c]['above_floor_ci'][1]:+.1f}] "
            f"p={p_text(g[c]['p'])} q={p_text(g[c].get('q'))}" for c in cols])
        rows.append(["  share of its T512 score"] + [f"{100 * g[c]['share_of_1x']:.0f}%" for c in cols])
    b = rec["bounds"]
    head = (f"#### Seed {rec['seed']}: recall by total length (F.2 prompts, 16 samples x 2 prompts a cell). Angle "
            f"bound: {b['free-ntk-x8']['bound']:,.0f} (ntk x8 at load time), {b['ft-ntk-x8-short']['bound']:,.0f} "
            f"(the fine-tune: trained distances <= {b['ft-ntk-x8-short']['trained_length']}); Liu et al.'s T_extra "
            f"{rec['liu']:,.0f}")
    starts = [x["start"] for x in rec["positions"]["base"]]
    prow = []
    for key, label in (("base", "tiny (unscaled)"), ("free-ntk-x8", "ntk x8 at load time"),
                       ("ft-ntk-x8-short", "ntk x8 fine-tuned at <= 512")):
        xs = rec["positions"][key]
        prow.append([f"{label}: loss"] + [f"{x['loss']:.2f}" for x in xs])
        prow.append(["  - loss at 256-511, p q"] + [f"{x['rise']:+.2f} p={p_text(x['p'])} q={p_text(x.get('q'))}"
                                                     for x in xs])
    pos_head = (f"Loss by position (nats, next token; {rec['windows']} held-out windows of {WINDOW} tokens; column: "
                f"the first position of a {BIN}-position bin) and its rise over the row's own positions 256-511 on "
                f"the same windows, p: paired sign-flip over the windows (unit: the window; smallest p 2/2^n), q: "
                f"Benjamini-Hochberg over the table's tests")
    rises = {k: first_rise(v, after=512) for k, v in rec["positions"].items()}
    tail = ("First bin from which every later bin's loss is resolved above positions 256-511 (q < 0.05): "
            + "; ".join(f"{k}: {'none' if v is None else v}" for k, v in rises.items()))
    return "\n\n".join([head, md(["row", *cols], rows), pos_head, md(["row", *map(str, starts)], prow), tail])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bound", help="where everything goes (default runs/bound)")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (data, fine-tune, eval passages)")
    ap.add_argument("--samples", type=int, default=16, help="eval samples per length (default 16)")
    ap.add_argument("--windows", type=int, default=16, help="held-out windows for the loss by position (16)")
    ap.add_argument("--json", action="store_true", help="print the records as JSON")
    args = ap.parse_args(argv)
    from ropescale.common.io import write_text_atomic
    from ropescale.common.process import prepare_process
    from ropescale.common.tables import json_text

    prepare_process()
    recs = demo.over_seeds(args.seeds, lambda seed: measure(the_demo(args.out, seed, args.samples), args.windows), say)
    text = "\n\n".join(markdown(r) for r in recs)
    write_text_atomic(Path(args.out) / "bound.json", json_text(recs))
    write_text_atomic(Path(args.out) / "bound.md", text + "\n")
    print(json_text(recs) if args.json else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
