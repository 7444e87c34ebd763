"""Issue 15: ``finetune.py merge --out`` checks the destination before any work, replaces only a model directory
(and that only with --overwrite: issue 27), and no failure (of merge or of an export) leaves a temp directory
behind."""
from __future__ import annotations

import json

import pytest
import torch

from ropescale.training.cli import main


@pytest.fixture(scope="module")
def exported(make_tiny_model, tmp_path_factory):
    """A run directory with a final export (LoRA on a tiny model, ntk x8), written by
    ropescale.training.saving.export."""
    from rope_scaling import RopeSpec, read_rope
    from rope_scaling.load import load_config
    from ropescale.training.model import add_lora, load_model
    from ropescale.training.saving import export

    _, model_dir = make_tiny_model(orig_ctx=64)
    cfg = load_config(model_dir, RopeSpec("ntk", 8))
    config = cfg.config
    model = load_model(cfg, torch.float32, "sdpa")
    peft_model, extra = add_lora(model, gradient_checkpointing=False)
    run = tmp_path_factory.mktemp("merge") / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"kind": "finetune", "model": str(model_dir)}))
    export(peft_model, run / "final", extra_names=extra, base_model=str(model_dir), config=config,
           rope=read_rope(config).to_dict(), step=0, tokenizer_dir=model_dir)
    return {"run": run, "model": model_dir, "peft": peft_model, "extra": extra, "config": config}


def _err(capsys, argv):
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    return rc, (lines[-1] if lines else ""), err


def _listing(d):
    return sorted(p.name for p in d.iterdir())


def test_out_is_an_existing_file(exported, capsys, tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"keep")
    # --base-model does not exist: the destination must be refused before the merge looks for anything
    rc, line, err = _err(capsys, ["merge", "--run", exported["run"], "--out", f, "--base-model", tmp_path / "nope"])
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert line.startswith(f"error: {f}: ") and "--out" in line and "not a directory" in line
    assert f.read_bytes() == b"keep" and _listing(tmp_path) == ["model.bin"]  # no model.bin.tmpPID/


def test_out_is_a_directory_that_is_not_a_model(exported, capsys, tmp_path):
    d = tmp_path / "notes"
    d.mkdir()
    (d / "todo.txt").write_text("x")
    rc, line, err = _err(capsys, ["merge", "--run", exported["run"], "--out", d, "--base-model", tmp_path / "nope"])
    assert rc == 2 and "--out" in line and "not a model directory" in line, err
    assert _listing(d) == ["todo.txt"] and _listing(tmp_path) == ["notes"]
    # the run directory itself, its export, and the base model are never replaced
    for target in (exported["run"], exported["run"] / "final", exported["model"]):
        before = _listing(target)
        rc, line, err = _err(capsys, ["merge", "--run", exported["run"], "--out", target])
        assert rc == 2 and "--out" in line, err
        assert _listing(target) == before
        assert not [p for p in target.parent.iterdir() if ".tmp" in p.name or ".old" in p.name]


def test_out_empty_dir_then_replace_a_merged_model(exported, capsys, tmp_path):
    out = tmp_path / "merged"
    out.mkdir()  # an empty directory is fine
    assert main(["merge", "--run", str(exported["run"]), "--out", str(out)]) == 0
    assert (out / "config.json").is_file() and (out / "ropescale_train.json").is_file()
    (out / "marker").write_text("from the first merge")
    assert main(["merge", "--run", str(exported["run"]), "--out", str(out), "--overwrite"]) == 0  # replaced
    assert not (out / "marker").exists() and (out / "config.json").is_file()
    assert _listing(tmp_path) == ["merged"]
    capsys.readouterr()


def test_a_failing_merge_leaves_no_temp_dir_and_keeps_the_old_model(exported, tmp_path, monkeypatch):
    from ropescale.training import saving

    out = tmp_path / "merged"
    saving.merge(exported["run"] / "final", out)
    before = _listing(out)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(saving, "write_json_atomic", boom)
    with pytest.raises(OSError, match="disk full"):
        saving.merge(exported["run"] / "final", out, overwrite=True)
    assert _listing(tmp_path) == ["merged"] and _listing(out) == before
    with pytest.raises(OSError, match="disk full"):
        saving.merge(exported["run"] / "final", tmp_path / "new")
    assert _listing(tmp_path) == ["merged"]


def test_a_failing_export_leaves_no_temp_dir(exported, tmp_path, monkeypatch):
    from ropescale.training import saving

    kw = dict(extra_names=exported["extra"], base_model=str(exported["model"]), config=exported["config"],
              rope={}, step=1, tokenizer_dir=None)
    saving.export(exported["peft"], tmp_path / "final", **kw)
    before = _listing(tmp_path / "final")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(saving, "write_json_atomic", boom)
    with pytest.raises(OSError, match="disk full"):
        saving.export(exported["peft"], tmp_path / "final", **kw)
    assert _listing(tmp_path) == ["final"] and _listing(tmp_path / "final") == before
