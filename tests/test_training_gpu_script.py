"""bench/gpu_train_step.py in its CPU toy mode: the GPU's mixed-precision path (bf16 weights + autocast, fp32
trained tensors) runs, and ours and the plain HF Trainer + PEFT loop train identically."""
from __future__ import annotations

import json
import subprocess
import sys

import torch
from ft_helpers import ROOT, run_env


def test_gpu_script_toy_bf16_ours_vs_baseline():
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_train_step.py"), "--toy", "--bf16", "--seq", "96", "--warmup",
           "1", "--steps", "2", "--baseline", "--json"]
    p = subprocess.run(cmd, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=170)
    assert p.returncode == 0, p.stderr[-2000:]
    res = {r["variant"]: r for r in json.loads(p.stdout.strip().splitlines()[-1])["results"]}
    assert set(res) == {"ours", "baseline"}
    for r in res.values():
        assert not r["oom"] and r["tokens_per_s"] > 0 and r["dtype"] == "bfloat16" and r["seq"] == 96
        assert r["trainable_params"] < r["total_params"]
    # the same training (same data, init, seed): the label-only loss and HF's full-logits loss agree
    assert abs(res["ours"]["final_loss"] - res["baseline"]["final_loss"]) < 2e-3


def test_fp32_master_keeps_the_residual_stream_in_bf16(make_tiny_model):
    from ropescale.training.loss import label_only_loss
    from ropescale.training.model import add_lora, fp32_master

    model, _ = make_tiny_model(save=False)
    model = model.to(torch.bfloat16)
    pm, extra = add_lora(model, r=4, alpha=8, dropout=0.0, gradient_checkpointing=True)
    fp32_master(pm, torch.bfloat16)
    trained = [p for p in pm.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.float32 for p in trained)
    assert all(p.dtype == torch.bfloat16 for p in pm.parameters() if not p.requires_grad)
    seen = []
    lm = pm.get_base_model()
    lm.model.layers[0].register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("hidden_states", a[0] if a
                                                                                      else None).dtype),
                                                 with_kwargs=True)
    ids = torch.randint(0, model.config.vocab_size, (1, 32))
    labels = ids.clone()
    pm.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = label_only_loss(pm, ids, labels)
    loss.backward()
    assert seen and seen[0] == torch.bfloat16
    emb = pm.get_input_embeddings().weight
    assert emb.grad is not None and emb.grad.dtype == torch.float32 and emb.grad.abs().sum() > 0
