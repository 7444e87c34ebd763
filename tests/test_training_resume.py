"""kill -9 in the middle of a run, then --resume auto: the same loss curve as an uninterrupted run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from ft_helpers import ROOT, finetune_cmd, packed, run, run_env, train_log

STEPS = 10


def _args(model_dir, data, out):
    return ["--model", model_dir, "--data", data, "--rope", "pi", "--scale", "8", "--max-steps", STEPS,
            "--global-batch", "2", "--save-steps", "2", "--warmup-steps", "3", "--lr", "5e-3", "--seed", "7",
            "--output-dir", out]


def test_kill9_then_resume_auto_gives_the_same_loss_curve(tmp_path, make_tiny_model, chapters, tiny_tokenizer_dir):
    _, model_dir = make_tiny_model(orig_ctx=64)
    data = packed(chapters, tiny_tokenizer_dir, tmp_path / "packed", 300, 480)
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"

    ref = run(finetune_cmd(*_args(model_dir, data, ref_dir)))
    assert ref.returncode == 0, ref.stderr[-2000:]
    ref_log = train_log(ref_dir)
    assert [r["step"] for r in ref_log] == list(range(1, STEPS + 1))

    proc = subprocess.Popen(finetune_cmd(*_args(model_dir, data, cut_dir)), cwd=ROOT, env=run_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 90
    try:
        while time.time() < deadline and proc.poll() is None:
            log = train_log(cut_dir) if (cut_dir / "train_log.jsonl").is_file() else []
            if log and log[-1]["step"] >= 5 and (cut_dir / "checkpoint-4" / "export").is_dir():
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    killed_at = train_log(cut_dir)[-1]["step"]
    assert 5 <= killed_at < STEPS
    assert not (cut_dir / "final").exists()

    again = run(finetune_cmd(*_args(model_dir, data, cut_dir), "--resume", "auto"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming from" in again.stderr and "checkpoint-" in again.stderr
    cut_log = train_log(cut_dir)
    assert [r["step"] for r in cut_log] == list(range(1, STEPS + 1))  # each step once
    for a, b in zip(ref_log, cut_log):
        assert abs(a["loss"] - b["loss"]) < 1e-4, [(x["step"], x["loss"], y["loss"]) for x, y in zip(ref_log, cut_log)]
        assert abs(a["lr"] - b["lr"]) < 1e-12, (a, b)
    assert json.loads((cut_dir / "run.json").read_text())["status"] == "done"
    # a different rope setting cannot resume this run
    bad = run(finetune_cmd(*_args(model_dir, data, cut_dir), "--resume", "auto", "--rope", "ntk"))
    assert bad.returncode == 2 and "--resume" in bad.stderr and "rope" in bad.stderr
