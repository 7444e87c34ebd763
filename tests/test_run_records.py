"""Issue 27 (1, 2, 3, 6) and 26.4: one run record, run directories that keep their word.

- a directory holding any run record is that run's: a fine-tune killed before its first checkpoint is not taken
  over by other settings, an eval run directory never gets a fine-tune's files (27.1);
- a model's identity (``model_id``) is recorded and a resume whose model changed at the same path is refused;
  ``merge --out`` an existing model needs --overwrite (27.2);
- default outputs go under the current directory and a run is never deleted without --overwrite (27.3);
- ``seconds`` covers the whole run after --resume, and a merged model carries its training record through
  generate, score and report (27.6, 23.4);
- run.json has the same field names in every stage (26.4).
"""
from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

import pytest
from ft_helpers import finetune_cmd, packed, run, train_log

from ropescale.common.io import InputError
from ropescale.training.cli import main as ft_main

RECORD_KEYS = {"kind", "model", "model_id", "rope", "context", "train", "data", "settings", "info", "status",
               "seconds", "created", "updated", "versions"}


def _err(capsys, argv):
    """(exit code, the last stderr line, all of stderr) of an in-process finetune.py call."""
    rc = ft_main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    return rc, (lines[-1] if lines else ""), err


def _listing(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


@pytest.fixture(scope="module")
def env(tmp_path_factory, make_tiny_model, chapters, tiny_tokenizer_dir):
    """A tiny model, a packed dataset, and one finished 1-step run (checkpoint-1 and final/)."""
    tmp = tmp_path_factory.mktemp("records")
    _, model_dir = make_tiny_model(orig_ctx=64)
    data = packed(chapters, tiny_tokenizer_dir, tmp / "packed", 300, 480, n=12)
    args = ["--model", model_dir, "--data", data, "--rope", "ntk", "--scale", "8", "--global-batch", "2",
            "--warmup-steps", "0", "--lr", "2e-4", "--seed", "3"]
    done = tmp / "done"
    p = run(finetune_cmd(*args, "--max-steps", "1", "--save-steps", "1", "--out", done))
    assert p.returncode == 0, p.stderr[-2000:]
    return {"tmp": tmp, "model": model_dir, "data": data, "args": args, "done": done, "chapters": chapters}


def _eval_file(path: Path, chapters, n: int = 2) -> Path:
    path.write_text("".join(json.dumps({"context": c["text"][:120], "summary": c["title"]}, ensure_ascii=False)
                            + "\n" for c in chapters[:n]), encoding="utf-8")
    return path


# ---------------------------------------------------------------- 27.1 a directory holding a run record is its run's
def test_a_finetune_killed_before_its_first_checkpoint_is_not_taken_over(env, capsys, tmp_path):
    """The issue's case: a fine-tune killed before its first checkpoint (run.json, train_log.jsonl, no
    checkpoint-*, no final/), then another fine-tune with other settings into the same --out: refused (it used to
    train, and train_log.jsonl read 1,2,1,2)."""
    x = tmp_path / "x"
    shutil.copytree(env["done"], x)
    shutil.rmtree(x / "final")
    shutil.rmtree(x / "checkpoint-1")
    meta = json.loads((x / "run.json").read_text())
    meta["status"] = "running"
    (x / "run.json").write_text(json.dumps(meta))
    before = {p: (x / p).read_bytes() for p in ("run.json", "train_log.jsonl")}
    other = [a if a != "ntk" else "yarn" for a in env["args"]]
    other[other.index("--lr") + 1] = "5e-4"
    rc, line, err = _err(capsys, [*other, "--max-steps", "2", "--save-steps", "100", "--out", x])
    assert rc == 2, err[-2000:]
    # no process holds it (issue 34: a killed run no longer reads "(running)")
    assert line.startswith(f"error: {x}: already holds a finetune run (stopped (not running))") and "--resume" in line \
        and "--overwrite" in line, line
    assert {p: (x / p).read_bytes() for p in before} == before
    assert not (x / "final").exists() and [r["step"] for r in train_log(x)] == [1]
    # continuing it with its own settings is what --resume is for: from the start (no checkpoint), each step once
    rc, _, err = _err(capsys, [*env["args"], "--max-steps", "2", "--save-steps", "1", "--out", x, "--resume", "auto"])
    assert rc == 0, err[-2000:]
    assert [r["step"] for r in train_log(x)] == [1, 2]


def test_an_eval_run_directory_never_gets_a_finetune(env, capsys, tmp_path):
    """finetune.py --out EVAL_RUN_DIR used to write checkpoint-1/ and final/ beside the predictions and replace
    its run.json; now it is refused, --overwrite included (another kind of run is never deleted)."""
    ev = tmp_path / "L-ie"
    ev.mkdir()
    (ev / "run.json").write_text(json.dumps({"kind": "generate", "model": "tiny", "prompt": "ie"}))
    (ev / "predictions.jsonl").write_text(json.dumps({"id": 1, "prediction": "a", "reference": "b"}) + "\n")
    before = {p: (ev / p).read_bytes() for p in _listing(ev)}
    for extra in ([], ["--overwrite"], ["--resume", "auto"]):
        rc, line, err = _err(capsys, [*env["args"], "--max-steps", "1", "--out", ev, *extra])
        assert rc == 2, err[-2000:]
        assert line == (f"error: {ev / 'run.json'}: holds a generate run (run.json), not a finetune run: a finetune "
                        f"run is never written into another run's directory; use another --out"), line
        assert {p: (ev / p).read_bytes() for p in _listing(ev)} == before


def test_generate_and_probes_refuse_another_kind_of_run(env, tmp_path):
    from ropescale.common.settings import make
    from ropescale.evaluation.generate import generate
    from ropescale.probes.common import Loaded, ProbeRun, ProbeSettings

    data = _eval_file(tmp_path / "eval.jsonl", env["chapters"])
    with pytest.raises(InputError, match="holds a finetune run .* not a generate run"):
        generate(str(env["model"]), data, "ie", env["done"], max_new_tokens=2, progress=False)
    assert not (env["done"] / "predictions.jsonl").exists()
    ev = tmp_path / "ev"
    generate(str(env["model"]), data, "ie", ev, max_new_tokens=2, limit=1, progress=False)
    stub = Loaded(None, None, Path(env["model"]), str(env["model"]), {"method": "none"}, 1.0, 64, 64)
    with pytest.raises(InputError, match="holds a generate run .* not a probe run"):
        ProbeRun("ppl", stub, make(ProbeSettings, out=str(ev)), [32])


# ---------------------------------------------------------------- 27.2 a model's identity; merge keeps its word
def test_model_id_is_content_not_place(make_tiny_model, tmp_path):
    from ropescale.common.runs.identity import model_id

    _, a = make_tiny_model(orig_ctx=64, seed=1)
    _, b = make_tiny_model(orig_ctx=64, seed=2)  # the same config and shapes, other weights
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    assert model_id(a) == model_id(copy) and len(model_id(a)) == 16
    assert model_id(a) != model_id(b)
    assert model_id(tmp_path / "nothing") is None


def test_generate_refuses_to_resume_when_the_model_changed_at_the_same_path(env, make_tiny_model, tmp_path):
    """The issue's case: models/X replaced (another merge) between two generate calls with the same --out: the
    second used to resume and predictions.jsonl held outputs of two models."""
    from ropescale.evaluation.generate import generate

    _, other = make_tiny_model(orig_ctx=64, seed=5)
    place = tmp_path / "models" / "x"
    shutil.copytree(env["model"], place)
    data = _eval_file(tmp_path / "eval.jsonl", env["chapters"], n=2)
    out = tmp_path / "eval"
    generate(str(place), data, "ie", out, max_new_tokens=2, limit=1, progress=False)
    shutil.rmtree(place)
    shutil.copytree(other, place)
    with pytest.raises(InputError, match=r"different settings: model_id [0-9a-f]{16} -> [0-9a-f]{16}"):
        generate(str(place), data, "ie", out, max_new_tokens=2, progress=False)
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 1


def test_merge_onto_an_existing_model_needs_overwrite(env, capsys, tmp_path):
    out = tmp_path / "models" / "m"
    assert ft_main(["merge", "--run", str(env["done"]), "--out", str(out)]) == 0
    (out / "marker").write_text("the first merge")
    rc = ft_main(["merge", "--run", str(env["done"]), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and f"{out}: --out is an existing model directory: pass --overwrite" in err, err
    assert (out / "marker").is_file()
    assert ft_main(["merge", "--run", str(env["done"]), "--out", str(out), "--overwrite"]) == 0
    assert not (out / "marker").exists() and (out / "config.json").is_file()
    capsys.readouterr()


# ---------------------------------------------------------------- 27.3 default outputs under the current directory
def test_the_default_out_is_under_the_current_directory_and_never_replaced(monkeypatch, tmp_path):
    """``ropescale finetune --rope ntk --scale 8`` from another directory used to replace the README's demo run
    inside the checkout (the tiny default's run dir was replaced without --overwrite)."""
    from rope_scaling import RopeSpec
    from ropescale.common.settings import make
    from ropescale.training.config import TrainSettings
    from ropescale.training.run import plan_run

    monkeypatch.chdir(tmp_path)
    s = make(TrainSettings, rope=RopeSpec("ntk", 8), max_steps=1)
    first = plan_run(s, recipe=None, resume=None, overwrite=False)
    assert first.run_dir.resolve() == tmp_path / "runs" / "train" / "tiny-ntk-x8"
    (first.run_dir / "final").mkdir(parents=True)
    (first.run_dir / "run.json").write_text(json.dumps({"kind": "finetune", "status": "done"}))
    with pytest.raises(InputError, match="already holds a finetune run .*--overwrite"):
        plan_run(s, recipe=None, resume=None, overwrite=False)
    assert plan_run(s, recipe=None, resume=None, overwrite=True).overwrite  # deleted only when asked
    assert (first.run_dir / "final").is_dir()  # (and only once the run starts: nothing yet)


# ---------------------------------------------------------------- 27.6 seconds of the whole run; the training record
def test_seconds_after_resume_cover_the_whole_run(env, tmp_path, capsys):
    """Each part adds its own time to what the run recorded: a resumed run's seconds are those of every part."""
    y = tmp_path / "y"
    shutil.copytree(env["done"], y)
    meta = json.loads((y / "run.json").read_text())
    meta["seconds"] = 1000.0  # as if the first part had taken 1000 s
    (y / "run.json").write_text(json.dumps(meta))
    t0 = time.time()
    rc, _, err = _err(capsys, [*env["args"], "--max-steps", "2", "--save-steps", "1", "--out", y, "--resume", "auto"])
    wall = time.time() - t0
    assert rc == 0, err[-2000:]
    meta = json.loads((y / "run.json").read_text())
    # the record keeps 0.1 s (training/run.py rounds the sum): a part shorter than a second can round up past wall
    assert meta["status"] == "done" and 1000.0 < meta["seconds"] <= round(1000.0 + wall, 1) + 0.05
    assert [r["step"] for r in train_log(y)] == [1, 2]


def test_the_training_record_survives_merge_generate_score_report(env, tmp_path, capsys):
    """finetune -> merge --out models/X (outside the run dir) -> generate --model models/X -> score -> report:
    the report shows the mean training length (the paper's Train Len.) with its range."""
    from data_concat import load_packed
    from ropescale.evaluation.cli import main as eval_main
    from ropescale.evaluation.generate import generate

    lengths = [r["length"] for r in load_packed(env["data"])]  # the packed samples, read independently
    mean, lo, hi = statistics.mean(lengths), min(lengths), max(lengths)
    assert lo < mean < hi
    model = tmp_path / "models" / "tiny-ntk-x8"
    assert ft_main(["merge", "--run", str(env["done"]), "--out", str(model)]) == 0
    rec = json.loads((model / "ropescale_train.json").read_text())
    assert rec["length"] == {"mean": round(mean, 1), "min": lo, "max": hi} and rec["step"] == 1
    assert rec["rope"]["method"] == "ntk" and rec["base_model"] == str(Path(env["model"]).resolve())
    assert rec["id"] == json.loads((env["done"] / "run.json").read_text())["train"]["id"]
    data = _eval_file(tmp_path / "eval.jsonl", env["chapters"])
    for prompt in ("ft-ie", "ft-ib"):
        generate(str(model), data, prompt, tmp_path / "runs" / prompt, max_new_tokens=4, subset="T512",
                 progress=False)
        meta = json.loads((tmp_path / "runs" / prompt / "run.json").read_text())
        assert meta["train"]["length"]["mean"] == round(mean, 1) and meta["train"]["id"] == rec["id"]
    capsys.readouterr()
    assert eval_main(["score", "--pred", str(tmp_path / "runs" / "ft-ie"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["train_length"] == {"mean": round(mean, 1), "min": lo, "max": hi}
    assert eval_main(["report", str(tmp_path / "runs"), "--view", "extrapolation", "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["train_length"] == {"mean": round(mean, 1), "min": lo, "max": hi}
    assert eval_main(["report", str(tmp_path / "runs"), "--view", "extrapolation"]) == 0
    assert f"| {round(mean)} ({lo}-{hi}) |" in capsys.readouterr().out


# ---------------------------------------------------------------- 26.4 one record, the same names in every stage
def test_run_json_has_the_same_fields_in_every_stage(env, tmp_path, capsys):
    from ropescale.evaluation.generate import generate
    from ropescale.probes.cli import main as probes_main

    data = _eval_file(tmp_path / "eval.jsonl", env["chapters"])
    generate(str(env["model"]), data, "ie", tmp_path / "gen", max_new_tokens=2, limit=1, progress=False)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": c["text"]}, ensure_ascii=False) + "\n"
                            for c in env["chapters"][:2]), encoding="utf-8")
    assert probes_main(["ppl", "--model", str(env["model"]), "--data", str(docs), "--out", str(tmp_path / "ppl"),
                        "--n", "1", "--lengths", "40", "--target-len", "8"]) == 0
    capsys.readouterr()
    metas = {k: json.loads((d / "run.json").read_text()) for k, d in
             (("finetune", env["done"]), ("generate", tmp_path / "gen"), ("probe", tmp_path / "ppl"))}
    for kind, meta in metas.items():
        assert set(meta) == RECORD_KEYS, (kind, sorted(set(meta) ^ RECORD_KEYS))
        assert meta["kind"] == kind and meta["model"] == str(Path(env["model"]).resolve())
        assert meta["model_id"] == metas["finetune"]["model_id"] and len(meta["model_id"]) == 16
        assert meta["rope"]["method"] in ("ntk", "none") and isinstance(meta["context"], int)
        assert not {"model", "data", "rope"} & set(meta["settings"])
    assert metas["finetune"]["train"]["length"]["mean"] is not None
    assert metas["generate"]["train"] is None and metas["probe"]["train"] is None  # the base model: not fine-tuned
