#!/usr/bin/env python
"""The probe tables of README / docs/probes.md on the tiny default, with their spread over seeds.

Runs (each an ordinary ``ropescale probes ...`` command, printed before it runs; finished runs are reused):
- copy: a 128-token target pasted d tokens before itself, inside the 512-token context (``--length 512``) for the
  unscaled model, and at ``--length 4096`` for every method at scale 8;
- suffix-id, sentence variant (Sun et al. 2021 Sec 5): gold next 128 tokens vs 5 same-book spans, 256 .. 4096
  tokens read (a prefix + the 128-token candidate: 128 .. 3,968-token prefixes), unscaled and every method at scale
  8, scored by log-likelihood (the papers') and by PMI
  (``--score pmi``: what the prefix adds to each candidate's likelihood);
- ppl: loss on the last 10 tokens of an N-token held-out input, N = 512 .. 4096, every method at scale 8;
- "after": ppl for the demo's fine-tuned models (``runs/demo/train/tiny-*/merged``), when
  they exist (``make demo`` first).
Each "before" cell is run with ``--seeds`` seeds (different items); the tables give the mean over seeds and the
spread (min-max of the per-seed means). Writes the markdown to ``--md`` (default docs/probes_tables.md).

    .venv/bin/python scripts/probe_tables.py --n 16     # ~29 min on 2 CPU cores
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rope_scaling.formulas import PLAIN  # noqa: E402
from ropescale.demo import scaled, tagged  # noqa: E402  (the demo's run names: its fine-tunes are read here)

METHODS = (PLAIN, "pi", "ntk", "yarn")


def rope_flags(m: str, scale: int = 8) -> list[str]:
    return ["--rope", m, "--scale", str(scale)] if scaled(m) else ["--rope", m]


def probe(out: Path, argv: list[str]) -> dict:
    """Run ``ropescale probes ARGV --out OUT`` unless OUT holds a finished run; return its summary."""
    if not (out / "summary.json").is_file():
        cmd = [sys.executable, "-m", "ropescale.probes"] + argv + ["--out", str(out)]
        print("  $ " + " ".join(shlex.quote(str(a)) for a in cmd), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))


def cells(summary: dict, group: str = "") -> dict:
    return {c["col"]: c["value"] for c in summary["cells"] if c.get("group", "") == group}


def items(outs: list[Path], group: str = "") -> dict:
    """{column: {(run, item): value}} of the runs' items in ``group``: an item is its id up to the first ':' (the
    target, break or document position: the same item at every column of a run), a run its index in ``outs``
    (a seed draws other items, so items of all seeds are independent samples)."""
    out: dict = {}
    for k, o in enumerate(outs):
        for line in (o / "items.jsonl").read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            if r.get("group", "") == group:
                out.setdefault(r["col"], {})[(k, r["id"].split(":", 1)[0])] = float(r["value"])
    return out


def row(label: str, per_col: dict, cols: list, fmt: str) -> str:
    """A table row: per column the mean over every item of every seed [95 % interval over the items: an accuracy
    (0/1 items) Wilson's, a mean the bootstrap from 8 items]."""
    from ropescale.common.stats.means import cell
    from ropescale.common.stats.proportions import wilson

    out = [label]
    for c in cols:
        vals = per_col.get(c)
        if not vals:
            out.append("–")
            continue
        if all(v in (0.0, 1.0) for v in vals.values()):
            w = wilson(int(sum(vals.values())), len(vals))
            mean, lo, hi = w.rate, w.lo, w.hi
        else:
            e = cell(vals)
            mean, lo, hi = e.mean, e.lo, e.hi
        out.append(format(mean, fmt) if lo is None else f"{format(mean, fmt)} [{format(lo, fmt)}, {format(hi, fmt)}]")
    return "| " + " | ".join(out) + " |"


def paired(a: dict, b: dict, fmt: str) -> tuple[str, float | None]:
    """a - b over the items both have (the same targets or breaks): (``mean [interval]``, its paired sign-flip
    permutation p); the q beside it comes from its table (:func:`tests_table`)."""
    from ropescale.common.stats.tests import paired_sign_flip

    t = paired_sign_flip(a, b)
    if t.p is None:
        return "–", None
    return f"{format(t.statistic, '+' + fmt)} [{format(t.lo, '+' + fmt)}, {format(t.hi, '+' + fmt)}]", t.p


def above_chance(vals: dict, chance: float) -> tuple[str, float]:
    """An accuracy against chance: (``k/n``, the one-sided binomial p of at least that many right of n items)."""
    from ropescale.common.stats.distributions import binomial_sf

    k, n = int(round(sum(vals.values()))), len(vals)
    return f"{k}/{n}", binomial_sf(k, n, chance)


def table(title: str, head: list[str], rows: list[str]) -> str:
    return "\n".join([f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head), *rows, ""])


def tests_table(title: str, head: list[str], rows: list[tuple[str, list]]) -> str:
    """A table of tests, one declared family: each cell ``text p=.. q=..``, q the Benjamini-Hochberg q over the
    table's tests. ``rows``: (label, [(text, p or None), ...])."""
    from ropescale.common.stats.multiplicity import bh_q
    from ropescale.common.stats.tests import p_text

    qs = iter(bh_q([p for _, cells in rows for _, p in cells]))
    lines = []
    for label, cells in rows:
        out = []
        for text, p in cells:
            q = next(qs)
            out.append(text if p is None else f"{text} p={p_text(p)} q={p_text(q)}")
        lines.append(f"| {label} | " + " | ".join(out) + " |")
    return table(title + " (p, and q: Benjamini-Hochberg over this table)", head, lines)


LENGTHS = [512, 1024, 2048, 3072, 4096]  # ppl: total input lengths
SID_LENGTHS = [256, 512, 1024, 2048, 4096]  # suffix-id: tokens read (prefix + 128-token candidate)
DISTS_4K = [0, 256, 512, 1024, 2048, 3840]


def _label(m: str, prefix: str = "tiny") -> str:
    return f"{prefix}, {m}" + (" x8" if scaled(m) else "")


def copy_inside(out: Path, seeds, common: list) -> tuple[list, list]:
    """Copy inside the original context: the table and its test (copy - no copy on the same targets)."""
    outs = [out / f"copy512-{PLAIN}-s{s}" for s in seeds]
    for o, s in zip(outs, seeds):
        probe(o, ["copy", "--model", "tiny", *rope_flags(PLAIN), "--length", "512", "--seed", str(s)] + common)
    cp, nocp = items(outs, "copy"), items(outs, "no-copy")
    dists = [0, 64, 128, 256]
    md = [table("copy, N = 512 (inside the context): loss (nats/token) on a 128-token target with a copy of it "
                "ending d tokens before it, and without", ["", *[f"d={d}" for d in dists]],
                [row("copy", cp, dists, ".3f"), row("no copy", nocp, dists, ".3f")])]
    tests = [tests_table("copy - no copy, N = 512, the same targets", ["", *[f"d={d}" for d in dists]],
                         [("tiny, none", [paired(cp[d], nocp[d], ".2f") for d in dists])])]
    return md, tests


def suffix_id(out: Path, seeds, common: list) -> tuple[list, list]:
    """Suffix identification by log-likelihood and by PMI (the same items: same seeds and data): the tables, the
    accuracies against chance and against the 512-token cell (the same items)."""
    from ropescale.probes.suffix_id import METRICS, SCORES

    md, tests = [], []
    for score in SCORES:
        rows, trows, crows = [], [], []
        for m in METHODS:
            name = f"suffix-{m}" if score == "logprob" else f"suffix-{score}-{m}"
            outs = [out / f"{name}-s{s}" for s in seeds]
            for o, s in zip(outs, seeds):
                probe(o, ["suffix-id", "--variant", "sentence", "--model", "tiny", *rope_flags(m), "--lengths",
                          ",".join(map(str, SID_LENGTHS)), "--score", score, "--seed", str(s)] + common)
            it = items(outs)
            rows.append(row(_label(m), it, SID_LENGTHS, ".3f"))
            crows.append((_label(m), [above_chance(it[c], 1 / 6) for c in SID_LENGTHS]))
            trows.append((_label(m), [paired(it[c], it[512], ".3f") for c in SID_LENGTHS[2:]]))
        head = ["model", *map(str, SID_LENGTHS)]
        md.append(table(f"suffix-id (sentence variant, --score {score}): {METRICS[score]}, chance 0.167, vs the "
                        "tokens read (prefix + the 128-token candidate)", head, rows))
        tests.append(tests_table(f"suffix-id --score {score}: right of n items, one-sided binomial p against chance "
                                 "(1/6)", head, crows))
        tests.append(tests_table(f"suffix-id --score {score}: accuracy at L - at 512 tokens read, the same items",
                                 ["model", *map(str, SID_LENGTHS[2:])], trows))
    return md, tests


def ppl_and_copy_4k(out: Path, seeds, common: list, demo: str, n: int) -> tuple[list, list]:
    """ppl vs length for every method (and the demo's fine-tunes) and copy at 4,096 tokens: the tables, the loss at
    N against N = 512 (the same targets), copy against no copy."""
    rows, crows, trows, ctrows = [], [], [], []
    for m in METHODS:
        outs = [out / f"ppl-{m}-s{s}" for s in seeds]
        for o, s in zip(outs, seeds):
            probe(o, ["ppl", "--model", "tiny", *rope_flags(m), "--lengths", ",".join(map(str, LENGTHS)), "--seed",
                      str(s)] + common)
        it = items(outs)
        rows.append(row(_label(m), it, LENGTHS, ".3f"))
        trows.append((_label(m), [paired(it[c], it[512], ".2f") for c in LENGTHS[1:]]))
        o4 = out / f"copy4096-{m}"
        probe(o4, ["copy", "--model", "tiny", *rope_flags(m), "--length", "4096", "--distances",
                   ",".join(map(str, DISTS_4K)), "--seed", "0"] + common)
        cp, nocp = items([o4], "copy"), items([o4], "no-copy")
        nocopy = next(iter(nocp.values()))  # the same target without its copy: one loss, whatever d
        crows.append(row(_label(m), {**cp, "no copy": nocopy}, [*DISTS_4K, "no copy"], ".2f"))
        ctrows.append((_label(m), [paired(cp[d], nocopy, ".2f") for d in DISTS_4K]))
    for m in METHODS:
        d = Path(demo) / "train" / tagged("tiny", m, "8") / "merged"
        if (d / "config.json").is_file():
            o = out / f"after-ppl-{m}"
            probe(o, ["ppl", "--model", str(d), "--lengths", ",".join(map(str, LENGTHS)), "--seed", "0"] + common)
            it = items([o])
            rows.append(row(_label(m, "fine-tuned"), it, LENGTHS, ".3f"))
            trows.append((_label(m, "fine-tuned"), [paired(it[c], it[512], ".2f") for c in LENGTHS[1:]]))
    md = [table("ppl: loss (nats/token) on the last 10 tokens vs input length N", ["model", *map(str, LENGTHS)],
                rows),
          table(f"copy, N = 4096: loss on the 128-token target with its copy d tokens before it, and without a copy "
                f"(seed 0, {n} targets)", ["model", *[f"d={d}" for d in DISTS_4K], "no copy"], crows)]
    tests = [tests_table("ppl: loss at N - at N = 512, the same targets", ["model", *map(str, LENGTHS[1:])], trows),
             tests_table("copy - no copy, N = 4096, the same targets", ["model", *[f"d={d}" for d in DISTS_4K]],
                         ctrows)]
    return md, tests


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/probes", help="where the probe runs go (default runs/probes)")
    ap.add_argument("--demo", default="runs/demo", help="the demo's output (its fine-tuned models)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per 'before' cell (default 3)")
    ap.add_argument("--n", type=int, default=32, help="items per cell and seed (default 32)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--md", default="docs/probes_tables.md")
    args = ap.parse_args(argv)
    out, seeds = Path(args.out), range(args.seeds)
    # every probe reads the chapters the tiny build held out (the last 12 of each book; what `--model tiny` reads
    # by default), the fine-tuned models too (explicit --data: they are not tiny builds)
    from ropescale.probes.data import tiny_heldout_file

    out.mkdir(parents=True, exist_ok=True)
    common = ["--n", str(args.n), "--threads", str(args.threads), "--data", str(tiny_heldout_file("tiny"))]
    md = ["# Probe tables on the tiny default", "",
          f"Made by `.venv/bin/python scripts/probe_tables.py --seeds {args.seeds} --n {args.n}` ({args.seeds} seeds "
          f"x {args.n} items per 'before' cell; a cell is the mean over every item of every seed [95% bootstrap "
          "interval over the items]). Held-out text: the last 12 chapters of each book (never trained on). 'before': "
          "the tiny default with the RoPE flags applied at load time (no training); 'after': the demo's models "
          "fine-tuned on recall pairs of 1024-2048 tokens with that method at scale 8, merged.", ""]
    tests: list = []
    for part in (copy_inside(out, seeds, common), suffix_id(out, seeds, common),
                 ppl_and_copy_4k(out, seeds, common, args.demo, args.n)):
        md += part[0]
        tests += part[1]
    md += ["## Tests the readings use", "",
           "a - b on the same items (targets, breaks): mean [95% bootstrap interval over the items] p (paired "
           "sign-flip permutation, two-sided; items of every seed pooled: a seed draws other items of the same "
           "held-out text, so they are independent samples); accuracy against chance: items right of n, "
           "one-sided binomial p.", "", *tests]
    from ropescale.common.io import write_text_atomic

    write_text_atomic(args.md, "\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
