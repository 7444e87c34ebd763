"""Issue 27.4 / 27.5: every command keeps the README's word at the edges -- a truncated or weightless model, a
malformed JSON file and an absurd --scale are one line + exit 2 (never a traceback), JSON errors name the line and
column where the parser stopped, checkpoints get the umask's file modes, and under the DeepSpeed launcher
(``deepspeed -q``) stdout holds only the result."""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ft_helpers import finetune_cmd, packed, run, run_env

from ropescale.common.io import InputError, read_json, read_jsonl, share_private_files
from ropescale.common.process import free_port

ROOT = Path(__file__).resolve().parent.parent


def _one_line_exit_2(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert all(n in last for n in needles), last
    return last


@pytest.fixture()
def truncated(make_tiny_model, tmp_path):
    _, model_dir = make_tiny_model(orig_ctx=64)
    d = tmp_path / "cut"
    shutil.copytree(model_dir, d)
    f = d / "model.safetensors"
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(size // 2)
    return d, size


def test_truncated_weights_are_one_line_for_every_loader(truncated, tmp_path):
    d, size = truncated
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "a", "context": "文" * 20, "summary": "摘要"}, ensure_ascii=False) + "\n")
    half = f"{size // 2} of the {size} bytes"
    for cmd in (finetune_cmd("--model", d, "--out", tmp_path / "ft", "--max-steps", "1"),
                [sys.executable, str(ROOT / "eval_summ.py"), "generate", "--model", d, "--data", data, "--prompt",
                 "ft-ie", "--max-new-tokens", "4", "--out", tmp_path / "gen"],
                [sys.executable, "-m", "ropescale.probes", "ppl", "--model", d, "--out", tmp_path / "pr"]):
        last = _one_line_exit_2(run([str(c) for c in cmd], timeout=120), "model.safetensors", "truncated", half)
        assert last.startswith(f"error: {d / 'model.safetensors'}: ")
    assert not any((tmp_path / n).exists() for n in ("ft", "gen", "pr"))  # nothing written


def test_load_model_refuses_a_directory_without_weights(make_tiny_model, tmp_path):
    """merge --base-model, finetune, generate and the probes all load weights through rope_scaling.load."""
    from rope_scaling.load import load_config, load_model

    _, model_dir = make_tiny_model(orig_ctx=64)
    d = tmp_path / "noweights"
    d.mkdir()
    shutil.copy(model_dir / "config.json", d / "config.json")
    config = load_config(d).config
    with pytest.raises(InputError, match="model directory without weights"):
        load_model(d, config, dtype=torch.float32)
    # a sharded model whose index names a shard that is not there
    shutil.copy(model_dir / "model.safetensors", d / "model-00001-of-00002.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(InputError, match="missing weight shard.*model-00002-of-00002"):
        load_model(d, config, dtype=torch.float32)


def test_merge_with_a_weightless_base_model_is_one_line(make_tiny_model, tmp_path, capsys):
    from rope_scaling import RopeSpec
    from rope_scaling.load import load_config
    from ropescale.training.cli import main
    from ropescale.training.model import add_lora, load_model
    from ropescale.training.saving import export

    _, model_dir = make_tiny_model(orig_ctx=64)
    cfg = load_config(model_dir, RopeSpec("ntk", 8))
    peft_model, extra = add_lora(load_model(cfg, torch.float32, "sdpa"), gradient_checkpointing=False)
    export(peft_model, tmp_path / "run" / "final", extra_names=extra, base_model=str(model_dir), config=cfg.config,
           rope=cfg.rope.to_dict(), step=0, tokenizer_dir=model_dir)
    base = tmp_path / "base"
    base.mkdir()
    shutil.copy(model_dir / "config.json", base / "config.json")
    rc = main(["merge", "--run", str(tmp_path / "run" / "final"), "--base-model", str(base),
               "--out", str(tmp_path / "merged")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and not (tmp_path / "merged").exists()
    assert err.strip().splitlines()[-1] == f"error: {base}: model directory without weights (none of " \
                                           "model.safetensors, model.safetensors.index.json, pytorch_model.bin, " \
                                           "pytorch_model.bin.index.json)"


def test_json_errors_name_line_and_column(tmp_path):
    f = tmp_path / "x.jsonl"
    bad = '{"context": "abcdefghij", "x" 1}'  # the parser stops at column 31 (the 1 after "x")
    assert bad.index("1") + 1 == 31
    f.write_text('{"context": "ok"}\n\n' + bad + "\n")
    with pytest.raises(InputError) as e:
        list(read_jsonl(f))
    assert str(e.value) == f"{f}:3: malformed JSON: Expecting ':' delimiter (column 31)"
    g = tmp_path / "config.json"
    g.write_text('{\n  "a": 1,\n  "b": 2\n  "c": 3\n}\n')  # missing comma: the parser stops at line 4, column 3
    with pytest.raises(InputError) as e:
        read_json(g, "config.json")
    assert str(e.value) == f"{g}:4: malformed JSON: Expecting ',' delimiter (column 3)"
    g.write_text("[1, 2]")
    with pytest.raises(InputError, match="expected a JSON object, got list"):
        read_json(g, "config.json")


def test_an_absurd_scale_is_refused(make_tiny_model, tmp_path):
    from transformers import AutoConfig

    from rope_scaling import RopeSpec, apply_rope
    from rope_scaling.spec import MAX_CONTEXT

    assert MAX_CONTEXT == 16_777_216
    with pytest.raises(InputError, match="beyond 16,777,216 tokens"):
        RopeSpec("yarn", 1e9)
    RopeSpec("yarn", 2048, orig_ctx=8192)  # exactly 16,777,216: allowed
    with pytest.raises(InputError, match="beyond"):
        RopeSpec("yarn", 2049, orig_ctx=8192)
    _, model_dir = make_tiny_model(orig_ctx=64)
    with pytest.raises(InputError, match="beyond"):  # orig_ctx taken from the config: 64 x 300000 > 2**24
        apply_rope(AutoConfig.from_pretrained(str(model_dir)), RopeSpec("ntk", 300_000))
    proc = run(finetune_cmd("--rope", "yarn", "--scale", "1e9", "--max-steps", "1", "--out", tmp_path / "x"))
    _one_line_exit_2(proc, "scale 1e+09 asks for a context beyond 16,777,216 tokens")


def test_share_private_files_gives_the_umask_mode_only_to_0600_files(tmp_path):
    mask = os.umask(0o022)
    try:
        for name, mode in (("a.safetensors", 0o600), ("run.sh", 0o744), ("mine", 0o640)):
            (tmp_path / name).write_text("x")
            os.chmod(tmp_path / name, mode)
        assert share_private_files(tmp_path) == 1
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        assert modes == {"a.safetensors": 0o644, "run.sh": 0o744, "mine": 0o640}
    finally:
        os.umask(mask)


def test_launcher_json_is_json_and_checkpoints_follow_the_umask(make_tiny_model, chapters, tiny_tokenizer_dir,
                                                                 tmp_path):
    """deepspeed -q: the launcher's own INFO lines off stdout; ours are on stderr; every file the run wrote has the
    mode a plain open() gives (HF saves the checkpoint's adapter through safetensors as 0600). Run as a user would:
    without DS_ACCELERATOR (the launcher's "Setting accelerator to CPU" went to stdout; set-up's .pth sets it)."""
    _, model_dir = make_tiny_model(orig_ctx=64)
    data = packed(chapters, tiny_tokenizer_dir, tmp_path / "packed", 300, 480, n=8)
    out = tmp_path / "run"
    launcher = Path(sys.executable).parent / "deepspeed"
    cmd = [launcher, "-q", "--num_gpus", "2", "--master_port", free_port(), ROOT / "finetune.py", "--model",
           model_dir, "--data", data, "--rope", "yarn", "--scale", "8", "--deepspeed", "zero2", "--max-steps", "1",
           "--global-batch", "2", "--save-steps", "1", "--out", out, "--json"]
    old = os.umask(0o022)
    try:
        env = {k: v for k, v in run_env().items() if k != "DS_ACCELERATOR"}
        proc = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    finally:
        os.umask(old)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)  # the whole of stdout is one JSON object
    assert summary["run"] == str(out) and summary["steps"] == 1
    progress = re.compile(r"^[\w ]+:\s+\d+%\|.*\|")  # tqdm bars (finetune's, transformers' weight loading)
    noise = [ln for ln in proc.stderr.replace("\r", "\n").splitlines()
             if ln.strip() and not ln.startswith(("[finetune]", "[data]")) and not progress.match(ln)
             and "step 1/1" not in ln]
    assert noise == [], noise
    private = [str(p) for p in out.rglob("*") if p.is_file() and stat.S_IMODE(p.stat().st_mode) & 0o077 == 0]
    assert private == [], private
    assert (out / "checkpoint-1" / "adapter_model.safetensors").is_file()


def test_a_line_cut_short_names_its_own_line_and_last_column(tmp_path):
    """The issue's case: an error at the end of line 2 was reported as line 2 (or 3), column 1."""
    f = tmp_path / "pred.jsonl"
    f.write_text('{"prediction": "a", "reference": "b"}\n{"prediction": "a", "reference": \n')
    with pytest.raises(InputError) as e:
        list(read_jsonl(f))
    assert str(e.value) == f"{f}:2: malformed JSON: Expecting value (column 34)"
    assert len('{"prediction": "a", "reference": ') + 1 == 34  # just past the line's last character
