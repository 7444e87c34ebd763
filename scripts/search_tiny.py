"""The LongRoPE search on the tiny default, measured (the table in docs/rope_methods.md).

For each seed: ``rope_scaling search`` at x8 for 4,096 tokens (the tiny default: original context 512) on the
chapters its build held out from training, under a time budget; then the loss (nats/token, the last 512 tokens of
4,096-token windows: the search's own fitness measure) of the searched factors (``--rope longrope``), YaRN x8, PI x8
and NTK x8 on held-out windows the search never saw (drawn with another seed, every window overlapping a search
window dropped), and of YaRN's factors run as LongRoPE (the search's seed: LongRoPE's attention factor). The seed is
both the search's and the window draw's.

    .venv/bin/python scripts/search_tiny.py --seeds 0,1,2 --budget 3      # into runs/search_tiny/ (--out DIR)

Each search run directory is resumable (a re-run continues it); the table goes to stdout (``--json``: the rows).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rope_scaling import RopeSpec  # noqa: E402
from rope_scaling.search import SearchSettings  # noqa: E402
from rope_scaling.spec import read_longrope_factors  # noqa: E402
from ropescale.common.settings import make  # noqa: E402
from ropescale.probes.rope_search import STATE, SearchRunSettings, draw_windows, search, window_loss  # noqa: E402

SCALE, TARGET, SCORED = 8.0, 4096, 512
BASELINES = ("yarn", "pi", "ntk")


def search_settings(out: Path, seed: int, budget: float, windows: int) -> SearchRunSettings:
    """The search of one seed on the tiny default's held-out chapters (small population: a CPU budget)."""
    from ropescale.probes.data import tiny_heldout_file

    return make(SearchRunSettings, model="tiny", out=str(out), data=str(tiny_heldout_file("tiny")), scale=SCALE,
                target_len=TARGET, windows=windows, score_tokens=SCORED, window_seed=seed, threads=2,
                search=SearchSettings(population=12, parents=6, mutations=3, crossovers=3, seed=seed,
                                      budget_minutes=budget))


def heldout_windows(s: SearchRunSettings, searched: list[dict], n: int, seed: int):
    """``n`` evaluation windows drawn with another seed, none overlapping a window the search scored on."""
    from transformers import AutoTokenizer

    from ropescale.common.models import resolve_model
    from ropescale.probes.data import load_docs

    tok = AutoTokenizer.from_pretrained(str(resolve_model("tiny")))
    cands = draw_windows(tok, load_docs(s.data), 8 * n, TARGET, SCORED, 10_000 + seed)

    def overlaps(w) -> bool:
        return any(w.doc == o["doc"] and w.start < o["start"] + o["tokens"] and o["start"] < w.start + TARGET
                   for o in searched)

    keep, seen = [], set()
    for w in cands:
        if not overlaps(w) and (w.doc, w.start) not in seen:
            seen.add((w.doc, w.start))
            keep.append(w)
    return keep[:n]


def losses(windows, factors_file: Path, yarn_factors: list[float]) -> dict[str, float]:
    """The held-out loss of the searched factors and of each baseline at x8 (each loaded as a user would), and of
    YaRN's factors run as LongRoPE (its attention factor sqrt(1 + ln s / ln orig) instead of YaRN's 0.1 ln s + 1:
    the search's starting point, which tells the factors' share from the attention factor's)."""
    from rope_scaling.search import factors_of
    from ropescale.probes.common import load_model

    specs = {"searched": RopeSpec("longrope", SCALE, longrope_factors=read_longrope_factors(factors_file))}
    specs.update({m: RopeSpec(m, SCALE) for m in BASELINES})
    specs["yarn-as-longrope"] = RopeSpec("longrope", SCALE, longrope_factors=factors_of(yarn_factors))
    out = {}
    for name, spec in specs.items():
        out[name] = window_loss(load_model("tiny", spec), windows, 1)
        print(f"[search_tiny]   {name}: {out[name]:.4f}", file=sys.stderr, flush=True)
    return out


def one_seed(root: Path, seed: int, budget: float, windows: int, n_eval: int) -> dict:
    s = search_settings(root / f"seed{seed}", seed, budget, windows)
    t = time.monotonic()
    r = search(s, resume=(root / f"seed{seed}" / "run.json").is_file())
    wall = time.monotonic() - t
    info = json.loads((root / f"seed{seed}" / "run.json").read_text(encoding="utf-8"))["info"]
    yarn = json.loads((root / f"seed{seed}" / STATE).read_text(encoding="utf-8"))["init"]["yarn"]
    ev = heldout_windows(s, info["windows"], n_eval, seed)
    print(f"[search_tiny] seed {seed}: {r['evaluations']} evaluations in {r['search_seconds']:.0f} s; "
          f"{len(ev)} held-out windows", file=sys.stderr, flush=True)
    return {"seed": seed, "evaluations": r["evaluations"], "search_seconds": r["search_seconds"],
            "wall_seconds": round(wall, 1), "search_fitness": r["best_fitness"], "seed_fitness": r["seed_fitness"],
            "heldout_windows": [w.record() for w in ev], "heldout": losses(ev, Path(r["factors_file"]), yarn)}


def table(rows: list[dict]) -> str:
    """Held-out loss per seed and method, and the paired differences of the searched factors from YaRN x8 and from
    their own starting point (YaRN's factors run as LongRoPE); mean +- sd over the seeds."""
    cols = ("searched",) + BASELINES + ("yarn-as-longrope",)
    diffs = (("searched - yarn", "yarn"), ("searched - yarn-as-longrope", "yarn-as-longrope"))
    lines = ["| seed | search (s) | evaluations | " + " | ".join(f"{c} x8" for c in cols) + " | "
             + " | ".join(d for d, _ in diffs) + " |", "|---|---|---|" + "---|" * (len(cols) + len(diffs))]
    for r in rows:
        h = r["heldout"]
        lines.append(f"| {r['seed']} | {r['search_seconds']:.0f} | {r['evaluations']} | "
                     + " | ".join(f"{h[c]:.3f}" for c in cols) + " | "
                     + " | ".join(f"{h['searched'] - h[b]:+.3f}" for _, b in diffs) + " |")
    if len(rows) > 1:
        def ms(vals):
            return f"{statistics.mean(vals):+.3f} ± {statistics.stdev(vals):.3f}"
        lines.append("| mean ± sd | | | " + " | ".join(ms([r["heldout"][c] for r in rows]).lstrip("+") for c in cols)
                     + " | " + " | ".join(ms([r["heldout"]["searched"] - r["heldout"][b] for r in rows])
                                          for _, b in diffs) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/search_tiny",
                    help="directory of the search runs and results.json (default: runs/search_tiny)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (search and window draw)")
    ap.add_argument("--budget", type=float, default=3.0, help="minutes per search")
    ap.add_argument("--windows", type=int, default=1, help="fitness windows of the search")
    ap.add_argument("--eval-windows", type=int, default=4, help="held-out windows per seed")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    rows = [one_seed(root, int(s), a.budget, a.windows, a.eval_windows) for s in a.seeds.split(",")]
    (root / "results.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print(json.dumps(rows) if a.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
