"""finetune.py under DeepSpeed ZeRO-2 with CPU offload, one process without the launcher (python finetune.py):
the run finishes, and the export holds the trained embedding/norm tensors."""
from __future__ import annotations

import json

from ft_helpers import finetune_cmd, packed, run, train_log


def test_zero2_offload_single_process(tmp_path, make_tiny_model, chapters, tiny_tokenizer_dir):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    _, model_dir = make_tiny_model(orig_ctx=64)
    data = packed(chapters, tiny_tokenizer_dir, tmp_path / "packed", 300, 480, n=12)
    out = tmp_path / "run"
    p = run(finetune_cmd("--model", model_dir, "--data", data, "--rope", "yarn", "--scale", "8", "--deepspeed",
                         "zero2_offload", "--max-steps", "2", "--global-batch", "2", "--save-steps", "2",
                         "--warmup-steps", "0", "--lr", "1e-2", "--output-dir", out))
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == str(out)
    meta = json.loads((out / "run.json").read_text())
    assert meta["info"]["world_size"] == 1 and meta["info"]["grad_accum"] == 2 and meta["rope"]["method"] == "yarn"
    assert [r["step"] for r in train_log(out)] == [1, 2]
    base = dict(AutoModelForCausalLM.from_pretrained(str(model_dir)).named_parameters())
    for name, t in load_file(str(out / "final" / "trained_tensors.safetensors")).items():
        assert t.shape == base[name].shape and (t - base[name].detach()).abs().max() > 1e-4, name
