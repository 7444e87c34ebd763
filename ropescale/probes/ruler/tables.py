"""The ruler probe's readings: per task and length, the RULER average, the effective lengths, the needle grid and
its heatmaps, from the items of one or more run directories.

- a cell is the mean score (items.jsonl: a share in [0, 1]; here x 100) over its n samples; its 95 % interval is
  Wilson's (ropescale.common.stats.proportions) when every sample scores 0 or 100 (a proportion), else the mean's
  over the score's range 0..100 (ropescale.common.stats.means.cell with ``bounds``: the t interval clipped to
  [0, 100], Wilson's of the share where the samples have no spread);
- the average is RULER's: the mean over the tasks of each task's mean at a length (arXiv 2404.06654 Sec 4), its
  interval Wilson's on the pooled samples when they are all 0 or 100 with equal n a task, else the t interval of
  the mean of task means over the range 0..100 (ropescale.common.stats.means.cell_of_prompts with ``bounds``, the
  tasks' samples apart; none for n = 1 a task);
- the effective length: RULER's absolute rule (the longest length up to which the average stays >= 85.6, Llama-2-7B's
  4K score) and NoLiMa's relative rule (>= 0.85 x the in-window score: the average at the longest length inside the
  original context; a 3.5M or 135M model never reaches 85.6), both by
  ropescale.common.stats.lengths.effective_length(_relative);
- the needle grid: niah_grid's accuracy by depth x length, Wilson intervals, and one heatmap per run side by side.

``python -m ropescale.probes.ruler.tables DIR... --out PREFIX`` writes PREFIX.md (every table) and PREFIX-WAY.png (the
heatmaps); a DIR may be an experiment's ``runs/ARM/sSEED`` (one run a length: the arm's runs read as one).
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import numpy as np

from ropescale.common.stats.lengths import NOLIMA_KEEP, effective_length, effective_length_relative
from ropescale.common.stats.means import cell, cell_of_prompts
from ropescale.common.stats.proportions import wilson

from .tasks import GRID

RULER_THRESHOLD = 85.6  # RULER: Llama-2-7B's average at 4K
SCORE_RANGE = (0.0, 100.0)  # a task's score and the average: shares in percent
LOSS_RANGE = (0.0, math.inf)  # a loss in nats: >= 0, no upper end


def interval(values: list[float]) -> tuple[float, float | None, float | None, str]:
    """(mean, lo, hi, rule) of a cell of scores in [0, 100]."""
    if all(v in (0.0, 100.0) for v in values):
        p = wilson(sum(v == 100.0 for v in values), len(values))
        return 100 * p.rate, 100 * p.lo, 100 * p.hi, "Wilson"
    e = cell(values, bounds=SCORE_RANGE)
    return e.mean, e.lo, e.hi, e.rule


def by_task(records: list[dict]) -> dict:
    """{(task, way): {length: [scores]}} (the grid apart)."""
    out: dict = {}
    for r in records:
        if r["task"] != GRID:
            out.setdefault((r["task"], r["way"]), {}).setdefault(r["col"], []).append(100 * float(r["value"]))
    return out


def averages(records: list[dict], seed: int = 0, resamples: int = 2000) -> dict:
    """{way: {length: (average, lo, hi, tasks)}}: RULER's mean over tasks; its interval Wilson's on the pooled samples
    when every sample scores 0 or 100 and the tasks have the same n (the average is then their pooled share), else
    the t interval of the mean of task means (var = sum_t s_t^2 / n_t / T^2, df = min n - 1) over the range
    0..100 (none below 2 samples a task). ``seed`` and ``resamples`` are not used."""
    cells = by_task(records)
    out: dict = {}
    for way in sorted({w for _, w in cells}):
        lengths = sorted({L for (t, w), c in cells.items() if w == way for L in c})
        for L in lengths:
            groups = [np.array(c[L]) for (t, w), c in cells.items() if w == way and L in c]
            mean = float(np.mean([g.mean() for g in groups]))
            if len({len(g) for g in groups}) == 1 and all(set(g.tolist()) <= {0.0, 100.0} for g in groups):
                p = wilson(int(sum((g == 100.0).sum() for g in groups)), sum(len(g) for g in groups))
                out.setdefault(way, {})[L] = (mean, 100 * p.lo, 100 * p.hi, len(groups))
                continue
            # the tasks' samples as groups of their own ids: the t interval of the mean of the task means
            e = cell_of_prompts([g.tolist() for g in groups], bounds=SCORE_RANGE)
            out.setdefault(way, {})[L] = (mean, e.lo, e.hi, len(groups))
    return out


def in_window(avg: dict, orig_ctx: int):
    """(length, score): the average at the longest length <= the original context (else the shortest)."""
    inside = [L for L in avg if L <= orig_ctx]
    L = max(inside) if inside else min(avg)
    return L, avg[L][0]


def effective(avg: dict, orig_ctx: int) -> dict:
    """Both rules' effective lengths of one way's averages {length: (mean, lo, hi, tasks)}."""
    cols = [str(L) for L in sorted(avg)]
    cells = {str(L): v[0] for L, v in avg.items()}
    ivs = {str(L): (v[1], v[2]) for L, v in avg.items()}
    base_L, base = in_window(avg, orig_ctx)
    absolute = effective_length(cells, RULER_THRESHOLD, columns=cols, intervals=ivs)
    relative = effective_length_relative(cells, keep=NOLIMA_KEEP, base=base, columns=cols, intervals=ivs)
    return {"in_window_length": base_L, "in_window_score": base, "absolute": absolute.to_dict(),
            "relative": relative.to_dict()}


def grid_cells(records: list[dict], way: str) -> dict:
    """{(depth, length): (k correct, n)} of the needle grid."""
    out: dict = {}
    for r in records:
        if r["task"] == GRID and r["way"] == way:
            k, n = out.get((r["depth"], r["col"]), (0, 0))
            out[(r["depth"], r["col"])] = (k + (float(r["value"]) == 1.0), n + 1)
    return out


def summary_extra(records: list[dict], lengths: list[int], orig_ctx: int) -> dict:
    """What summary.json adds: the averages, the effective lengths, the grid's cells (per way)."""
    avg = averages(records)
    grid = {w: [{"depth": d, "length": L, "k": k, "n": n} for (d, L), (k, n) in sorted(grid_cells(records, w).items())]
            for w in ("tf", "gen")}
    return {"average": {w: {str(L): list(v) for L, v in a.items()} for w, a in avg.items()},
            "effective": {w: effective(a, orig_ctx) for w, a in avg.items()},
            "grid": {w: g for w, g in grid.items() if g}, "thresholds": {"ruler": RULER_THRESHOLD,
                                                                      "nolima_keep": NOLIMA_KEEP}}


# ---------------------------------------------------------------- the page
def fmt(mean, lo, hi) -> str:
    return f"{mean:.1f} [{lo:.1f}, {hi:.1f}]" if lo is not None else f"{mean:.1f} (no interval)"


def task_table(runs: list[tuple[str, list[dict], int]], way: str) -> str:
    """Rows: run x task, then the run's average; columns: lengths; cells 'mean [lo, hi]', n in its column."""
    lengths = sorted({r["col"] for _, recs, _ in runs for r in recs})
    head = "| run | task | n | " + " | ".join(map(str, lengths)) + " |"
    lines = [head, "|" + "---|" * (3 + len(lengths))]
    for name, recs, _ in runs:
        cells = by_task(recs)
        for (task, w), c in sorted(cells.items()):
            if w != way:
                continue
            n = "/".join(sorted({str(len(v)) for v in c.values()}))
            lines.append(f"| {name} | {task} | {n} | " + " | ".join(
                fmt(*interval(c[L])[:3]) if L in c else "-" for L in lengths) + " |")
        avg = averages(recs).get(way, {})
        lines.append(f"| {name} | **average** | {len({t for t, w in cells if w == way})} tasks | " + " | ".join(
            f"**{fmt(*avg[L][:3])}**" if L in avg else "-" for L in lengths) + " |")
    return "\n".join(lines)


def loss_table(runs: list[tuple[str, list[dict], int]]) -> str:
    """Rows: run x task; columns: lengths; cells: the teacher-forced loss of the reference tokens (nats a token, the
    mean over samples, its interval ropescale.common.stats.means.cell's over the range [0, inf): clipped at 0)."""
    lengths = sorted({r["col"] for _, recs, _ in runs for r in recs})
    lines = ["| run | task | n | " + " | ".join(map(str, lengths)) + " |", "|" + "---|" * (3 + len(lengths))]
    for name, recs, _ in runs:
        by: dict = {}
        for r in recs:
            if r["way"] == "tf" and r["task"] != GRID and r.get("ref_loss") is not None:
                by.setdefault(r["task"], {}).setdefault(r["col"], []).append(float(r["ref_loss"]))
        for task, c in sorted(by.items()):
            n = "/".join(sorted({str(len(v)) for v in c.values()}))
            cells = []
            for L in lengths:
                e = cell(c[L], bounds=LOSS_RANGE) if L in c else None
                cells.append("-" if e is None else (f"{e.mean:.2f} [{e.lo:.2f}, {e.hi:.2f}]"
                                                    if e.lo is not None else f"{e.mean:.2f}"))
            lines.append(f"| {name} | {task} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def effective_table(runs: list[tuple[str, list[dict], int]], way: str) -> str:
    lines = ["| run | in-window score (at L) | RULER rule: avg >= 85.6 | NoLiMa rule: avg >= 0.85 x in-window "
             "(threshold) |", "|---|---|---|---|"]
    for name, recs, orig in runs:
        avg = averages(recs).get(way)
        if not avg:
            continue
        e = effective(avg, orig)
        rel = e["relative"]
        thr = "-" if rel["threshold"] is None else f"{rel['threshold']:.1f}"
        lines.append(f"| {name} | {e['in_window_score']:.1f} ({e['in_window_length']}) | {e['absolute']['text']} | "
                     f"{rel['text']} ({thr}) |")
    return "\n".join(lines)


def grid_table(name: str, recs: list[dict], way: str) -> str:
    g = grid_cells(recs, way)
    depths, lengths = sorted({d for d, _ in g}), sorted({L for _, L in g})
    lines = [f"| {name}: depth | " + " | ".join(map(str, lengths)) + " |", "|---|" + "---|" * len(lengths)]
    for d in depths:
        row = []
        for L in lengths:
            k, n = g.get((d, L), (0, 0))
            p = wilson(k, n) if n else None
            row.append(f"{k}/{n} [{100 * p.lo:.0f}, {100 * p.hi:.0f}]" if p else "-")
        lines.append(f"| {100 * d:.0f} % | " + " | ".join(row) + " |")
    return "\n".join(lines)


def heatmaps(runs: list[tuple[str, list[dict], int]], way: str, png: str | Path) -> None:
    """One heatmap per run (depth rows x length columns, accuracy %), side by side, into ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [(name, grid_cells(recs, way)) for name, recs, _ in runs]
    shown = [(n, g) for n, g in shown if g]
    cols = min(5, len(shown))
    rows = -(-len(shown) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols + 0.6, 2.9 * rows + 0.5), squeeze=False)
    for ax in axes.flat[len(shown):]:
        ax.axis("off")
    for ax, (name, g) in zip(axes.flat, shown):
        depths, lengths = sorted({d for d, _ in g}), sorted({L for _, L in g})
        acc = np.array([[100 * g[(d, L)][0] / g[(d, L)][1] if (d, L) in g else np.nan for L in lengths]
                        for d in depths])
        ax.imshow(acc, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
        for i in range(len(depths)):
            for j in range(len(lengths)):
                if np.isfinite(acc[i, j]):
                    ax.text(j, i, f"{acc[i, j]:.0f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), [str(L) for L in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}" for d in depths], fontsize=7)
        n = sorted({v[1] for v in g.values()})
        ax.set_title(f"{name}\n(n = {'/'.join(map(str, n))} a cell)", fontsize=8)
        ax.set_xlabel("length L (tokens)", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("needle depth (%)", fontsize=7)
    fig.suptitle(f"needle grid: niah_single_1 accuracy (%), {way}", fontsize=9)
    fig.tight_layout()
    from ropescale.common.io import atomic_open

    with atomic_open(png, "wb", encoding=None) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def load_runs(dirs: list[str]) -> list[tuple[str, list[dict], int]]:
    """(name, items, original context) of each ruler run directory; a directory of run directories (an experiment's
    ``runs/ARM/sSEED``, one run a length) is one run of their items together, named by the arm."""
    from ropescale.common.io import InputError, read_json
    from ropescale.common.runs.record import ITEMS, RUN_JSON, RecordLog

    out = []
    for d in map(Path, dirs):
        parts = [d] if (d / RUN_JSON).is_file() else sorted(p.parent for p in d.glob(f"*/{RUN_JSON}"))
        if not parts:
            raise InputError("not a ruler run directory (no run.json in it or in its folders)", d)
        recs, orig = [], 0
        for part in parts:
            info = read_json(part / RUN_JSON, RUN_JSON).get("info", {})
            if info.get("probe") != "ruler":
                raise InputError("not a ruler run directory", part / RUN_JSON)
            recs += RecordLog(part / ITEMS).records()
            orig = orig or int(info.get("orig_ctx", 0))
        name = d.name if parts == [d] or not re.fullmatch(r"s\d+", d.name) else d.parent.name
        out.append((name, recs, orig))
    return out


def page(runs, way: str, png_name: str) -> str:
    parts = [f"### Per task and the average ({way})", task_table(runs, way),
             f"### Effective length ({way})", effective_table(runs, way)]
    if way == "tf":
        parts += ["### Teacher-forced loss of the reference tokens (nats a token)", loss_table(runs)]
    if any(grid_cells(recs, way) for _, recs, _ in runs):
        parts += [f"### Needle grid ({way}): correct/n [Wilson 95 %] by depth x length", f"![needle grid]({png_name})"]
        parts += [grid_table(name, recs, way) for name, recs, _ in runs if grid_cells(recs, way)]
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    from ropescale.common.io import write_text_atomic

    ap = argparse.ArgumentParser(prog="python -m ropescale.probes.ruler.tables", description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", metavar="DIR", help="ruler run directories (or an experiment's runs/ARM/sSEED)")
    ap.add_argument("--out", required=True, metavar="PREFIX", help="writes PREFIX.md and PREFIX-<way>.png")
    ap.add_argument("--way", choices=("gen", "tf", "both"), default="both")
    a = ap.parse_args(argv)
    runs = load_runs(a.dirs)
    text = []
    for way in (("gen", "tf") if a.way == "both" else (a.way,)):
        png = Path(f"{a.out}-{way}.png")
        if any(grid_cells(recs, way) for _, recs, _ in runs):
            heatmaps(runs, way, png)
        text.append(page(runs, way, png.name))
    write_text_atomic(f"{a.out}.md", "\n".join(text))
    print(f"[ruler] wrote {a.out}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
