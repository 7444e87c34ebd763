"""``ropescale probes report``: the extrapolation table of probe runs, in the one report stack (the runs read by
:func:`.intake.load_probe_runs`, the tables printed and written by the one table writer,
``ropescale.common.tables``, the PNG by :func:`.plot.save_png`; the command beside eval_summ's in :mod:`.cli`).

One table per probe: rows = settings (``ropescale.common.tables.Setting``: the model and its id, the full RoPE
spec, the model's training record -- the same rows and labels as eval_summ's report --, the probe's own variant:
input length N, suffix-id variant / heading / score) x the probe's group (block size k, perturbation kind, copy /
no-copy), columns = the probe's length bucket (prefix length, input length, distance), cells = the probe's metric
(accuracy or loss, the mean over items; ``n`` items per cell in the JSON output). Two runs of the same setting are
told apart by their run directory's name. A probe with a single column bucket and several groups (the shuffle
test without ``--lengths``) shows the groups (k=1..5) as columns. Printed as markdown (default), CSV or JSON;
``--out DIR`` also writes every table as DIR/<probe>.{md,csv,json} (an ``--out`` path ending in
.md/.csv/.json/.txt, the old spelling, is written as one file in ``--format``); ``--plot FILE.png`` draws one panel
per probe with a line per row.
"""
from __future__ import annotations

import os
from pathlib import Path

from rope_scaling import RopeSpec
from ropescale.common.runs import column_key
from ropescale.common.tables import Setting, Table, number, setting_labels, tables_text, write_tables

from .plot import fit_text, save_png


def _setting_of(summary: dict) -> Setting:
    """A summary's row key: the one load_runs recorded, else (a summary printed by a probe command) its own."""
    if "_setting" in summary:
        return summary["_setting"]
    return Setting(str(summary.get("model", "")), RopeSpec.from_record(summary.get("rope")),
                   variant=summary.get("setting", ""))


def table_rows(summaries: list[dict]) -> tuple[str, list[str], list[list], list[list]]:
    """(title, header, rows of labels + cell values, rows of cell counts) for summaries of ONE probe."""
    probe = summaries[0].get("probe", "")
    cols: list = []
    rows: dict[tuple, dict] = {}
    counts: dict[tuple, dict] = {}
    for s in summaries:
        setting = _setting_of(s)
        for c in s["cells"]:
            if c["col"] not in cols:
                cols.append(c["col"])
            key = (setting, c.get("group", ""))
            rows.setdefault(key, {})[c["col"]] = c["value"]
            counts.setdefault(key, {})[c["col"]] = c["n"]
    cols.sort(key=column_key)
    has_group = any(k[1] for k in rows)
    if len(cols) == 1 and has_group:  # one bucket, several groups (shuffle without --lengths): groups as columns
        rows, counts, cols = _pivot(rows), _pivot(counts), sorted({k[1] for k in rows}, key=str)
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

    ordered = sorted(rows, key=lambda k: (lead(k)[0], k[0].rope is not None and k[0].rope.method != "none",
                                          lead(k)[1:], str(k[1])))
    body = [lead(k) + [rows[k].get(c) for c in cols] for k in ordered]
    ns = [lead(k) + [counts[k].get(c) for c in cols] for k in ordered]
    metric = " / ".join(dict.fromkeys(s.get("metric", "") for s in summaries))  # e.g. logprob and pmi runs
    column = summaries[0].get("column", "")
    title = f"{probe}: {metric}; columns = {column}"
    return title, header, body, ns


def _pivot(cells: dict[tuple, dict]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for (setting, g), by_col in cells.items():
        out.setdefault((setting, ""), {})[g] = next(iter(by_col.values()))
    return out


_cell = number(3, "–")


def to_table(summaries: list[dict]) -> Table:
    """ONE probe's table (``tables.Table``: the one table type both reports write)."""
    title, header, body, ns = table_rows(summaries)
    probe = summaries[0].get("probe", "") or "probe"
    return Table(probe, title, ["probe"] + header, [[probe] + r for r in body], _cell, (header, body),
                 {"title": title, "header": header, "rows": body, "n": ns})


def to_markdown(title: str, header: list[str], body: list[list], ns: list[list] | None = None) -> str:
    return Table("", title, header, body, _cell).text("markdown")


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
    """Print one run's cells to stdout (its markdown table, or JSON): what each probe command prints."""
    import json

    if as_json:
        print(json.dumps(summary, ensure_ascii=False))
        return
    print(to_markdown(*table_rows([summary])))


def plot_probes(summaries: list[dict], path: str | os.PathLike) -> Path:
    """One panel per probe, a line per row (setting x group, labelled as in the table) over the columns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = by_probe(summaries)
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.2), squeeze=False)
    for ax, (probe, ss) in zip(axes[0], groups.items()):
        title, header, body, _ = table_rows(ss)
        ncol0 = 2 + sum(h in ("train_length", "setting", "group") for h in header[2:5])
        cols = header[ncol0:]
        numeric = all(c.lstrip("-").isdigit() for c in cols)
        xs = [int(c) for c in cols] if numeric else list(range(len(cols)))
        for r in body:
            pts = [(x, v) for x, v in zip(xs, r[ncol0:]) if v is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=" ".join(map(str, r[:ncol0])))
        if numeric and min(xs) > 0 and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
        if not numeric:
            ax.set_xticks(xs, cols)
        ax.set_title(title.split(";")[0])
        ax.set_xlabel(ss[0].get("column", ""))
        ax.set_ylabel(ss[0].get("metric", ""))
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fit_text(fig)  # Chinese in a label: a font that has it, or '?' (not boxes and a warning per glyph)
    fig.tight_layout()
    try:
        return save_png(fig, path, dpi=110)
    finally:
        plt.close(fig)
