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
METHODS = ("none", "pi", "ntk", "yarn")


def rope_flags(m: str, scale: int = 8) -> list[str]:
    return ["--rope", "none"] if m == "none" else ["--rope", m, "--scale", str(scale)]


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


def row(label: str, per_seed: list[dict], cols: list, fmt: str) -> str:
    out = [label]
    for c in cols:
        vals = [d[c] for d in per_seed if c in d]
        if not vals:
            out.append("–")
        elif len(vals) == 1:
            out.append(format(vals[0], fmt))
        else:
            out.append(f"{format(sum(vals) / len(vals), fmt)} ({format(min(vals), fmt)}–{format(max(vals), fmt)})")
    return "| " + " | ".join(out) + " |"


def table(title: str, head: list[str], rows: list[str]) -> str:
    return "\n".join([f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head), *rows, ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/probes", help="where the probe runs go (default runs/probes)")
    ap.add_argument("--demo", default="runs/demo", help="the demo's output (its fine-tuned models)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per 'before' cell (default 3)")
    ap.add_argument("--n", type=int, default=32, help="items per cell and seed (default 32)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--md", default="docs/probes_tables.md")
    args = ap.parse_args(argv)
    out, n, seeds = Path(args.out), str(args.n), range(args.seeds)
    # every probe reads the chapters the tiny build held out (the last 12 of each book; what `--model tiny` reads
    # by default), the fine-tuned models too (explicit --data: they are not tiny builds)
    from ropescale.probes.data import tiny_heldout_file

    out.mkdir(parents=True, exist_ok=True)
    held = tiny_heldout_file("tiny")
    common = sid_common = ["--n", n, "--threads", str(args.threads), "--data", str(held)]
    lengths = [512, 1024, 2048, 3072, 4096]
    sid_lengths = [256, 512, 1024, 2048, 4096]
    md = ["# Probe tables on the tiny default", "",
          f"Made by `.venv/bin/python scripts/probe_tables.py --seeds {args.seeds} --n {args.n}` ({args.seeds} seeds "
          f"x {args.n} items per 'before' "
          "cell; a cell is the mean over seeds, with the min-max of the per-seed means in brackets). Held-out text: "
          "the last 12 chapters of each book (never trained on). 'before': the tiny default with the RoPE flags "
          "applied at load time (no training); 'after': the demo's models fine-tuned on recall pairs of "
          "1024-2048 tokens with that method at scale 8, merged.", ""]

    # copy inside the original context
    per = [cells(probe(out / f"copy512-none-s{s}", ["copy", "--model", "tiny", "--rope", "none", "--length", "512",
                                                      "--seed", str(s)] + common), g)
           for g in ("copy", "no-copy") for s in seeds]
    dists = [0, 64, 128, 256]
    md.append(table("copy, N = 512 (inside the context): loss (nats/token) on a 128-token target with a copy of it "
                    "ending d tokens before it, and without", ["", *[f"d={d}" for d in dists]],
                    [row("copy", per[:args.seeds], dists, ".3f"), row("no copy", per[args.seeds:], dists, ".3f")]))

    # suffix identification, by log-likelihood and by PMI (the same items: same seeds and data)
    from ropescale.probes.suffix_id import METRICS, SCORES

    for score in SCORES:
        rows = []
        for m in METHODS:
            name = f"suffix-{m}" if score == "logprob" else f"suffix-{score}-{m}"
            per = [cells(probe(out / f"{name}-s{s}", ["suffix-id", "--variant", "sentence", "--model", "tiny",
                                                      *rope_flags(m), "--lengths", ",".join(map(str, sid_lengths)),
                                                      "--score", score, "--seed", str(s)] + sid_common))
                   for s in seeds]
            rows.append(row(f"tiny, {m}" + ("" if m == "none" else " x8"), per, sid_lengths, ".3f"))
        md.append(table(f"suffix-id (sentence variant, --score {score}): {METRICS[score]}, chance 0.167, vs the "
                        "tokens read (prefix + the 128-token candidate)", ["model", *map(str, sid_lengths)], rows))

    # ppl and copy at 4096 for every method
    rows, crows = [], []
    for m in METHODS:
        per = [cells(probe(out / f"ppl-{m}-s{s}", ["ppl", "--model", "tiny", *rope_flags(m), "--lengths",
                                                    ",".join(map(str, lengths)), "--seed", str(s)] + common))
               for s in seeds]
        rows.append(row(f"tiny, {m}" + ("" if m == "none" else " x8"), per, lengths, ".3f"))
        c = probe(out / f"copy4096-{m}", ["copy", "--model", "tiny", *rope_flags(m), "--length", "4096",
                                          "--distances", "0,256,512,1024,2048,3840", "--seed", "0"] + common)
        nocopy = list(cells(c, "no-copy").values())  # the same target without its copy: one loss, whatever d
        both = {**cells(c, "copy"), "no copy": sum(nocopy) / len(nocopy) if nocopy else None}
        crows.append(row(f"tiny, {m}" + ("" if m == "none" else " x8"), [{k: v for k, v in both.items()
                                                                          if v is not None}],
                         [0, 256, 512, 1024, 2048, 3840, "no copy"], ".2f"))
    after = {m: Path(args.demo) / "train" / (f"tiny-{m}" if m == "none" else f"tiny-{m}-x8") / "merged"
             for m in METHODS}
    for m, d in after.items():
        if (d / "config.json").is_file():
            p = probe(out / f"after-ppl-{m}", ["ppl", "--model", str(d), "--lengths", ",".join(map(str, lengths)),
                                                "--seed", "0"] + common)
            rows.append(row(f"fine-tuned, {m}" + ("" if m == "none" else " x8"), [cells(p)], lengths, ".3f"))
    md.append(table("ppl: loss (nats/token) on the last 10 tokens vs input length N", ["model", *map(str, lengths)],
                    rows))
    md.append(table(f"copy, N = 4096: loss on the 128-token target with its copy d tokens before it, and without a "
                    f"copy (seed 0, {args.n} targets)", ["model", *[f"d={d}" for d in (0, 256, 512, 1024, 2048, 3840)],
                                                         "no copy"], crows))
    Path(args.md).write_text("\n".join(md), encoding="utf-8")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
