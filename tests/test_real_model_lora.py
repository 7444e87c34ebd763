"""A LoRA fine-tune of SmolLM2-135M with YaRN x2 (1 step on 2 packed 256-token Pride and Prejudice windows, lr 1e-2:
the code path, not a measurement), merged: plain transformers reloads the merged directory and gives, on 2,048 tokens
of the same novel, the logits of an independent reconstruction (the base weights under the run's config, the trained
embedding / norm tensors copied in, scaling x B @ A added to each adapted matrix), to 1e-4; its config carries YaRN
x2 as transformers' own ``yarn`` entries."""
from __future__ import annotations

import json

import torch
from ft_helpers import finetune_cmd, run

from data_concat.text import pack_text
from ropescale.common.paths import DATA_DIR


def test_merged_lora_run_reloads_in_plain_transformers_with_the_same_logits(smollm2, austen_ids, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from ropescale.training.cli import main

    data = pack_text([DATA_DIR / "english" / "austen" / "prideprejudice.txt"], smollm2, tmp_path / "data",
                     length=256, n=2)
    assert data["samples"] == 2
    out = tmp_path / "run"
    p = run(finetune_cmd("--model", smollm2, "--data", tmp_path / "data", "--rope", "yarn", "--scale", "2",
                         "--max-steps", "1", "--global-batch", "1", "--warmup-steps", "0", "--lr", "1e-2",
                         "--out", out), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    merged_dir = tmp_path / "merged"
    assert main(["merge", "--run", str(out), "--out", str(merged_dir)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.float32).eval()
    rope = merged.config.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 2 and rope["original_max_position_embeddings"] == 8192

    export = out / "final"
    cfg = AutoConfig.from_pretrained(str(export))
    ref = AutoModelForCausalLM.from_pretrained(str(smollm2), config=cfg, dtype=torch.float32).eval()
    acfg = json.loads((export / "adapter_config.json").read_text())
    scaling = acfg["lora_alpha"] / acfg["r"]
    params = dict(ref.named_parameters())
    adapter = load_file(str(export / "adapter_model.safetensors"))
    trained = load_file(str(export / "trained_tensors.safetensors"))
    with torch.no_grad():
        for n, t in trained.items():
            assert (t - params[n]).abs().max() > 1e-4, f"{n} was not trained"
            params[n].copy_(t)
        for k, a in adapter.items():
            if ".lora_A." in k:
                b = adapter[k.replace(".lora_A.", ".lora_B.")]
                params[k[len("base_model.model."):].split(".lora_A.")[0] + ".weight"] += scaling * (b @ a)
        ids = torch.tensor([austen_ids])
        diff = (merged(input_ids=ids).logits - ref(input_ids=ids).logits).abs().max()
    assert diff < 1e-4, diff
