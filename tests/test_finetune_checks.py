"""Issue 15 (fine-tuning): finetune.py refuses what it cannot do faithfully, with one line and before any work --
resuming with other settings, --init-from a run of another RoPE setting, impossible numeric settings, a file as
--output-dir, a merge onto something that is not a model directory -- and never leaves temp dirs behind."""
from __future__ import annotations

import json
import shutil

import pytest
from ft_helpers import packed, train_log

from ropescale.training.cli import main


def _err(capsys, argv):
    """(exit code, the last stderr line, all of stderr) of an in-process finetune.py call."""
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    return rc, (lines[-1] if lines else ""), err


def _one_line_error(err: str) -> None:
    assert "Traceback" not in err
    assert [x for x in err.splitlines() if x.startswith("error: ")] == [err.strip().splitlines()[-1]]


@pytest.fixture(scope="module")
def base(tmp_path_factory, make_tiny_model, chapters, tiny_tokenizer_dir):
    """One finished 2-step run (lr 2e-4, global batch 2) on a tiny model, and a second packed dataset."""
    tmp = tmp_path_factory.mktemp("ft_checks")
    _, model_dir = make_tiny_model(orig_ctx=64)
    data = packed(chapters, tiny_tokenizer_dir, tmp / "packed", 300, 480, n=12)
    other = packed(chapters, tiny_tokenizer_dir, tmp / "packed2", 300, 480, n=12, seed=1)
    out = tmp / "run"
    args = ["--model", model_dir, "--data", data, "--rope", "pi", "--scale", "8", "--max-steps", "2",
            "--global-batch", "2", "--save-steps", "2", "--warmup-steps", "0", "--lr", "2e-4", "--seed", "3"]
    assert main([str(a) for a in args] + ["--output-dir", str(out)]) == 0  # in process: no DeepSpeed
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    return {"model": model_dir, "data": data, "other": other, "run": out, "args": args}


def _with(args: list, **changes) -> list:
    """``args`` with flag values replaced (``lr="5e-4"`` -> ``--lr 5e-4``)."""
    args = [str(a) for a in args]
    for k, v in changes.items():
        f = "--" + k.replace("_", "-")
        i = args.index(f)
        args[i + 1] = str(v)
    return args


# ---------------------------------------------------------------- 1. resume: only --max-steps may grow
@pytest.mark.parametrize("change,diff", [
    ({"lr": "5e-4"}, "lr 0.0002 -> 0.0005"),
    ({"global_batch": "4"}, "global_batch 2 -> 4"),
    ({"max_steps": "1"}, "max_steps 2 -> 1"),
    ({"seed": "4"}, "seed 3 -> 4"),
    ({"lr": "5e-4", "global_batch": "4"}, "lr 0.0002 -> 0.0005, global_batch 2 -> 4"),
])
def test_resume_with_other_settings_is_refused(base, capsys, change, diff):
    run_json = base["run"] / "run.json"
    before = run_json.read_bytes()
    rc, line, err = _err(capsys, [*_with(base["args"], **change), "--output-dir", base["run"], "--resume", "auto"])
    assert rc == 2, err[-2000:]
    _one_line_error(err)
    assert line.startswith(f"error: {run_json}: holds a run made with different settings: ")
    assert diff in line and "--resume" in line and "only --max-steps may grow" in line and "--overwrite" in line
    assert run_json.read_bytes() == before  # not touched


def test_resume_with_other_data_is_refused(base, capsys):
    run_json = base["run"] / "run.json"
    before = run_json.read_bytes()
    rc, line, err = _err(capsys, [*_with(base["args"], data=base["other"]), "--output-dir", base["run"],
                                  "--resume", "auto"])
    assert rc == 2 and f"data {base['data']} -> {base['other']}" in line, err[-2000:]
    _one_line_error(err)
    assert run_json.read_bytes() == before


def test_resume_when_the_data_changed_under_the_same_path(base, capsys, tmp_path):
    """The packed dataset at the recorded path is not the one the run began with (rebuilt since)."""
    cut = tmp_path / "run"
    shutil.copytree(base["run"], cut)
    meta = json.loads((cut / "run.json").read_text())
    meta["info"]["data_stats"]["samples"] += 1
    meta["info"]["data_stats"]["tokens"] += 100
    (cut / "run.json").write_text(json.dumps(meta))
    before = (cut / "run.json").read_bytes()
    rc, line, err = _err(capsys, [*base["args"], "--output-dir", cut, "--resume", "auto"])
    assert rc == 2, err[-2000:]
    _one_line_error(err)
    assert "holds a run made with different settings" in line and "data samples" in line and "tokens" in line
    assert (cut / "run.json").read_bytes() == before


def test_resume_may_extend_max_steps(base, tmp_path, capsys):
    """The one change resume accepts: more steps (the same spelling of the output dir is not required)."""
    cut = tmp_path / "run"
    shutil.copytree(base["run"], cut)
    old = json.loads((cut / "run.json").read_text())
    rc, _, err = _err(capsys, [*_with(base["args"], max_steps=3), "--output-dir", f"{cut}/./", "--resume", "auto"])
    assert rc == 0, err[-2000:]
    assert "resuming from" in err and "checkpoint-2" in err
    assert [r["step"] for r in train_log(cut)] == [1, 2, 3]
    meta = json.loads((cut / "run.json").read_text())
    assert meta["status"] == "done" and meta["info"]["steps"] == 3 and meta["settings"]["max_steps"] == 3
    assert meta["settings"]["lr"] == old["settings"]["lr"]
    assert meta["settings"]["global_batch"] == old["settings"]["global_batch"] == 2


def test_resume_may_change_how_activations_are_kept(base, tmp_path, capsys):
    """--tile-mlp / --offload-checkpoints change memory, not what is trained: a resume may change them, and the
    finetune path applies them (the memory plan is in the training log)."""
    cut = tmp_path / "run"
    shutil.copytree(base["run"], cut)
    rc, _, err = _err(capsys, [*_with(base["args"], max_steps=3), "--output-dir", str(cut), "--resume", "auto",
                               "--tile-mlp", "16", "--offload-checkpoints", "true"])
    assert rc == 0, err[-2000:]
    last = train_log(cut)[-1]
    assert last["step"] == 3
    assert "memory" in err and any("tile" in k for k in last), last


# ---------------------------------------------------------------- 2. --init-from: the same RoPE setting
def test_init_from_a_run_of_another_rope_is_refused(base, capsys, tmp_path):
    src = tmp_path / "src16k"
    (src / "final").mkdir(parents=True)
    from rope_scaling import RopeSpec

    (src / "final" / "export.json").write_text(json.dumps(
        {"base_model": str(base["model"]), "rope": RopeSpec("pi", 8, orig_ctx=64).to_dict(), "step": 2}))
    out = tmp_path / "cont"
    rc, line, err = _err(capsys, ["--model", base["model"], "--data", base["data"], "--rope", "ntk", "--scale", "8",
                                  "--init-from", src, "--output-dir", out])
    assert rc == 2, err[-2000:]
    _one_line_error(err)
    assert "--init-from" in line and "pi x8" in line and "ntk x8" in line
    assert not out.exists()


# ---------------------------------------------------------------- 4. --out (old spelling --output-dir) that is a file
@pytest.mark.parametrize("flag", ["--out", "--output-dir"])
def test_output_dir_that_is_a_file(base, capsys, tmp_path, flag):
    f = tmp_path / "out.txt"
    f.write_text("keep me\n")
    rc, line, err = _err(capsys, [*base["args"], flag, f])
    assert rc == 2, err[-2000:]
    _one_line_error(err)
    assert "--out" in line and str(f) in line and "not a directory" in line
    assert f.read_text() == "keep me\n"
    rc, line, err = _err(capsys, [*base["args"], flag, f / "run"])  # below a file
    assert rc == 2 and "not a directory" in line, err[-2000:]


# ---------------------------------------------------------------- 5. numeric settings
@pytest.mark.parametrize("flag,value", [
    ("--lora-r", "0"), ("--lora-alpha", "0"), ("--lora-dropout", "1"), ("--lora-dropout", "-0.1"),
    ("--lr", "0"), ("--lr", "-1e-4"), ("--lr", "nan"), ("--max-steps", "0"), ("--micro-batch", "0"),
    ("--global-batch", "0"), ("--save-steps", "0"), ("--logging-steps", "0"), ("--warmup-steps", "-1"),
    ("--head-chunk", "0"),
])
def test_impossible_numeric_settings_are_one_line_before_any_work(capsys, tmp_path, flag, value):
    # the model does not exist: the setting must be refused before anything looks for it
    rc, line, err = _err(capsys, ["--model", tmp_path / "nope", "--rope", "pi", "--scale", "2", f"{flag}={value}",
                                  "--output-dir", tmp_path / "run"])
    assert rc == 2, err
    assert line.startswith(f"error: {flag} must be ") and line.endswith(f"got {float(value):g}"), line
    assert err.strip() == line and not (tmp_path / "run").exists()


def test_impossible_recipe_value_names_file_and_line(capsys, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("rope: pi\nscale: 2\nlora_r: 0\n")
    rc, line, err = _err(capsys, ["--recipe", f, "--model", tmp_path / "nope"])
    assert rc == 2 and line.startswith(f"error: {f}:3: ") and "lora_r" in line and ">= 1" in line, err


# ---------------------------------------------------------------- 8. a model whose config already carries the rope
@pytest.fixture(scope="module")
def scaled_model(make_tiny_model, tmp_path_factory):
    """A model directory whose config.json already carries ntk x8 (e.g. a merged fine-tune)."""
    from transformers import AutoConfig

    from rope_scaling import RopeSpec, apply_rope

    _, src = make_tiny_model(orig_ctx=64)
    d = tmp_path_factory.mktemp("scaled") / "m"
    shutil.copytree(src, d)
    cfg = AutoConfig.from_pretrained(str(d))
    apply_rope(cfg, RopeSpec("ntk", 8))
    cfg.save_pretrained(str(d))
    return d


def test_finetune_on_a_config_that_already_carries_the_rope(scaled_model, capsys, tmp_path):
    nodata = tmp_path / "nodata"  # the run stops at the data, after the rope rule has been applied
    common = ["--model", scaled_model, "--data", nodata, "--output-dir", tmp_path / "run"]
    rc, line, err = _err(capsys, [*common, "--rope", "ntk", "--scale", "8"])  # the same spec: accepted, no-op
    assert rc == 2 and "not a packed dataset" in line, err
    assert "already carries ntk x8" in err and "unchanged" in err
    rc, line, err = _err(capsys, [*common, "--rope", "pi", "--scale", "8"])  # another spec: refused
    assert rc == 2 and "already carries ntk x8" in line and "--replace" in line, err
    _one_line_error(err)
    rc, line, err = _err(capsys, [*common, "--rope", "pi", "--scale", "8", "--replace"])  # replaced
    assert rc == 2 and "not a packed dataset" in line, err
    assert "replaced" in err and "pi x8" in err
    rc, line, err = _err(capsys, common)  # no rope flags: trained with what the config carries
    assert rc == 2 and "not a packed dataset" in line and "ntk x8" in err, err
