"""Issue 22: the bare default trains (no flags but a step count) and prints no warning a user cannot act on."""
from __future__ import annotations

import json

from ft_helpers import finetune_cmd, run, train_log

from ropescale.training.data import default_data_range


def test_default_data_range_fills_the_context_when_the_target_does_not_fit():
    # 2 x 512 = 1024 around the paper's 7/8..9/8 proportions when the context is extended to 4096
    assert default_data_range(512, 4096, 2.0) == (1024, 896, 1152)
    # unscaled: 2 x 512 cannot fit 512 tokens, so half the context to all of it
    assert default_data_range(512, 512, 2.0) == (384, 256, 512)
    # x2: 9/8 x 1024 = 1152 > 1024 does not fit either
    assert default_data_range(512, 1024, 2.0) == (768, 512, 1024)


def test_bare_default_trains_and_says_what_it_chose(tmp_path):
    out = tmp_path / "run"
    proc = run(finetune_cmd("--max-steps", "1", "--out", out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(out)
    assert "no RoPE scaling (--rope none): training inside the model's own 512-token context" in proc.stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["rope"]["method"] == "none" and meta["status"] == "done"
    assert meta["info"]["data_stats"]["max"] <= 512 and meta["info"]["grad_accum"] == 4  # tiny recipe: 4, ZeRO-3
    assert [r["step"] for r in train_log(out)] == [1]
    # the Trainer and accelerate agree on gradient accumulation: no "mismatch" warning under DeepSpeed
    assert "mismatch" not in proc.stderr.lower(), proc.stderr
