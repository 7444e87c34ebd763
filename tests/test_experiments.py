"""Experiments (ropescale/experiments, docs/experiments.md): every experiments/*.yaml file's --quick miniature runs
end to end (found by glob: a new file is covered on arrival) and a second call runs nothing; the readings of made-up
runs against scipy (t intervals, t tests over seeds, the exact sign-flip p by enumeration, BH q); the file's errors
name the file and line; the reading section survives a re-run."""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted((ROOT / "experiments").glob("*.yaml"))


def test_there_are_experiment_files():
    assert FILES, "experiments/*.yaml"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_quick_miniature(path, tmp_path, capsys, one_thread):
    from ropescale.experiments import __main__ as cli
    from ropescale.experiments import spec
    from ropescale.experiments.runner import lengths_of, run_dir

    exp = spec.load(path, quick=True)
    out = tmp_path / "w"
    assert cli.main(["run", str(path), "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    page = (out / f"{exp.name}.md").read_text(encoding="utf-8")
    assert "| row |" in page and page.count(" [") >= 1 and "Made by `" in page  # a table with intervals
    assert printed.out.strip() and printed.out.strip() in page  # the tables on stdout are the page's
    assert "arm " in printed.err and "seed" in printed.err  # progress on stderr
    record = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert record["kind"] == "experiment" and record["status"] == "complete" and record["settings"]["quick"] is True
    runs = [run_dir(out, a, s, t) for a, arm in exp.arms.items() if arm.reads is None
            for s in exp.seeds for t in lengths_of(exp, a)]
    stamps = {r: (r / "run.json").stat().st_mtime_ns for r in runs}
    assert cli.main(["run", str(path), "--quick", "--out", str(out)]) == 0  # resumable: nothing runs again
    again = capsys.readouterr()
    assert f"{len(runs)} complete already, 0 to run" in again.err
    assert {r: (r / "run.json").stat().st_mtime_ns for r in runs} == stamps
    assert again.out == printed.out
    _check_cells_against_scipy(exp, out)


def _check_cells_against_scipy(exp, out: Path):
    """Each cell of every score, every arm of its row scoring the same samples: the mean and scipy's t interval of
    the per-sample means over the row's arms (a proportion's cell: k of n and scipy's Wilson interval); a score whose
    records carry their length (an arm run once a seed) read at each length its records hold."""
    import scipy.stats

    from ropescale.experiments.collect import scores
    from ropescale.experiments.runner import run_dir

    res = json.loads((out / "results.json").read_text(encoding="utf-8"))
    checked = 0
    for sc in exp.scores.values():
        for s in exp.seeds:
            for series, row in res["scores"][sc.key]["seeds"][str(s)]["cells"].items():
                for col, c in row.items():
                    t = int(col[len(sc.column):])
                    by_arm = []
                    for a in exp.members(series):
                        d = run_dir(out, exp.arms[a].reads or a, s, t if exp.arms[a].per_length else None)
                        got = scores(d / sc.file, exp.arms[a].field_of(sc), sc.id, sc.kind, sc.length,
                                     exp.arms[a].group, sc.partial)
                        by_arm.append(got if sc.length is None else got[t])
                    if any(set(g) != set(by_arm[0]) for g in by_arm):
                        continue
                    if sc.kind == "proportion":
                        x = [v for g in by_arm for v in g.values()]
                        k = round(sum(x) / 100)
                        ci = scipy.stats.binomtest(k, len(x)).proportion_ci(method="wilson")
                        assert c["n"] == len(x) and math.isclose(c["mean"], 100 * k / len(x), abs_tol=1e-9)
                        assert math.isclose(c["lo"], 100 * ci.low, abs_tol=1e-6)
                        assert math.isclose(c["hi"], 100 * ci.high, abs_tol=1e-6)
                        checked += 1
                        continue
                    x = [sum(g[i] for g in by_arm) / len(by_arm) for i in by_arm[0]]
                    assert c["n"] == len(x) and math.isclose(c["mean"], sum(x) / len(x), rel_tol=1e-9, abs_tol=1e-9)
                    if len(x) >= 2 and len(set(x)) > 1:
                        lo, hi = scipy.stats.t.interval(0.95, len(x) - 1, loc=sum(x) / len(x),
                                                        scale=scipy.stats.sem(x))
                        rule = "t"
                        if sc.range is not None:  # the score's range clips the t interval (Mandelkern 2002)
                            clipped = (max(lo, sc.range[0]), min(hi, sc.range[1]))
                            rule = "t (clipped)" if clipped != (lo, hi) else "t"
                            lo, hi = clipped
                        assert c["rule"] == rule
                        assert math.isclose(c["lo"], lo, rel_tol=1e-6) and math.isclose(c["hi"], hi, rel_tol=1e-6)
                    checked += 1
    assert checked, "no cell checked"


# ------------------------------------------------------------------------------------------------ made-up runs
MADE_UP = """name: made_up
title: Made-up runs
seeds: [0, 1, 2]
lengths: [64, 128]
arms:
  a: [probes, ppl, --model, tiny, --lengths, "{length}"]
  b: [probes, ppl, --model, tiny, --lengths, "{length}", --rope, ntk, --scale, 2]
  c: [probes, ppl, --model, tiny, --lengths, "{length}", --rope, yarn, --scale, 2]
pools:
  bc: {label: "b and c", arms: [b, c]}
score: {file: scores.jsonl, field: score}
table: [a, b, c, bc]
families:
  "vs a": [[b, a], [c, a]]
  "b - c": [[b, c]]
"""


def _made_up(tmp_path: Path, values) -> tuple[Path, Path]:
    """An experiment file and a work dir holding complete runs with the scores ``values(arm, seed, length)``."""
    from ropescale.experiments.runner import run_dir

    f = tmp_path / "made_up.yaml"
    f.write_text(MADE_UP, encoding="utf-8")
    work = tmp_path / "work"
    for arm in "abc":
        for s in (0, 1, 2):
            for t in (64, 128):
                d = run_dir(work, arm, s, t)
                d.mkdir(parents=True)
                (d / "run.json").write_text(json.dumps({"kind": "probe", "status": "complete", "seconds": 1.5}))
                (d / "scores.jsonl").write_text("".join(json.dumps({"id": i, "score": v}) + "\n"
                                                        for i, v in enumerate(values(arm, s, t))))
    return f, work


def _values(arm, s, t):
    import numpy as np

    rng = np.random.default_rng(100 * s + t + ord(arm))
    return list(np.round(rng.normal({"a": 20, "b": 30, "c": 25}[arm], 4, size=5), 3))


def test_readings_of_made_up_runs_against_scipy(tmp_path, capsys):
    import numpy as np
    import scipy.stats

    from ropescale.experiments import __main__ as cli

    f, work = _made_up(tmp_path, _values)
    assert cli.main(["report", str(f), "--out", str(work)]) == 0
    res = json.loads((work / "results.json").read_text(encoding="utf-8"))["scores"]["score"]
    # a cell of 5 samples: the t interval (scipy)
    x = _values("b", 1, 128)
    c = res["seeds"]["1"]["cells"]["b"]["T128"]
    lo, hi = scipy.stats.t.interval(0.95, 4, loc=np.mean(x), scale=scipy.stats.sem(x))
    assert c["rule"] == "t" and math.isclose(c["lo"], lo, rel_tol=1e-6) and math.isclose(c["hi"], hi, rel_tol=1e-6)
    # the pool: each prompt's mean averaged, n the distinct samples
    c = res["seeds"]["0"]["cells"]["bc"]["T64"]
    assert c["n"] == 5 and math.isclose(c["mean"], (np.mean(_values("b", 0, 64)) + np.mean(_values("c", 0, 64))) / 2)
    # over seeds: the t interval over the seeds' cells
    per_seed = [np.mean(_values("a", s, 64)) for s in range(3)]
    c = res["pooled"]["cells"]["a"]["T64"]
    lo, hi = scipy.stats.t.interval(0.95, 2, loc=np.mean(per_seed), scale=scipy.stats.sem(per_seed))
    assert c["unit"] == "seed" and math.isclose(c["lo"], lo, rel_tol=1e-6) and math.isclose(c["hi"], hi, rel_tol=1e-6)
    assert c["range"] == [min(per_seed), max(per_seed)]
    # one seed's family: the exact two-sided sign-flip p by enumeration, BH q over the family's 4 tests (scipy)
    fam = res["seeds"]["2"]["families"]["vs a"]
    ps = []
    for x in fam:
        d = np.array(_values(x["a"], 2, x["length"])) - np.array(_values(x["b"], 2, x["length"]))
        null = [abs(np.mean(np.array(sg) * d)) for sg in itertools.product((-1, 1), repeat=len(d))]
        p = np.mean(np.array(null) >= abs(d.mean()) - 1e-12)
        assert math.isclose(x["p"], p) and x["unit"] == "sample" and x["min_p"] == 2 / 2 ** 5
        ps.append(p)
    assert len(fam) == 4 and all(x["family"] == 4 for x in fam)
    assert np.allclose([x["q"] for x in fam], scipy.stats.false_discovery_control(ps))
    # over seeds: the t test of the seeds' differences (scipy's ttest_1samp), BH within the family
    fam = res["pooled"]["families"]["vs a"]
    ps = []
    for x in fam:
        diffs = [np.mean(_values(x["a"], s, x["length"])) - np.mean(_values(x["b"], s, x["length"])) for s in range(3)]
        tt = scipy.stats.ttest_1samp(diffs, 0.0)
        assert math.isclose(x["p"], tt.pvalue, rel_tol=1e-6) and x["unit"] == "seed"
        ps.append(tt.pvalue)
    assert np.allclose([x["q"] for x in fam], scipy.stats.false_discovery_control(ps))
    assert res["pooled"]["families"]["b - c"][0]["family"] == 2  # a family of its own: 1 pair x 2 lengths
    page = (work / "made_up.md").read_text(encoding="utf-8")
    assert "Over seeds 0, 1, 2" in page and "q: Benjamini-Hochberg over this family's 4 tests" in page
    # the family's count at p < 0.05 against chance: P(X >= k), X ~ Binomial(4, 0.05) (scipy)
    from ropescale.common.stats.tests import p_text

    k = sum(p < 0.05 for p in ps)
    assert k >= 1 and f"{k} of 4 at p < 0.05 (0.2 by chance; binomial p = " \
        f"{p_text(scipy.stats.binom.sf(k - 1, 4, 0.05))}: some effect" in page
    assert "wall time" in page and "27 s in the runs' run.json" in page  # 18 runs x 1.5 s
    capsys.readouterr()


def test_the_reading_survives_a_rerun(tmp_path, capsys):
    from ropescale.experiments import __main__ as cli
    from ropescale.experiments.page import READING

    f, work = _made_up(tmp_path, _values)
    assert cli.main(["report", str(f), "--out", str(work)]) == 0
    page = work / "made_up.md"
    text = page.read_text(encoding="utf-8")
    assert text.count(READING) == 1
    page.write_text(text + "- b is ahead of a at both lengths.\n", encoding="utf-8")
    assert cli.main(["report", str(f), "--out", str(work), "--only", "a,b"]) == 0
    text = page.read_text(encoding="utf-8")
    assert text.endswith(READING + "\n- b is ahead of a at both lengths.\n")
    assert "| b and c (bc) |" in text and "| c (c) |" in text  # --only picks what runs; the page reads every arm
    assert cli.main(["report", str(f), "--out", str(work), "--seeds", "0,2"]) == 0
    text = page.read_text(encoding="utf-8")
    assert "### Over seeds 0, 2 (the seed the unit)" in text and "### Seed 1" not in text
    assert "2 seeds a cell (the unit; n = 10 samples in all)" in text
    capsys.readouterr()


@pytest.mark.parametrize("bad, where, what", [
    ("  d: [nosuch, x]\n", 9, "'nosuch' is not a ropescale command"),
    ("  d: [eval, generate, --out, x]\n", 9, "--out is the runner's"),
    ("  d: [eval, generate, --data, '{nope}']\n", 9, "unknown placeholder {nope}"),
])
def test_file_errors_name_the_file_and_line(tmp_path, capsys, bad, where, what):
    from ropescale.experiments import __main__ as cli

    f = tmp_path / "bad.yaml"
    lines = MADE_UP.splitlines(keepends=True)
    f.write_text("".join(lines[:8] + [bad] + lines[8:]), encoding="utf-8")
    assert cli.main(["report", str(f), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {f}:{where}: ") and what in err[0], err


def test_unknown_key_and_unknown_arm(tmp_path, capsys):
    from ropescale.experiments import __main__ as cli

    f = tmp_path / "bad.yaml"
    f.write_text(MADE_UP + "colour: blue\n", encoding="utf-8")
    assert cli.main(["report", str(f), "--out", str(tmp_path)]) == 2
    assert f"{f}:{MADE_UP.count(chr(10)) + 1}: unknown key 'colour'" in capsys.readouterr().err
    good, work = _made_up(tmp_path, _values)
    assert cli.main(["report", str(good), "--out", str(work), "--only", "z"]) == 2
    assert "--only: 'z' is not an arm of this experiment (a, b, c)" in capsys.readouterr().err


def test_a_proportion_cell_is_wilson_never_zero_width(tmp_path, capsys):
    import scipy.stats

    from ropescale.experiments import __main__ as cli

    def hits(arm, s, t):  # a: 0 of 9 at T64, b: 4 of 9
        return [0] * 9 if arm == "a" and t == 64 else [1] * 4 + [0] * 5

    f, work = _made_up(tmp_path, hits)
    f.write_text(MADE_UP.replace("field: score}", "field: score, kind: proportion}"), encoding="utf-8")
    assert cli.main(["report", str(f), "--out", str(work)]) == 0
    res = json.loads((work / "results.json").read_text(encoding="utf-8"))["scores"]["score"]
    for arm, t, k in (("a", 64, 0), ("b", 64, 4)):
        c = res["seeds"]["0"]["cells"][arm][f"T{t}"]
        ci = scipy.stats.binomtest(k, 9).proportion_ci(method="wilson")
        assert c["rule"] == "Wilson" and c["unit"] == "trial" and c["n"] == 9
        assert math.isclose(c["mean"], 100 * k / 9)
        assert math.isclose(c["lo"], 100 * ci.low, abs_tol=1e-9) and math.isclose(c["hi"], 100 * ci.high, rel_tol=1e-9)
    assert res["seeds"]["0"]["cells"]["a"]["T64"]["hi"] > 25  # 0 of 9: [0, 29.9], never [0, 0]
    assert "| a (a) | 0.0 [0.0, 29.9] |" in (work / "made_up.md").read_text(encoding="utf-8")
    (work / "runs/a/s0/T64/scores.jsonl").write_text('{"id": 0, "score": 0.5}\n')
    assert cli.main(["report", str(f), "--out", str(work)]) == 2
    assert "record 1: score is 0.5; a proportion's score is 0 or 1" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ several scores
SEVERAL = """name: several
title: Several scores
seeds: [0, 1]
lengths: [64, 128]
scores:
  rouge: {name: ROUGE-L, file: scores.jsonl, field: rouge}
  exact: {name: exact recall, file: scores.jsonl, field: exact, kind: proportion}
  loss: {name: loss by position, file: loss.jsonl, field: loss, id: window, length: bucket, unit: window,
         column: "pos "}
arms:
  a: {run: [eval, generate, --max-new-tokens, "{length}"], scores: [rouge, exact], facts: {coverage: train.coverage}}
  b: {run: [eval, generate, --max-new-tokens, "{length}", --rope, ntk], scores: [rouge, exact]}
  pa: {run: [probes, ppl, --model, tiny], scores: [loss], label: "position loss, base"}
  pb: {run: [probes, ppl, --model, tiny, --rope, ntk, --scale, 2], scores: [loss]}
table: [a, b, pa, pb]
families:
  "a - b": [[a, b]]
  "exact a - b": {score: exact, pairs: [[a, b]]}
  "rise": {score: loss, rows: [pa, pb], baseline: [0, 256]}
  "MSE": {score: rouge, mse: [[a, b]]}
"""
BUCKETS = (0, 128, 256, 384)


def _loss(arm, s, w, k):
    import numpy as np

    rng = np.random.default_rng(1000 * s + 10 * w + k + (7 if arm == "pb" else 0))
    return float(np.round(2.0 + (0.3 * k if arm == "pb" else 0.05 * k) + rng.normal(0, 0.2), 4))


def _several(tmp_path: Path) -> tuple[Path, Path]:
    """Runs of two per-length eval arms (ROUGE-L and exact recall in one file) and two probe arms run once a seed
    whose records carry their bucket (4 windows x 4 buckets)."""
    from ropescale.experiments.runner import run_dir

    f = tmp_path / "several.yaml"
    f.write_text(SEVERAL, encoding="utf-8")
    work = tmp_path / "work"
    for s in (0, 1):
        for arm in ("a", "b"):
            for t in (64, 128):
                d = run_dir(work, arm, s, t)
                d.mkdir(parents=True)
                (d / "run.json").write_text(json.dumps({"status": "complete", "seconds": 1.0,
                                                        "train": {"coverage": 0.5 + s / 4}}))
                vals = _values(arm, s, t)
                (d / "scores.jsonl").write_text("".join(json.dumps({"id": i, "rouge": v, "exact": int(v > 25)}) + "\n"
                                                        for i, v in enumerate(vals)))
        for arm in ("pa", "pb"):
            d = run_dir(work, arm, s, None)
            d.mkdir(parents=True)
            (d / "run.json").write_text(json.dumps({"status": "complete", "seconds": 2.0}))
            (d / "loss.jsonl").write_text("".join(
                json.dumps({"window": f"w{w}", "bucket": b, "loss": _loss(arm, s, w, k)}) + "\n"
                for w in range(4) for k, b in enumerate(BUCKETS)))
    return f, work


def test_several_scores_per_seed_arms_units_facts_and_baselines(tmp_path, capsys):
    import numpy as np
    import scipy.stats

    from ropescale.experiments import __main__ as cli
    from ropescale.experiments import spec

    f, work = _several(tmp_path)
    exp = spec.load(f)
    assert exp.arms["a"].per_length and not exp.arms["pa"].per_length
    assert cli.main(["report", str(f), "--out", str(work)]) == 0
    res = json.loads((work / "results.json").read_text(encoding="utf-8"))
    assert list(res["scores"]) == ["rouge", "exact", "loss"]
    rouge, exact, loss = (res["scores"][k] for k in ("rouge", "exact", "loss"))
    assert set(rouge["seeds"]["0"]["cells"]) == {"a", "b"} and set(loss["seeds"]["0"]["cells"]) == {"pa", "pb"}
    # a proportion read from the same file: k of n with Wilson's interval (scipy)
    k = sum(v > 25 for v in _values("b", 1, 64))
    ci = scipy.stats.binomtest(k, 5).proportion_ci(method="wilson")
    c = exact["seeds"]["1"]["cells"]["b"]["T64"]
    assert c["unit"] == "trial" and math.isclose(c["lo"], 100 * ci.low, abs_tol=1e-9)
    # the per-seed arm: columns are the records' buckets, the window the unit of cells and tests
    x = [_loss("pb", 0, w, 2) for w in range(4)]
    c = loss["seeds"]["0"]["cells"]["pb"]["pos 256"]
    lo, hi = scipy.stats.t.interval(0.95, 3, loc=np.mean(x), scale=scipy.stats.sem(x))
    assert c["unit"] == "window" and c["n"] == 4 and math.isclose(c["lo"], lo, rel_tol=1e-6)
    # each row against its own mean over buckets 0 and 128 on the same windows: the exact sign-flip p, BH over
    # the family's 2 rows x 2 buckets outside it (scipy), the unit and smallest p 2 / 2^4 named
    fam = loss["seeds"]["0"]["families"]["rise"]
    assert len(fam) == 4 and {x["b"] for x in fam} == {"pa[0:256]", "pb[0:256]"}  # buckets 0, 128: the baseline
    assert {x["length"] for x in fam} == {256, 384} and all(x["family"] == 4 for x in fam)
    ps = []
    for x in fam:
        arm, kb = x["a"], BUCKETS.index(x["length"])
        d = np.array([_loss(arm, 0, w, kb) - (_loss(arm, 0, w, 0) + _loss(arm, 0, w, 1)) / 2 for w in range(4)])
        null = [abs(np.mean(np.array(sg) * d)) for sg in itertools.product((-1, 1), repeat=4)]
        assert math.isclose(x["p"], np.mean(np.array(null) >= abs(d.mean()) - 1e-12))
        assert math.isclose(x["statistic"], d.mean()) and x["unit"] == "window" and x["min_p"] == 2 / 16
        ps.append(x["p"])
    assert np.allclose([x["q"] for x in fam], scipy.stats.false_discovery_control(ps))
    # over the two seeds: the t test of the seeds' rises (scipy)
    x = next(x for x in loss["pooled"]["families"]["rise"] if x["a"] == "pb" and x["length"] == 384)
    rises = [np.mean([_loss("pb", s, w, 3) - (_loss("pb", s, w, 0) + _loss("pb", s, w, 1)) / 2 for w in range(4)])
             for s in (0, 1)]
    assert x["unit"] == "seed" and math.isclose(x["p"], scipy.stats.ttest_1samp(rises, 0).pvalue, rel_tol=1e-6)
    # one family a score: the exact family reads its own tests
    assert set(exact["seeds"]["0"]["families"]) == {"exact a - b"} and "rise" not in rouge["seeds"]["0"]["families"]
    # a row's MSE(P-IE vs P-IB) over its lengths, one test a seed: the exact p over every sample's label flip
    # (2^10 sign vectors, by enumeration), P(MSE >= 5) under that null
    (x,) = rouge["seeds"]["1"]["families"]["MSE"]
    d = [np.array(_values("a", 1, t)) - np.array(_values("b", 1, t)) for t in (64, 128)]
    obs = np.mean([di.mean() ** 2 for di in d])
    null = np.array([np.mean([(np.array(sg[5 * k:5 * k + 5]) * di).mean() ** 2 for k, di in enumerate(d)])
                     for sg in itertools.product((-1, 1), repeat=10)])
    assert math.isclose(x["statistic"], obs) and math.isclose(x["p"], np.mean(null >= obs - 1e-9))
    assert math.isclose(x["p_red"], np.mean(null >= 5.0)) and x["length"] is None
    assert "MSE" not in rouge["pooled"]["families"]
    # a row's facts from its arms' run.json, beside the cells
    assert res["facts"] == {"a": {"coverage": [0.5, 0.75]}}
    page = (work / "several.md").read_text(encoding="utf-8")
    assert "| row | T64 | T128 | coverage |" in page and "| 0.5 / 0.75 |" in page
    assert "| row | pos 0 | pos 128 | pos 256 | pos 384 |" in page
    assert "unit: window; smallest attainable p 0.12" in page and "pb - pb[0:256]" in page
    assert "### Seed 0: exact recall, mean [95% interval]" in page
    assert "| row | MSE | null mean | p | q | P(MSE >= 5) |" in page and "| a vs b |" in page
    capsys.readouterr()


def test_a_per_seed_arm_runs_once_a_seed(tmp_path, capsys, monkeypatch):
    """The runner calls an arm that names no {length} once a seed (its run directory WORK/runs/ARM/sSEED), one
    that names a prepared file made per length once per length, one with lengths: at those only."""
    from ropescale.experiments import __main__ as cli
    from ropescale.experiments import runner

    f = tmp_path / "x.yaml"
    f.write_text("""name: x
seeds: [0]
lengths: [64, 128]
prepare:
  data: {out: "d_T{length}.txt", run: [data, recall, --out, "{out}"]}
  ft: {out: "ft", run: [finetune, --out, "{out}"]}
scores:
  s: {file: s.jsonl, field: v, length: at}
arms:
  once: [probes, ppl]
  each: [probes, ppl, --data, "{data}", --model, "{ft}"]
  first: {run: [probes, copy, --data, "{data}"], lengths: [64]}
""", encoding="utf-8")
    calls = []

    def fake(argv, where):
        calls.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        if argv[0] == "data":
            out.write_text("x")
            return
        if argv[0] == "finetune":  # a fine-tune's run.json says done when it finished
            out.mkdir(parents=True)
            (out / "run.json").write_text('{"status": "done"}')
            return
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.json").write_text('{"status": "complete"}')
        (out / "s.jsonl").write_text('{"id": 0, "v": 1.0, "at": 64}\n{"id": 0, "v": 2.0, "at": 128}\n')

    monkeypatch.setattr(runner, "call", fake)
    assert cli.main(["run", str(f), "--out", str(tmp_path / "w")]) == 0
    arms = [c for c in calls if c[0] == "probes"]
    assert len(arms) == 4 and sum(c[1] == "ppl" and "--data" in c for c in arms) == 2
    assert sum(c[0] == "data" for c in calls) == 2  # the prepared file of each length, made once
    assert sum(c[0] == "finetune" for c in calls) == 1  # a prepared run directory: made once, for both lengths
    assert (tmp_path / "w/runs/once/s0/s.jsonl").is_file() and (tmp_path / "w/runs/each/s0/T128/s.jsonl").is_file()
    assert [Path(c[c.index("--data") + 1]).name for c in arms if c[1] == "copy"] == ["d_T64.txt"]  # lengths: [64]
    assert "4 runs, 0 complete already, 4 to run" in capsys.readouterr().err


def test_a_fine_tune_runs_in_a_process_of_its_own(monkeypatch, capsys):
    """DeepSpeed keeps its process groups in module state: a second fine-tune in one process fails, so the runner
    starts `python -m ropescale finetune ...` for each (a merge, and every other tool, in process)."""
    import subprocess
    import sys

    from ropescale.experiments import runner

    ran = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: ran.append(argv) or subprocess.CompletedProcess(
        argv, 3, stdout="[finetune] boom\n"))
    with pytest.raises(Exception, match=r"prepare ft: `ropescale finetune --rope ntk` failed \(exit 3\)"):
        runner.call(["finetune", "--rope", "ntk"], "prepare ft")
    assert ran == [[sys.executable, "-m", "ropescale", "finetune", "--rope", "ntk"]]
    assert "[finetune] boom" in capsys.readouterr().err  # a captured stderr gets the child's output
    assert not runner.own_process(["finetune", "merge", "--run", "x"]) and not runner.own_process(["eval", "score"])
