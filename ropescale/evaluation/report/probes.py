"""``ropescale probes report``: the extrapolation table of probe runs, in the one report stack (the runs read by
:func:`.intake.load_probe_runs`, the tables printed and written by the one table writer,
``ropescale.common.tables``, the PNG by :func:`.plot.save_png`; the command beside eval_summ's in :mod:`.cli`).

One table per probe: rows = settings (``ropescale.common.tables.Setting``: the model and its id, the full RoPE
spec, the model's training record -- the same rows and labels as eval_summ's report --, the probe's own variant:
input length N, suffix-id variant / heading / score) x the probe's group (block size k, perturbation kind, copy /
no-copy), columns = the probe's length bucket (prefix length, input length, distance), cells = the probe's metric
(accuracy or loss, the mean over items, with its n and 95 % interval over the items: :func:`with_intervals`,
in every format: markdown ``mean [lo, hi]`` and an n column, CSV ``<col>_n, <col>_lo,
<col>_hi``, JSON ``n`` and ``ci``; a cell of one item has no interval). Two runs of the same setting are
told apart by their run directory's name. A probe with a single column bucket and several groups (the shuffle
test without ``--lengths``) shows the groups (k=1..5) as columns. Printed as markdown (default), CSV or JSON;
``--out DIR`` also writes every table as DIR/<probe>.{md,csv,json} (an ``--out`` path ending in
.md/.csv/.json/.txt, the old spelling, is written as one file in ``--format``); ``--plot FILE.png`` draws one panel
per probe with a line per row.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from rope_scaling import RopeSpec
from ropescale.common.plot import fit_text, save_png
from ropescale.common.runs.record import column_key
from ropescale.common.stats.means import cell
from ropescale.common.stats.proportions import wilson
from ropescale.common.stats.resampling import RESAMPLES
from ropescale.common.tables import Setting, Table, number, setting_labels, tables_text, write_tables


def _setting_of(summary: dict) -> Setting:
    """A summary's row key: the one load_runs recorded, else (a summary printed by a probe command) its own."""
    if "_setting" in summary:
        return summary["_setting"]
    return Setting(str(summary.get("model", "")), RopeSpec.from_record(summary.get("rope")),
                   variant=summary.get("setting", ""))


@dataclass
class ProbeRows:
    """ONE probe's table: its title, header (``lead`` label columns, then one per length bucket), and per row the
    labels followed by the cells' means (``body``), counts (``ns``) and 95 % intervals (``ivs``: (lo, hi) or
    None)."""

    title: str
    header: list
    lead: int
    body: list
    ns: list
    ivs: list

    @property
    def columns(self) -> list:
        return self.header[self.lead:]


def with_intervals(summary: dict, records: list[dict], resamples: int | None = None) -> dict:
    """``summary`` (a probe run's cells) with each cell's 95 % interval over its items (``records``: items.jsonl,
    {id, group, col, value}) as ``lo`` / ``hi`` and its rule as ``interval``: a cell of 0/1 items (an accuracy) is
    a proportion, Wilson's interval (``stats.proportions.wilson``: never [0, 0] for 0 of n); any other cell a mean
    (``stats.means.cell``: Student's t over the items; a share's or proportion's over its range [0, 1], ``bounds``:
    clipped to it, Wilson's of the share where the items agree). The kind is the probe's own
    (``cell_kind`` in its summary: a loss that happens to be 1.0 is a mean); only an older run is judged by its
    items."""
    by: dict = {}
    for r in records:
        by.setdefault((r.get("group", ""), r["col"]), {})[r["id"]] = float(r["value"])
    # declared by the probe (ProbeRun); an older run: a loss is a mean, else decided from its items
    kind = summary.get("cell_kind") or ("mean" if str(summary.get("metric") or "").startswith("loss") else None)
    for c in summary.get("cells", []):
        vals = by.get((c.get("group", ""), c["col"]), {})
        zero_one = bool(vals) and all(v in (0.0, 1.0) for v in vals.values())
        if zero_one and kind != "mean":
            w = wilson(int(sum(vals.values())), len(vals))
            c["lo"], c["hi"], c["interval"] = w.lo, w.hi, w.rule
        else:  # a share's mean lies in [0, 1]: the t interval clipped to it, Wilson's where the items agree
            bounds = (0.0, 1.0) if kind in ("share", "proportion") else None
            e = cell(vals, resamples=resamples or RESAMPLES, bounds=bounds)
            c["lo"], c["hi"], c["interval"] = e.lo, e.hi, e.rule
    return summary


def table_rows(summaries: list[dict]) -> ProbeRows:
    """The table of summaries of ONE probe (:class:`ProbeRows`)."""
    probe = summaries[0].get("probe", "")
    cols: list = []
    rows: dict[tuple, dict] = {}
    counts: dict[tuple, dict] = {}
    ivs: dict[tuple, dict] = {}
    for s in summaries:
        setting = _setting_of(s)
        for c in s["cells"]:
            if c["col"] not in cols:
                cols.append(c["col"])
            key = (setting, c.get("group", ""))
            rows.setdefault(key, {})[c["col"]] = c["value"]
            counts.setdefault(key, {})[c["col"]] = c["n"]
            ivs.setdefault(key, {})[c["col"]] = (c["lo"], c["hi"]) if c.get("lo") is not None else None
    cols.sort(key=column_key)
    has_group = any(k[1] for k in rows)
    if len(cols) == 1 and has_group:  # one bucket, several groups (shuffle without --lengths): groups as columns
        rows, counts, ivs, cols = _pivot(rows), _pivot(counts), _pivot(ivs), sorted({k[1] for k in rows}, key=str)
        has_group = False
    labels = setting_labels(k[0] for k in rows)
    has_setting = any(lab.variant for lab in labels.values())
    has_train = any(k[0].train is not None for k in rows)
    header = (["model", "rope"] + (["train_length"] if has_train else []) + (["setting"] if has_setting else [])
              + (["group"] if has_group else []) + [str(c) for c in cols])

    def lead(k):
        lab, st = labels[k[0]], k[0]
        tl = "-" if st.train is None else (st.train_length.text() if st.train_length else "?")
        return ([lab.model, lab.rope or "none"] + ([tl] if has_train else []) + ([lab.variant] if has_setting else [])
                + ([k[1]] if has_group else []))

    ordered = sorted(rows, key=lambda k: (lead(k)[0], k[0].rope is not None and k[0].rope.scaled,
                                          lead(k)[1:], str(k[1])))
    body = [lead(k) + [rows[k].get(c) for c in cols] for k in ordered]
    ns = [lead(k) + [counts[k].get(c) for c in cols] for k in ordered]
    iv = [lead(k) + [ivs[k].get(c) for c in cols] for k in ordered]
    metric = " / ".join(dict.fromkeys(s.get("metric", "") for s in summaries))  # e.g. logprob and pmi runs
    column = summaries[0].get("column", "")
    title = f"{probe}: {metric}; columns = {column}"
    return ProbeRows(title, header, len(header) - len(cols), body, ns, iv)


def _pivot(cells: dict[tuple, dict]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for (setting, g), by_col in cells.items():
        out.setdefault((setting, ""), {})[g] = next(iter(by_col.values()))
    return out


_cell = number(3, "–")
NOTE = ("Cells: the mean over n items [95% interval over the items: Wilson's for an accuracy (0/1 items), the "
        "Student's t for a mean]; n: items per cell (a range when the cells "
        "differ).")


def _md_cell(v, iv) -> str:
    if v is None:
        return _cell(v)
    return _cell(v) if iv is None else f"{_cell(v)} [{_cell(iv[0])}, {_cell(iv[1])}]"


def _n_range(ns: list) -> str:
    vals = sorted({n for n in ns if n is not None})
    return "-" if not vals else str(vals[0]) if len(vals) == 1 else f"{vals[0]}-{vals[-1]}"


def to_table(summaries: list[dict]) -> Table:
    """ONE probe's table (``tables.Table``: the one table type both reports write): every cell with its n and
    interval (see module doc)."""
    t = table_rows(summaries)
    probe = summaries[0].get("probe", "") or "probe"
    k = t.lead
    cols = [str(c) for c in t.columns]
    csv_header = ["probe"] + t.header[:k] + [x for c in cols for x in (c, f"{c}_n", f"{c}_lo", f"{c}_hi")]
    csv_rows = [[probe] + b[:k] + [x for v, n, iv in zip(b[k:], ns[k:], ivs[k:])
                                   for x in (v, n, *(iv if iv is not None else (None, None)))]
                for b, ns, ivs in zip(t.body, t.ns, t.ivs)]
    md_rows = [b[:k] + [_n_range(ns[k:])] + [_md_cell(v, iv) for v, iv in zip(b[k:], ivs[k:])]
               for b, ns, ivs in zip(t.body, t.ns, t.ivs)]
    return Table(probe, t.title, csv_header, csv_rows, str, (t.header[:k] + ["n"] + cols, md_rows),
                 {"title": t.title, "header": t.header, "rows": t.body, "n": t.ns,
                  "ci": [b[:k] + [None if iv is None else list(iv) for iv in ivs[k:]] for b, ivs in zip(t.body,
                                                                                                       t.ivs)]},
                 NOTE)


def by_probe(summaries: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for s in summaries:
        groups.setdefault(s.get("probe", ""), []).append(s)
    return groups


def render_probes(summaries: list[dict], fmt: str = "markdown") -> str:
    """All tables in ``fmt`` (markdown, csv, json; ``md`` accepted): JSON a list of tables, CSV one after the
    other."""
    return tables_text([to_table(ss) for ss in by_probe(summaries).values()], fmt)


def write_probe_tables(summaries: list[dict], out_dir: str | os.PathLike):
    """Every probe's table as DIR/<probe>.{md,csv,json} (atomically); returns the paths."""
    return write_tables([to_table(ss) for ss in by_probe(summaries).values()], out_dir)


def print_summary(summary: dict, as_json: bool = False) -> None:
    """Print one run's cells to stdout (its markdown table with n and intervals, or JSON): what each probe command
    prints."""
    if as_json:
        print(json.dumps(summary, ensure_ascii=False))
        return
    print(to_table([summary]).text("markdown"), end="")


def plot_probes(summaries: list[dict], path: str | os.PathLike) -> Path:
    """One panel per probe, a line per row (setting x group, labelled as in the table) over the columns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = by_probe(summaries)
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.2), squeeze=False)
    for ax, (probe, ss) in zip(axes[0], groups.items()):
        t = table_rows(ss)
        title, k = t.title, t.lead
        cols = [str(c) for c in t.columns]
        numeric = all(c.lstrip("-").isdigit() for c in cols)
        xs = [int(c) for c in cols] if numeric else list(range(len(cols)))
        for r, ns, ivs in zip(t.body, t.ns, t.ivs):
            pts = [(x, v, iv) for x, v, iv in zip(xs, r[k:], ivs[k:]) if v is not None]
            if pts:
                err = [[v - (iv[0] if iv else v) for _, v, iv in pts], [(iv[1] if iv else v) - v for _, v, iv in pts]]
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=err, marker="o", capsize=3,
                            label=f"{' '.join(map(str, r[:k]))} (n={_n_range(ns[k:])} per point)")
        if numeric and min(xs) > 0 and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
        if not numeric:
            ax.set_xticks(xs, cols)
        ax.set_title(title.split(";")[0])
        ax.set_xlabel(ss[0].get("column", ""))
        ax.set_ylabel(ss[0].get("metric", ""))
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.text(0.5, 0.01, "Points: the mean over n items with its 95% interval over the items.", ha="center",
             va="bottom", fontsize=7)
    fit_text(fig)  # Chinese in a label: a font that has it, or '?' (not boxes and a warning per glyph)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    try:
        return save_png(fig, path, dpi=110)
    finally:
        plt.close(fig)
