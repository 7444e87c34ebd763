"""The experiment runner's reading and resume rules (ropescale/experiments, docs/experiments.md): --only picks what
runs while the page reads every arm's runs (an arm without runs named, never dropped); a run or prepared file made
with other flags is refused or, with --rerun-changed, moved aside and made again; a --quick work directory is not a
full one; a baseline family tests only the lengths outside its baseline (BH over those); a pooled proportion row
counts each sample once; a repeated id is an error; unit: bucket is refused; a score's range bounds its interval;
seeds that agree exactly are no test; an arm reads only its group of a run's records; a run not finished is not
read. Numbers against scipy / the definitions written out here."""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

MADE_UP = """name: made_up
title: Made-up runs
seeds: [0, 1]
lengths: [64, 128, 256]
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
"""


def vals(arm, s, t):
    import numpy as np

    rng = np.random.default_rng(100 * s + t + ord(arm))
    return [float(x) for x in np.round(rng.normal({"a": 20, "b": 30, "c": 25}[arm], 4, size=5), 3)]


def made_up(tmp_path: Path, values=vals, text: str = MADE_UP, arms="abc") -> tuple[Path, Path]:
    """An experiment file and a work dir holding complete runs of ``arms`` with the scores ``values(arm, s, t)``."""
    from ropescale.experiments.runner import run_dir

    f = tmp_path / "made_up.yaml"
    f.write_text(text, encoding="utf-8")
    work = tmp_path / "work"
    for arm in arms:
        for s in (0, 1):
            for t in (64, 128, 256):
                d = run_dir(work, arm, s, t)
                d.mkdir(parents=True)
                (d / "run.json").write_text(json.dumps({"kind": "probe", "status": "complete", "seconds": 1.0}))
                (d / "scores.jsonl").write_text("".join(json.dumps({"id": i, "score": v}) + "\n"
                                                        for i, v in enumerate(values(arm, s, t))))
    return f, work


def report(f: Path, work: Path, *more) -> tuple[int, dict | None]:
    from ropescale.experiments import __main__ as cli

    rc = cli.main(["report", str(f), "--out", str(work), *more])
    res = work / "results.json"
    return rc, json.loads(res.read_text(encoding="utf-8"))["scores"] if rc == 0 else None


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_only_picks_what_runs_the_page_reads_every_arm(tmp_path, capsys):
    f, work = made_up(tmp_path, arms="ab")  # c never ran: its row and the pool bc are named "not run"
    rc, res = report(f, work, "--only", "a")
    assert rc == 0 and set(res["score"]["seeds"]["0"]["cells"]) == {"a", "b"}
    page = (work / "made_up.md").read_text(encoding="utf-8")
    assert "| b (b) |" in page and "not run (no runs of every arm in this work directory): c, bc" in page
    assert [x["b"] for x in res["score"]["seeds"]["0"]["families"]["vs a"]] == ["a"] * 3  # b - a only, 3 lengths
    capsys.readouterr()


def fake_call(log: list):
    """A stand-in for runner.call: a prepare step writes its --out file; an arm's run writes run.json and scores."""
    def call(argv, where):
        log.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        if where.startswith("prepare"):
            out.write_text("prepared\n", encoding="utf-8")
            return
        (out / "run.json").write_text(json.dumps({"kind": "probe", "status": "complete", "seconds": 0.5}))
        (out / "scores.jsonl").write_text("".join(json.dumps({"id": i, "score": float(i + len(log))}) + "\n"
                                                  for i in range(3)))
    return call


RUNNING = """name: running
title: Runs
seeds: [0]
lengths: [64]
vars: {n: 8}
prepare:
  data: {out: "data/s{seed}.jsonl", run: [data, recall, --tokenizer, tiny, --n, "{n}", --out, "{out}"]}
arms:
  a: [probes, ppl, --model, tiny, --lengths, "{length}", --data, "{data}"]
  b: [probes, ppl, --model, tiny, --lengths, "{length}", --rope, ntk, --scale, 2]
score: {file: scores.jsonl, field: score}
quick: {seeds: [0]}
"""


def test_a_work_dir_in_the_repository_keeps_what_its_page_needs(tmp_path, capsys, monkeypatch):
    """``work:`` puts a full run's work directory in the repository (a quick's stays in runs/); what git keeps of it
    by experiments/real_model/work/.gitignore (the records, not the forwards, the training set, checkpoints,
    models or locks) re-makes the same results on a fresh clone."""
    import shutil
    import subprocess

    from ropescale.common import paths
    from ropescale.experiments import __main__ as cli
    from ropescale.experiments import runner, spec

    repo = tmp_path / "repo"
    monkeypatch.setattr(paths, "REPO_ROOT", repo)
    f = tmp_path / "running.yaml"
    f.write_text(RUNNING + "work: experiments/running/work\n", encoding="utf-8")
    work = repo / "experiments" / "running" / "work"
    assert runner.work_dir(spec.load(f), runner.ExperimentSettings()) == work
    assert runner.work_dir(spec.load(f, quick=True), runner.ExperimentSettings()) == \
        repo / "runs" / "experiments" / "running-quick"
    monkeypatch.setattr(runner, "call", fake_call([]))
    assert cli.main(["run", str(f)]) == 0
    (work / "forwards").mkdir()  # what a real run leaves besides its records
    (work / "forwards" / "w0.pt").write_bytes(b"0" * 64)
    ft = work / "train" / "ft-s0"
    (ft / "checkpoint-10").mkdir(parents=True)
    for name in ("checkpoint-10/adapter_model.safetensors", "adapter_model.safetensors", "merged", ".lock",
                 "run.json", "train_log.jsonl", "config.json"):
        (ft / name).write_text("{}\n", encoding="utf-8")
    (work / "train" / "ft-s0.argv.json").write_text("{}\n", encoding="utf-8")
    shutil.copy(Path(__file__).resolve().parents[1] / "experiments" / "real_model" / "work" / ".gitignore", work)
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    kept = set(subprocess.run(git + ["ls-files"], check=True, capture_output=True, text=True).stdout.split())
    assert {"train/ft-s0/run.json", "train/ft-s0/train_log.jsonl", "train/ft-s0.argv.json", "data/s0.jsonl.argv.json",
            "runs/a/s0/T64/scores.jsonl", "runs/a/s0/T64/run.json", "runs/a/s0/T64/argv.json", "run.json"} <= kept
    assert not [k for k in kept if k.startswith(("forwards/", "data/s0.jsonl", "train/ft-s0/checkpoint"))
                and not k.endswith(".argv.json") or k.endswith((".lock", ".safetensors", "merged"))], kept
    fresh = tmp_path / "fresh"
    for k in kept:
        (fresh / k).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(work / k, fresh / k)
    assert report(f, fresh) == report(f, work)
    capsys.readouterr()


def test_a_run_made_with_other_flags_is_refused_or_rerun(tmp_path, capsys, monkeypatch):
    from ropescale.experiments import __main__ as cli
    from ropescale.experiments import runner

    log: list = []
    monkeypatch.setattr(runner, "call", fake_call(log))
    f, work = tmp_path / "running.yaml", tmp_path / "work"
    f.write_text(RUNNING, encoding="utf-8")
    assert cli.main(["run", str(f), "--out", str(work)]) == 0
    assert len(log) == 3  # the prepared file, then a and b
    rec = json.loads((work / "runs/b/s0/T64/argv.json").read_text(encoding="utf-8"))
    assert rec["argv"] == ["probes", "ppl", "--model", "tiny", "--lengths", "64", "--rope", "ntk", "--scale", "2"]
    assert json.loads((work / "data/s0.jsonl.argv.json").read_text(encoding="utf-8"))["argv"][-1] == \
        "{work}/data/s0.jsonl"
    assert cli.main(["run", str(f), "--out", str(work)]) == 0 and len(log) == 3  # nothing changed: nothing runs
    capsys.readouterr()
    f.write_text(RUNNING.replace("--scale, 2]", "--scale, 4]"), encoding="utf-8")  # b's flags edited
    assert cli.main(["run", str(f), "--out", str(work)]) == 2
    err = one_error(capsys)
    assert f"arm b: {work / 'runs/b/s0/T64'} was made with other flags (2 -> 4): --rerun-changed" in err, err
    assert cli.main(["report", str(f), "--out", str(work)]) == 2 and "arm b:" in one_error(capsys)
    assert cli.main(["run", str(f), "--out", str(work), "--rerun-changed"]) == 0 and len(log) == 4
    assert (work / "runs/b/s0/T64.changed-1/argv.json").is_file()  # the old run kept aside, b run again
    assert json.loads((work / "runs/b/s0/T64/argv.json").read_text(encoding="utf-8"))["argv"][-1] == "4"
    capsys.readouterr()
    f.write_text(RUNNING.replace("--scale, 2]", "--scale, 4]").replace("{n: 8}", "{n: 16}"), encoding="utf-8")
    assert cli.main(["run", str(f), "--out", str(work)]) == 2  # a var of the prepared file a reads changed
    err = one_error(capsys)
    assert f"arm a: {work / 'runs/a/s0/T64'} was made with other flags (prepare data: 8 -> 16)" in err, err
    assert cli.main(["run", str(f), "--out", str(work), "--rerun-changed"]) == 0 and len(log) == 6  # data, a
    assert (work / "data/s0.jsonl.changed-1").is_file() and (work / "data/s0.jsonl.changed-1.argv.json").is_file()
    assert log[-2][-3:] == ["16", "--out", str(work / "data/s0.jsonl")] and log[-1][0:2] == ["probes", "ppl"]
    assert cli.main(["report", str(f), "--out", str(work)]) == 0
    capsys.readouterr()
    assert cli.main(["run", str(f), "--out", str(work), "--quick"]) == 2
    assert "holds a full run of this experiment, not a --quick one" in one_error(capsys)


def test_a_baseline_family_tests_only_the_lengths_outside_it(tmp_path, capsys):
    import numpy as np
    import scipy.stats

    rise = '  "rise": {score: score, rows: [a, b], baseline: [64, 128]}\n'
    text = MADE_UP.replace('  "vs a": [[b, a], [c, a]]\n', rise)
    f, work = made_up(tmp_path, text=text)
    rc, res = report(f, work)
    fam = res["score"]["seeds"]["1"]["families"]["rise"]
    assert rc == 0 and sorted((x["a"], x["length"]) for x in fam) == [("a", 128), ("a", 256), ("b", 128), ("b", 256)]
    ps = []
    for x in fam:  # exact sign flip of each id's score at L minus its score at 64 (the baseline [64, 128))
        d = np.array(vals(x["a"], 1, x["length"])) - np.array(vals(x["a"], 1, 64))
        null = [abs(np.mean(np.array(sg) * d)) for sg in itertools.product((-1, 1), repeat=len(d))]
        assert math.isclose(x["p"], np.mean(np.array(null) >= abs(d.mean()) - 1e-12)) and x["family"] == 4
        ps.append(x["p"])
    assert np.allclose([x["q"] for x in fam], scipy.stats.false_discovery_control(ps))
    capsys.readouterr()


def test_a_pooled_proportion_counts_each_sample_once(tmp_path, capsys):
    import numpy as np
    import scipy.stats

    def hits(arm, s, t):
        return [1, 1, 0, 0, 0] if arm == "b" else [1, 0, 0, 0, 0]

    f, work = made_up(tmp_path, hits, MADE_UP.replace("field: score}", "field: score, kind: proportion}"))
    rc, res = report(f, work)
    c = res["score"]["seeds"]["0"]["cells"]["bc"]["T64"]
    per_id = 100 * (np.array(hits("b", 0, 64)) + np.array(hits("c", 0, 64))) / 2  # 100, 50, 0, 0, 0
    lo, hi = scipy.stats.t.interval(0.95, 4, loc=per_id.mean(), scale=scipy.stats.sem(per_id))
    assert rc == 0 and c["n"] == 5 and math.isclose(c["mean"], 30.0)  # 5 samples, not 10 trials
    assert math.isclose(c["lo"], max(lo, 0.0), abs_tol=1e-9) and math.isclose(c["hi"], hi, rel_tol=1e-9)
    assert res["score"]["seeds"]["0"]["cells"]["b"]["T64"]["rule"] == "Wilson"  # one arm: k of n
    capsys.readouterr()


def test_a_repeated_id_and_a_bucket_unit_are_errors(tmp_path, capsys):
    f, work = made_up(tmp_path)
    p = work / "runs/a/s0/T128/scores.jsonl"
    p.write_text(p.read_text(encoding="utf-8") + '{"id": 2, "score": 1.0}\n', encoding="utf-8")
    assert report(f, work)[0] == 2
    assert one_error(capsys) == f"error: {p}: record 6: id '2' is repeated (one record an id)"
    block = "score:\n  file: scores.jsonl\n  field: score\n  unit: bucket\n"  # its line 14
    f.write_text(MADE_UP.replace("score: {file: scores.jsonl, field: score}\n", block), encoding="utf-8")
    assert report(f, work)[0] == 2
    err = one_error(capsys)
    assert err.startswith(f"error: {f}:14: ") and "unit: bucket is not a test unit" in err, err


def test_a_range_bounds_the_interval(tmp_path, capsys):
    from ropescale.common.stats.proportions import wilson

    f, work = made_up(tmp_path, lambda arm, s, t: [0.0] * 16)
    f.write_text(MADE_UP.replace("field: score}", "field: score, range: [0, 100]}"), encoding="utf-8")
    rc, res = report(f, work)
    c = res["score"]["seeds"]["0"]["cells"]["a"]["T64"]
    z = scipy_z()
    assert rc == 0 and c["rule"] == "Wilson (no spread)" and c["lo"] == 0.0 and round(c["hi"], 2) == 19.36
    assert math.isclose(c["hi"], 100 * z ** 2 / (16 + z ** 2), rel_tol=1e-9)  # Wilson's upper bound at 0 of 16
    assert math.isclose(c["hi"], 100 * wilson(0, 16).hi, rel_tol=1e-9)
    capsys.readouterr()
    block = "score:\n  file: scores.jsonl\n  field: score\n  range: [100, 0]\n"  # its line 14
    f.write_text(MADE_UP.replace("score: {file: scores.jsonl, field: score}\n", block), encoding="utf-8")
    assert report(f, work)[0] == 2
    err = one_error(capsys)
    assert err.startswith(f"error: {f}:14: ") and "range: [lo, hi], two numbers with lo < hi" in err, err


def scipy_z() -> float:
    import scipy.stats

    return float(scipy.stats.norm.ppf(0.975))


def test_seeds_that_agree_exactly_are_no_test(tmp_path, capsys):
    def same(arm, s, t):  # b - a is exactly +1.0 in every seed (no spread): a t test cannot be made
        return [20.0 + i + (1.0 if arm == "b" else 0.0) + (3.0 * s if arm == "c" else 0.0) for i in range(5)]

    f, work = made_up(tmp_path, same)
    rc, res = report(f, work)
    fam = {(x["a"], x["length"]): x for x in res["score"]["pooled"]["families"]["vs a"]}
    assert rc == 0 and fam[("b", 64)]["p"] is None and fam[("b", 64)]["q"] is None and fam[("b", 64)]["sd"] == 0
    page = (work / "made_up.md").read_text(encoding="utf-8")
    assert "| b - a | +1.0 (no spread measured) | +1.0 (no spread measured) | +1.0 (no spread measured) |" in page
    assert "3 with no spread over the seeds (no test, not in q)." in page
    capsys.readouterr()


@pytest.mark.parametrize("key", ["id", "bucket"])
def test_a_repeated_id_within_a_length_is_an_error(tmp_path, key):
    from ropescale.common.io import InputError
    from ropescale.experiments.collect import scores

    p = tmp_path / "loss.jsonl"
    p.write_text('{"window": "w0", "bucket": 0, "loss": 1.0}\n{"window": "w0", "bucket": 128, "loss": 1.5}\n'
                 + ('{"window": "w0", "bucket": 0, "loss": 2.0}\n' if key == "bucket" else ""), encoding="utf-8")
    if key == "id":
        assert scores(p, "loss", "window", length="bucket") == {0: {"w0": 1.0}, 128: {"w0": 1.5}}
        return
    with pytest.raises(InputError, match="record 3: window 'w0' is repeated at bucket 0"):
        scores(p, "loss", "window", length="bucket")


def test_a_partial_score_skips_the_records_without_its_field(tmp_path):
    from ropescale.common.io import InputError
    from ropescale.experiments.collect import scores

    p = tmp_path / "items.jsonl"  # a control measured for the short key only
    p.write_text('{"id": "k0", "col": 4, "loss": 1.0, "control": 2.0}\n{"id": "k1", "col": 8, "loss": 1.5}\n',
                 encoding="utf-8")
    assert scores(p, "control", "id", length="col", partial=True) == {4: {"k0": 2.0}}
    with pytest.raises(InputError, match="control"):
        scores(p, "control", "id", length="col")


GROUPS = """name: groups
title: A probe writing two variants a run
seeds: [0]
lengths: [64]
arms:
  orig: {label: original, run: [probes, ppl, --model, tiny, --lengths, "{length}"], group: original}
  swapped: {label: swapped, reads: orig, group: names-swapped}
  gap: {label: "swapped - original, paired in the run", reads: orig, group: names-swapped, field: diff}
score: {file: scores.jsonl, field: score}
table: [orig, swapped, gap]
"""


def test_an_arm_reads_only_its_group_of_a_runs_records(tmp_path, capsys):
    """``group:``: an arm reads the records of its group alone (a probe that writes an original and a name-swapped
    variant a prompt in one file: two rows), a field only one group has read from that group; a record of the
    group without the field is an error naming the file and record."""
    import scipy.stats

    from ropescale.experiments.runner import run_dir

    orig = [3.0, 4.0, 5.5, 2.0]
    swap = [4.0, 4.5, 7.0, 2.5]

    f, work = made_up(tmp_path, text=GROUPS, arms="")
    d = run_dir(work, "orig", 0, 64)
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"kind": "probe", "status": "complete", "seconds": 1.0}))
    recs = [{"id": f"{i}:original", "group": "original", "score": a} for i, a in enumerate(orig)]
    recs += [{"id": f"{i}:names-swapped", "group": "names-swapped", "score": b, "diff": b - a}
             for i, (a, b) in enumerate(zip(orig, swap))]
    (d / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rc, res = report(f, work)
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    cells = next(iter(res.values()))["seeds"]["0"]["cells"]
    for arm, xs in (("orig", orig), ("swapped", swap), ("gap", [b - a for a, b in zip(orig, swap)])):
        c = cells[arm]["T64"]
        ci = scipy.stats.ttest_1samp(xs, 0.0).confidence_interval()
        assert c["n"] == 4 and c["mean"] == pytest.approx(sum(xs) / 4)
        assert (c["lo"], c["hi"]) == pytest.approx((ci.low, ci.high))
    # a swapped record without the field its arm reads
    (d / "scores.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "diff"}) + "\n"
                                            for r in recs))
    rc, _ = report(f, work)
    assert rc == 2
    err = one_error(capsys)
    assert "scores.jsonl" in err and "no 'diff' in a record of group 'names-swapped'" in err


def test_a_run_not_finished_is_not_read(tmp_path, capsys):
    """A run still going (or stopped part-way) holds some of its records; the page reads only finished runs, so a
    row never shows fewer samples than its flags ask: arm c's run at seed 1, T128 says running, and its cell there
    is absent (seed 0's is read)."""
    from ropescale.experiments.runner import run_dir

    f, work = made_up(tmp_path)
    rj = run_dir(work, "c", 1, 128) / "run.json"
    rj.write_text(json.dumps({"kind": "probe", "status": "running", "seconds": 1.0}))
    rc, res = report(f, work)
    assert rc == 0, capsys.readouterr().err
    cells = next(iter(res.values()))["seeds"]
    assert "T128" in cells["0"]["cells"]["c"] and "T128" not in cells["1"]["cells"].get("c", {})
    assert "T256" in cells["1"]["cells"]["c"]
