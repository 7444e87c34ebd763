"""Issue 48's smaller promises, each as the docs state it: the wandb message, ``finetune.py plot RUN``, the loss curve's
plain axis, progress within a step, no CPU time estimate, no flag prefixes, outputs of the docs' commands ignored by
git, the real model's fp32 weights stored once, and ``--no-intervals`` where the docs say it is."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import types

import pytest

from ropescale.common.paths import REPO_ROOT


def test_report_to_wandb_without_wandb_says_it_is_missing(monkeypatch):
    from ropescale.common.io import InputError
    from ropescale.training import curves

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(InputError) as e:
        curves.check_report_to("wandb")
    assert "--report-to wandb: no wandb package is installed (pip install wandb)" in str(e.value)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("tensorboard", "tensorboardX") else real(name, *a))
    with pytest.raises(InputError, match="neither tensorboard nor tensorboardX is installed"):
        curves.check_report_to("tensorboard")


def log_run(d, losses):
    d.mkdir()
    (d / "train_log.jsonl").write_text("".join(json.dumps({"step": i + 1, "loss": v, "lr": 1e-5 * (i + 1)}) + "\n"
                                               for i, v in enumerate(losses)), encoding="utf-8")
    return d


def test_plot_takes_the_run_as_its_argument(tmp_path, capsys):
    from ropescale.cli import main

    run = log_run(tmp_path / "run", [2.0, 1.9, 1.8])
    assert main(["finetune", "plot", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "train_curves.png")
    assert (run / "train_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["finetune", "plot", "--run", str(run)]) == 0  # the old spelling still works


def test_a_flat_loss_is_drawn_flat_on_a_plain_axis(tmp_path):
    """SmolLM2's 2-step loss moved 0.0005 nats: the axis spans >= 10 % of the first loss and has no offset."""
    from ropescale.training.curves import curves_figure, read_log

    run = log_run(tmp_path / "run", [3.2101, 3.2106, 3.2098, 3.2104])
    fig = curves_figure(read_log(run), "run")
    fig.canvas.draw()
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert hi - lo >= 0.1 * 3.2101 and lo <= 3.2098 and hi >= 3.2106
    assert ax.yaxis.get_major_formatter().get_offset() == ""  # no "+3.21" above the axis
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and all(abs(float(x.replace("\u2212", "-")) - 3.21) < 0.5 for x in labels)  # plain values
    big = curves_figure(read_log(log_run(tmp_path / "big", [10.0, 6.0, 4.0])), "big")
    assert big.axes[0].get_ylim()[0] <= 4.0 and big.axes[0].get_ylim()[1] >= 10.0  # a real drop: its own range


def test_the_bar_moves_within_a_step():
    from ropescale.training.trainer import ProgressCallback

    trainer = types.SimpleNamespace(tokens_seen=0)
    cb = ProgressCallback(lambda: trainer, None, True, 1)
    args = types.SimpleNamespace(gradient_accumulation_steps=4)
    state = types.SimpleNamespace(max_steps=2, global_step=0)
    cb.on_train_begin(args, state, None)
    for _ in range(3):  # a step's first 3 micro-batches (the Trainer calls on_substep_end for all but the last)
        cb.on_substep_end(args, state, None)
    assert cb.bar.n == 3 and cb.bar.total == 8
    state.global_step = 1
    cb.on_step_end(args, state, None)
    assert cb.bar.n == 4
    cb.bar.close()


def test_no_time_estimate_on_a_cpu():
    from ropescale.training.run import step_time_note

    assert "s a step" not in step_time_note(0.0, cuda=False) and "no time estimate" in step_time_note(0.0, cuda=False)
    assert step_time_note(3.24, cuda=True) == ", ~3.2 s a step (the time model)"


def test_no_parser_accepts_a_prefix_of_a_flag():
    from ropescale.cli import TOOLS, tool
    from ropescale.common.cli import _commands

    for name in TOOLS:
        t = tool(name)
        ap = t.parser()
        parsers = [ap] + ([] if t.single else list(_commands(ap).values()))
        assert all(p.allow_abbrev is False for p in parsers), name
    with pytest.raises(SystemExit) as e:
        tool("finetune").parser().parse_args(["train", "--max-step", "2"])
    assert e.value.code == 2


def test_outputs_of_the_docs_commands_are_ignored_by_git():
    for path in ("data/packed/qwen1.5-7b-16k/train.parquet", "data/cnnsum/cnnsum_L_16k.jsonl", "runs/x/run.json",
                 "models/smollm2-135m/model.safetensors", "runs/.ropescale-outputs.json", ".ropescale-outputs.json"):
        r = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT)
        assert r.returncode == 0, f"{path} is not ignored"


def test_real_model_links_the_weights_once(tmp_path, monkeypatch):
    """models/smollm2-135m and .cache/gguf/ held the same 538 MB twice: the model directory's files are hard links
    to the converted cache's (one inode each)."""
    from ropescale import real_model
    from ropescale.common import gguf

    conv = tmp_path / "cache" / "conv"
    conv.mkdir(parents=True)
    (conv / "model.safetensors").write_bytes(b"\0" * 4096)
    (conv / "config.json").write_text("{}")
    (conv / gguf.RECORD).write_text(json.dumps({"sha256": real_model.GGUF_SHA256}))
    monkeypatch.setattr(real_model, "fetch_gguf", lambda: tmp_path / "x.gguf")
    monkeypatch.setattr(gguf, "cached_dir", lambda *a, **k: conv)
    out = tmp_path / "models" / "smollm2-135m"
    assert real_model.ensure(out)["action"] == "written"
    for f in conv.iterdir():
        assert (out / f.name).stat().st_ino == f.stat().st_ino, f.name
        assert (out / f.name).stat().st_nlink == 2


def test_no_intervals_is_where_the_docs_say():
    from ropescale.cli import tool
    from ropescale.common.cli import _commands

    usage = (REPO_ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    assert "`eval_summ.py report --no-intervals`" in usage and "probes' tables always carry them" in usage
    flags = lambda t, c: {o for a in _commands(tool(t).parser())[c]._actions for o in a.option_strings}  # noqa: E731
    assert "--no-intervals" in flags("eval", "report") and "--no-intervals" not in flags("probes", "report")


def test_a_model_directory_written_before_is_linked_to_the_cache(tmp_path):
    from ropescale.real_model import store_once

    cache, out = tmp_path / "cache", tmp_path / "out"
    cache.mkdir()
    out.mkdir()
    for name, data in (("model.safetensors", b"w" * 5000), ("config.json", b"{}"), ("tokenizer.json", b"tok")):
        (cache / name).write_bytes(data)
        (out / name).write_bytes(data if name != "tokenizer.json" else b"TOK")  # one file differs: kept
    assert store_once(out, cache) == 5002
    assert (out / "model.safetensors").stat().st_ino == (cache / "model.safetensors").stat().st_ino
    assert (out / "tokenizer.json").read_bytes() == b"TOK"
    assert (out / "tokenizer.json").stat().st_ino != (cache / "tokenizer.json").stat().st_ino
    assert store_once(out, cache) == 0 and sorted(p.name for p in out.iterdir()) == sorted(p.name for p in
                                                                                          cache.iterdir())


def test_the_recall_shortfall_names_max_answer_tokens(tmp_path, capsys):
    """"0 of 1 samples fit (use fewer --n, a shorter --target ...)" named a flag recall does not have; the cause was
    --max-answer-tokens. The hint's number is checked by using it: with that cap the sample fits."""
    from ropescale.cli import main
    from ropescale.common.paths import CHAPTERS_JSONL

    argv = ["data", "recall", "--chapters", str(CHAPTERS_JSONL), "--tokenizer", str(REPO_ROOT / "assets" / "tiny"),
            "--eval-tokens", "1024", "--marks", "3", "--n", "1", "--out", str(tmp_path / "e.jsonl")]
    capsys.readouterr()
    assert main(argv + ["--max-answer-tokens", "24"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--target" not in err[0] and "more than --max-answer-tokens 24" in err[0], err
    need = int(err[0].split("take up to ")[1].split()[0])
    assert need > 24 and not (tmp_path / "e.jsonl").exists()
    assert main(argv + ["--max-answer-tokens", str(need)]) == 0


def test_plot_redraws_the_runs_own_figure_however_it_is_named(tmp_path, capsys):
    from ropescale.cli import main

    run = log_run(tmp_path / "run", [2.0, 1.9])
    assert main(["finetune", "plot", str(run)]) == 0
    assert main(["finetune", "plot", str(run), "--out", str(run / "train_curves.png")]) == 0  # its own: no refusal
    assert main(["finetune", "plot", str(run), "--out", str(run / "x.png")]) == 0
    assert main(["finetune", "plot", str(run), "--out", str(run / "x.png")]) == 0  # written by the tool: replaced
