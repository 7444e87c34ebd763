"""The LongRoPE search and the attention factor on the tiny default, measured (docs/rope_methods.md).

For each seed: ``rope_scaling search`` at x8 for 4,096 tokens (the tiny default: original context 512) on the
chapters its build held out from training, under a time budget; then the loss (nats/token, the last 512 tokens of
4,096-token windows: the search's own fitness measure) on held-out windows the search never saw (drawn with another
seed, every window overlapping a search window dropped) of, each loaded as a user would:

- the searched factors (``--rope longrope``, LongRoPE's attention factor sqrt(1 + ln s / ln orig) = 1.155) and the
  same factors with YaRN's attention factor (0.1 ln s + 1 = 1.208);
- YaRN x8 (attention factor 1.208), YaRN's factors run as LongRoPE (1.155: the search's starting point), PI x8 and
  NTK x8;
- the attention-factor sweep: YaRN's factors at attention factors ``--sweep`` (``--rope yarn --yarn-mscale A``).

Per method the loss of every window is kept, so a difference is read two ways (``common/stats/tests.py``): over
the seeds (the mean of each seed's difference, its t interval and p, df = seeds - 1: the searched factors differ
per seed) and per window (the paired sign-flip permutation test over all windows of all seeds). The seed is both
the search's and the window draw's.

    .venv/bin/python scripts/search_tiny.py --out runs/search_tiny --seeds 0,1,2,3,4 --budget 3 --eval-windows 8

Each search run directory is resumable (a re-run continues it); the tables go to stdout (``--json``: the rows),
the rows to OUT/results.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rope_scaling import RopeSpec  # noqa: E402
from rope_scaling.formulas import longrope_attention_factor, yarn_attention_factor  # noqa: E402
from rope_scaling.search import SearchSettings  # noqa: E402
from rope_scaling.spec import read_longrope_factors  # noqa: E402
from ropescale.common.settings import make  # noqa: E402
from ropescale.probes.rope_search import STATE, SearchRunSettings, draw_windows, search  # noqa: E402

SCALE, TARGET, SCORED, ORIG = 8.0, 4096, 512, 512
AF_YARN = yarn_attention_factor(SCALE)  # 1.2079
AF_LONGROPE = longrope_attention_factor(SCALE, ORIG)  # 1.1547
SWEEP = (1.0, 1.05, 1.1, 1.15, 1.25, 1.3, 1.4)
YARN = "yarn"  # the row of YaRN at its own attention factor: the sweep's reference (a row label)
MAIN = ("searched", "searched@yarn-af", "yarn", "yarn-as-longrope", "pi", "ntk")
DIFFS = (("searched", "yarn"), ("searched", "yarn-as-longrope"), ("yarn-as-longrope", "yarn"),
         ("searched@yarn-af", "yarn"))


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


def specs(factors_file: Path, yarn_factors: list[float], sweep=SWEEP) -> dict[str, RopeSpec]:
    """Every setting measured: the searched factors (LongRoPE's attention factor, and YaRN's), the baselines,
    YaRN's factors as LongRoPE, and YaRN at each attention factor of the sweep."""
    from rope_scaling.search import factors_of

    searched = read_longrope_factors(factors_file)
    out = {"searched": RopeSpec("longrope", SCALE, longrope_factors=searched),
           "searched@yarn-af": RopeSpec("longrope", SCALE, longrope_factors=factors_of(searched.long_factor,
                                                                                      AF_YARN)),
           YARN: RopeSpec("yarn", SCALE), "pi": RopeSpec("pi", SCALE), "ntk": RopeSpec("ntk", SCALE),
           "yarn-as-longrope": RopeSpec("longrope", SCALE, longrope_factors=factors_of(yarn_factors))}
    out.update({f"yarn af={a:g}": RopeSpec("yarn", SCALE, yarn_mscale=a) for a in sweep})
    return out


def window_losses(loaded, windows) -> list[float]:
    """Each window's mean loss (nats/token) over its scored tokens (the probes' scorer)."""
    import torch

    from ropescale.probes.scorer import score_continuations

    with torch.no_grad():
        scores = score_continuations(loaded.model, [w.prefix for w in windows], [w.target for w in windows],
                                     batch_size=1, pad_id=loaded.pad_id)
    return [sc.loss for sc in scores]


def losses(windows, settings: dict[str, RopeSpec]) -> dict[str, list[float]]:
    """The held-out loss of every window under every setting."""
    from ropescale.probes.common import load_model

    out = {}
    for name, spec in settings.items():
        out[name] = window_losses(load_model("tiny", spec), windows)
        print(f"[search_tiny]   {name}: {sum(out[name]) / len(out[name]):.4f}", file=sys.stderr, flush=True)
    return out


def one_seed(root: Path, seed: int, budget: float, windows: int, n_eval: int, sweep=SWEEP) -> dict:
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
            "heldout_windows": [w.record() for w in ev],
            "heldout_per_window": losses(ev, specs(Path(r["factors_file"]), yarn, sweep))}


# ------------------------------------------------------------------------------------------------ tables
def _mean(v: list[float]) -> float:
    return sum(v) / len(v)


def seed_table(rows: list[dict]) -> str:
    """Held-out loss per seed (the mean of its windows) for the main settings, and the differences read."""
    head = ["seed", "search (s)", "evaluations", *[f"{c} x8" for c in MAIN], *[f"{a} - {b}" for a, b in DIFFS]]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        h = {k: _mean(v) for k, v in r["heldout_per_window"].items()}
        lines.append(f"| {r['seed']} | {r['search_seconds']:.0f} | {r['evaluations']} | "
                     + " | ".join(f"{h[c]:.3f}" for c in MAIN) + " | "
                     + " | ".join(f"{h[a] - h[b]:+.3f}" for a, b in DIFFS) + " |")
    return "\n".join(lines)


def differences(rows: list[dict], pairs=DIFFS) -> list[dict]:
    """Each difference a - b: over seeds (t over the seeds' mean differences; unit: the seed) and per window (paired
    sign-flip over every window of every seed; unit: the window), each kind of test one family with its BH q."""
    from ropescale.common.stats.multiplicity import family
    from ropescale.common.stats.tests import sign_flip, t_over_seeds

    seeds, windows, ts, fs = {}, {}, {}, {}
    for a, b in pairs:
        seeds[a, b] = [_mean(r["heldout_per_window"][a]) - _mean(r["heldout_per_window"][b]) for r in rows]
        windows[a, b] = [x - y for r in rows for x, y in zip(r["heldout_per_window"][a], r["heldout_per_window"][b])]
        ts[a, b], fs[a, b] = t_over_seeds(seeds[a, b]), sign_flip(windows[a, b], unit="window")
    ts, fs = family(ts), family(fs)
    return [{"a": a, "b": b, "seeds": seeds[a, b], "t": ts[a, b].to_dict(), "t_reading": ts[a, b].reading(3),
             "windows": len(windows[a, b]), "sign_flip": fs[a, b].to_dict(),
             "sign_flip_reading": fs[a, b].reading(3)} for a, b in pairs]


def difference_table(diffs: list[dict]) -> str:
    from ropescale.common.stats.tests import p_text

    lines = ["| difference (nats/token) | mean over seeds [95% t interval] | t test over seeds (q: BH over the "
             "column) | windows: paired sign-flip (q: BH over the column) | each seed |", "|---|---|---|---|---|"]
    for d in diffs:
        t, f = d["t"], d["sign_flip"]
        lines.append(f"| {d['a']} - {d['b']} | {t['statistic']:+.4f} [{t['lo']:+.4f}, {t['hi']:+.4f}] | "
                     f"p = {p_text(t['p'])}, q = {p_text(t['q'])} (df {t['df']}): {d['t_reading'].split(' (')[0]} | "
                     f"p = {p_text(f['p'])}, q = {p_text(f['q'])} over {d['windows']} windows | "
                     + " / ".join(f"{x:+.3f}" for x in d["seeds"]) + " |")
    return "\n".join(lines)


def sweep_table(rows: list[dict], sweep=SWEEP) -> str:
    """YaRN's factors at each attention factor: the held-out loss over seeds [t interval], and its difference from
    YaRN's own factor (1.208) with the t test over seeds and its BH q over the sweep (one family)."""
    from ropescale.common.stats.multiplicity import family
    from ropescale.common.stats.tests import p_text, t_over_seeds

    names = sorted([(a, f"yarn af={a:g}") for a in sweep] + [(AF_YARN, YARN)])
    lines = ["| attention factor | setting | loss: mean over seeds [95% t interval] (the seeds' range) | "
             "- yarn (1.208) [95% t interval] | p (t over seeds), q (BH over the sweep) |", "|---|---|---|---|---|"]
    vals = {name: [_mean(r["heldout_per_window"][name]) for r in rows] for _, name in names}
    diffs = family({name: t_over_seeds([v - _mean(r["heldout_per_window"][YARN]) for v, r in zip(vals[name], rows)])
                    for _, name in names if name != YARN})
    for a, name in names:
        t = t_over_seeds(vals[name])
        d = diffs.get(name)
        dd = "-" if d is None else f"{d.statistic:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}]"
        rng = "" if "range" not in t.extra else f" ({t.extra['range'][0]:.4f}-{t.extra['range'][1]:.4f})"
        lines.append(f"| {a:.3f} | {name} | {t.statistic:.4f} [{t.lo:.4f}, {t.hi:.4f}]{rng} | {dd} | "
                     f"{'-' if d is None else f'{p_text(d.p)}, q = {p_text(d.q)}'} |")
    return "\n".join(lines)


def table(rows: list[dict], sweep=SWEEP) -> str:
    return "\n\n".join([seed_table(rows), difference_table(differences(rows)), sweep_table(rows, sweep)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/search_tiny",
                    help="directory of the search runs and results.json (default: runs/search_tiny)")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (search and window draw)")
    ap.add_argument("--budget", type=float, default=3.0, help="minutes per search")
    ap.add_argument("--windows", type=int, default=1, help="fitness windows of the search")
    ap.add_argument("--eval-windows", type=int, default=8, help="held-out windows per seed")
    ap.add_argument("--sweep", default=",".join(f"{a:g}" for a in SWEEP),
                    help="YaRN attention factors to measure besides YaRN's own (comma-separated)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    sweep = tuple(float(x) for x in a.sweep.split(",") if x)
    rows = [one_seed(root, int(s), a.budget, a.windows, a.eval_windows, sweep) for s in a.seeds.split(",")]
    from ropescale.common.io import write_text_atomic

    write_text_atomic(root / "results.json", json.dumps(rows, indent=1))
    print(json.dumps(rows) if a.json else table(rows, sweep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
