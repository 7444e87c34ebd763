"""finetune.py end to end on CPU: a 2-process DeepSpeed ZeRO-3 + CPU-offload run through the `deepspeed`
launcher on a tiny model built from a config, what it saves, and merging it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from ft_helpers import ROOT, packed, run, train_log

from ropescale.common.process import free_port

STEPS = 3


@pytest.fixture(scope="module")
def ds_run(tmp_path_factory, make_tiny_model, chapters, tiny_tokenizer_dir):
    tmp = tmp_path_factory.mktemp("ft_ds")
    _, model_dir = make_tiny_model(orig_ctx=64)
    data = packed(chapters, tiny_tokenizer_dir, tmp / "packed", 300, 480)
    out = tmp / "run"
    launcher = Path(sys.executable).parent / "deepspeed"
    cmd = [str(launcher), "--num_gpus", "2", "--master_port", str(free_port()), str(ROOT / "finetune.py"),
           "--model", model_dir, "--data", data, "--rope", "ntk", "--scale", "8",
           "--deepspeed", "zero3_offload", "--max-steps", STEPS, "--global-batch", "2", "--save-steps", "2",
           "--warmup-steps", "0", "--lr", "1e-2", "--output-dir", out, "--report-to", "tensorboard"]
    proc = run([str(c) for c in cmd], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"model_dir": model_dir, "run": out, "proc": proc, "data": data}


def test_launcher_run_two_processes_zero3_offload(ds_run):
    out, proc = ds_run["run"], ds_run["proc"]
    assert str(out) in proc.stdout.splitlines()  # the run dir is printed at the end
    meta = json.loads((out / "run.json").read_text())
    st, info = meta["settings"], meta["info"]
    assert meta["kind"] == "finetune" and meta["status"] == "done" and info["steps"] == STEPS
    assert info["world_size"] == 2 and info["grad_accum"] == 1 and st["deepspeed"].endswith("zero3_offload.json")
    assert meta["rope"]["method"] == "ntk" and meta["rope"]["scale"] == 8
    assert st["max_steps"] == STEPS and st["lr"] == 1e-2 and meta["model"] == str(ds_run["model_dir"])
    log = train_log(out)
    assert [r["step"] for r in log] == [1, 2, 3]
    assert all(r["tokens_per_s"] > 0 and r["peak_mem_mb"] > 0 and r["lr"] == 1e-2 for r in log)
    # the curves: the loss-and-lr PNG (rank 0) and, with --report-to tensorboard, transformers' own event files
    assert (out / "train_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert "trainable params:" in proc.stderr and "tok/s" in proc.stderr
    for d in (out / "final", out / "checkpoint-2" / "export"):
        assert (d / "adapter_model.safetensors").is_file() and (d / "trained_tensors.safetensors").is_file()
    # the rope setting is in every saved config (ntk x8 = default rope type with a larger base)
    from transformers import AutoConfig

    from rope_scaling import read_rope

    for d in (out, out / "final"):
        spec = read_rope(AutoConfig.from_pretrained(str(d)))
        assert spec.method == "ntk" and spec.scale == 8 and spec.orig_ctx == 64


def test_saved_embedding_and_norms_nonempty_and_trained(ds_run):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = dict(AutoModelForCausalLM.from_pretrained(str(ds_run["model_dir"])).named_parameters())
    trained = load_file(str(ds_run["run"] / "final" / "trained_tensors.safetensors"))
    n_layers = 2
    assert set(trained) == ({"model.embed_tokens.weight", "model.norm.weight"}
                            | {f"model.layers.{i}.{k}.weight" for i in range(n_layers)
                               for k in ("input_layernorm", "post_attention_layernorm")})
    for name, t in trained.items():
        assert t.numel() > 0 and t.shape == base[name].shape, name  # never the empty ZeRO-3 partitions
        assert (t - base[name].detach()).abs().max() > 1e-4, f"{name} was not trained"
    adapter = load_file(str(ds_run["run"] / "final" / "adapter_model.safetensors"))
    assert len(adapter) == 2 * 4 * n_layers  # A and B of q,k,v,o in each layer
    assert all(t.numel() > 0 for t in adapter.values())
    # lora_B starts at zero (PEFT init) and was trained
    assert any(t.abs().max() > 0 for k, t in adapter.items() if "lora_B" in k)


def test_merged_model_logits_equal_independent_reconstruction(ds_run, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from ropescale.training.cli import main

    merged_dir = tmp_path / "merged"
    assert main(["merge", "--run", str(ds_run["run"]), "--out", str(merged_dir)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir)).eval()  # plain transformers
    # independent: the base weights under the trained config, + trained tensors, + scaling * B @ A per layer
    export = ds_run["run"] / "final"
    cfg = AutoConfig.from_pretrained(str(export))
    ref = AutoModelForCausalLM.from_pretrained(str(ds_run["model_dir"]), config=cfg).eval()
    acfg = json.loads((export / "adapter_config.json").read_text())
    scaling = acfg["lora_alpha"] / acfg["r"]
    params = dict(ref.named_parameters())
    adapter = load_file(str(export / "adapter_model.safetensors"))
    with torch.no_grad():
        for n, t in load_file(str(export / "trained_tensors.safetensors")).items():
            params[n].copy_(t)
        for k, a in adapter.items():
            if ".lora_A." not in k:
                continue
            b = adapter[k.replace(".lora_A.", ".lora_B.")]
            mod = k[len("base_model.model."):].split(".lora_A.")[0]
            params[mod + ".weight"] += scaling * (b @ a)
    ids = torch.randint(0, cfg.vocab_size, (2, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (merged(input_ids=ids).logits - ref(input_ids=ids).logits).abs().max()
    assert diff < 1e-4, diff
    assert merged.config.rope_parameters == cfg.rope_parameters  # the rope setting survived the merge


def test_init_from_continues_from_a_checkpoint_export(ds_run, tmp_path):
    """The 32K recipes start from the 16K run's step-300 export: --init-from RUN --init-step N (ZeRO-3 here, where
    the embedding and norms are partitioned while loading). With lr 1e-30 (lr must be > 0) every update is below
    fp32 resolution, so the new run's tensors equal the source bit for bit."""
    from ft_helpers import finetune_cmd
    from safetensors.torch import load_file

    out = tmp_path / "cont"
    p = run(finetune_cmd("--model", ds_run["model_dir"], "--data", ds_run["data"], "--rope", "ntk", "--scale", "8",
                         "--deepspeed", "zero3_offload", "--init-from", ds_run["run"], "--init-step", "2",
                         "--max-steps", "1", "--global-batch", "1", "--lr", "1e-30", "--warmup-steps", "0",
                         "--lora-dropout", "0", "--output-dir", out), timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    src = ds_run["run"] / "checkpoint-2" / "export"
    for f in ("trained_tensors.safetensors", "adapter_model.safetensors"):
        a, b = load_file(str(src / f)), load_file(str(out / "final" / f))
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), (f, k)
    # and the source differs from the base model (so equality is not trivially true)
    assert not torch.equal(load_file(str(src / "trained_tensors.safetensors"))["model.norm.weight"],
                           torch.ones(64))
    bad = run(finetune_cmd("--model", ds_run["model_dir"], "--data", ds_run["data"], "--rope", "ntk", "--scale",
                           "8", "--init-from", ds_run["run"], "--init-step", "7", "--output-dir", tmp_path / "x"))
    assert bad.returncode == 2 and "step 7" in bad.stderr
