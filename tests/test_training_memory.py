"""ropescale.training.memory on toy Qwen2 / Llama models in fp32: checkpoints offloaded to host memory, the tiled MLP
and both give the loss and every trained gradient of the plain gradient-checkpointed path (to 1e-5), on plain and PEFT
LoRA models; the host-memory refusal; the settings' auto rules; the CUDA allocator setting (ropescale.common.process);
the trainer's per-step / steady rates (ropescale.training.trainer); the ZeRO-3 path; bench/bench_train_path.py's toy
mode. On a machine with CUDA the equality tests also run on the GPU (pinned pages, the side stream)."""
from __future__ import annotations

import argparse
import gc
import weakref

import pytest
import torch

from ropescale.common.io import InputError
from ropescale.training.loss import label_only_loss
from ropescale.training.memory import estimate, install, offload, tiled_mlp

TOL = dict(rtol=1e-5, atol=1e-5)
LORA = ("q_proj", "v_proj", "gate_proj", "up_proj", "down_proj")  # the LoRA target modules of the LoRA cases
# CUDA too where there is one (pinned pages, the side stream, events): the same tests, no skips on a CPU
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _batch(vocab, B=2, T=48, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    labels = ids.clone()
    labels[0, :7] = -100
    labels[1, 20:31] = -100
    return ids.to(device), labels.to(device)



def _step(model, ids, labels):
    model.zero_grad(set_to_none=True)
    loss = label_only_loss(model, ids, labels, chunk=16)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


def _assert_same(a, b):
    (la, ga), (lb, gb) = a, b
    assert torch.allclose(la, lb, **TOL), (la, lb)
    assert ga.keys() == gb.keys() and ga
    for n in ga:
        assert gb[n] is not None and torch.allclose(ga[n], gb[n], **TOL), (n, (ga[n] - gb[n]).abs().max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("variant", ["offload", "tile", "both"])
def test_offload_and_tiled_mlp_match_plain_checkpointing(train_model, arch, variant, device):
    ids, labels = _batch(1000, device=device)
    ref_model = train_model(arch, device=device)
    ref = [_step(ref_model, ids, labels), _step(ref_model, ids[:, :40], labels[:, :40])]
    model = train_model(arch, device=device)
    off = None
    if variant in ("offload", "both"):
        # 1,000-byte pages: each 24 KiB checkpoint spans 25 pages, the last one partly
        off = offload.enable_checkpoint_offload(model, offload.CheckpointOffloader(page_bytes=1000,
                                                                                  pin=device == "cuda"))
    if variant in ("tile", "both"):
        assert tiled_mlp.enable_tiled_mlp(model, 20) == model.config.num_hidden_layers  # 96 rows: 5 chunks, last 16
    got = _step(model, ids, labels)
    _assert_same(got, ref[0])
    if off is not None:
        layers = model.config.num_hidden_layers
        # every layer's checkpoint went out and came back; all but the top one were prefetched
        assert off.stats["offloaded"] == layers and off.stats["late"] == 1 and off.stats["prefetched"] == layers - 1
        assert off.stats["bytes_to_host"] == off.stats["bytes_to_device"] == layers * 2 * 48 * 64 * 4
        pages = off.pages_allocated
        assert pages == layers * 25 and len(off._free) == pages  # all back in the pool after backward
    # a second, shorter step reuses the pool's pages
    _assert_same(_step(model, ids[:, :40], labels[:, :40]), ref[1])
    if off is not None:
        assert off.pages_allocated == pages and len(off._free) == pages


@pytest.mark.parametrize("device", DEVICES)
def test_offloaded_checkpoints_leave_the_device(train_model, device):
    """After the forward, no decoder layer's input is alive any more (the plain path keeps every one)."""
    ids, labels = _batch(1000, device=device)

    def alive_after_forward(model):
        refs = []
        hooks = [layer.register_forward_pre_hook(lambda m, a, kw: refs.append(weakref.ref(
            a[0] if a else kw["hidden_states"])), with_kwargs=True) for layer in model.model.layers]
        loss = label_only_loss(model, ids, labels)
        gc.collect()
        n = sum(r() is not None for r in refs)
        loss.backward()
        for h in hooks:
            h.remove()
        return n

    plain = train_model("qwen2", device=device)
    assert alive_after_forward(plain) == plain.config.num_hidden_layers
    model = train_model("qwen2", device=device)
    offload.enable_checkpoint_offload(model, offload.CheckpointOffloader(page_bytes=4096, pin=device == "cuda"))
    assert alive_after_forward(model) == 0



@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_peft_lora_with_offload_and_tiled_mlp_matches_plain(train_model, arch, device):
    ids, labels = _batch(1000, seed=2, device=device)
    ref = _step(train_model(arch, lora=LORA, device=device), ids, labels)
    pm = train_model(arch, lora=LORA, device=device)
    args = argparse.Namespace(offload_checkpoints="true", tile_mlp=24, gradient_checkpointing=True)
    plan = install.setup_memory(pm, args, max_len=96, cuda=device == "cuda", dtype=torch.float32, page_bytes=512,
                               quiet=True, available=2**40)
    assert plan.offload_checkpoints and plan.tile_mlp == 24 and pm._ropescale_memory is plan
    got = _step(pm, ids, labels)
    assert any("mlp" in n and "lora_A" in n for n in got[1])  # LoRA on the MLP: gradients through the tiles
    _assert_same(got, ref)
    assert plan.offloader.stats["offloaded"] == pm.get_base_model().config.num_hidden_layers
    assert plan.offloader.host_bytes == 2 * 48 * 512 and "offload_host_mb" in plan.record()


@pytest.mark.parametrize("device", DEVICES)
def test_tiled_mlp_replays_dropout(train_model, device):
    """With LoRA dropout on the MLP, the backward's recomputed chunks see the forward's dropout masks: the same
    gradients as the chunked MLP kept in autograd (same seed)."""
    ids, labels = _batch(1000, seed=3, device=device)

    def run(tile):
        pm = train_model("qwen2", lora=LORA, dropout=0.3, gradient_checkpointing=False, device=device)
        if tile:
            tiled_mlp.enable_tiled_mlp(pm, 20)
        else:  # the reference: the same chunks, everything kept for backward
            for layer in pm.get_base_model().model.layers:
                own = layer.mlp.forward
                layer.mlp.forward = lambda x, own=own: torch.cat(
                    [own(c) for c in x.reshape(-1, x.shape[-1]).split(20)]).view(*x.shape[:-1], -1)
        torch.manual_seed(123)
        return _step(pm, ids, labels)

    _assert_same(run(True), run(False))


def test_tiled_mlp_off_restores_and_no_grad_is_chunked(make_tiny_model):
    model, _ = make_tiny_model(save=False)
    mlp = model.model.layers[0].mlp
    x = torch.randn(2, 33, model.config.hidden_size)
    with torch.no_grad():
        ref = mlp(x)
        tiled_mlp.enable_tiled_mlp(model, 8)
        tiled_mlp.enable_tiled_mlp(model, 5)  # re-tiling starts from the MLP's own forward
        assert mlp.forward._ropescale_tiled == 5
        assert torch.allclose(mlp(x), ref, **TOL)
        tiled_mlp.enable_tiled_mlp(model, 0)
        assert "forward" not in mlp.__dict__ and torch.equal(mlp(x), ref)


# ---------------------------------------------------------------- the memory planner's activation choices
def test_layer_roles_by_hand():
    r = estimate.layer_roles
    assert r(4) == [("gpu", 0)] * 4  # every layer recomputed, every input stored on the device
    assert r(4, offload=True) == [("host", 0)] * 4
    assert r(5, recompute_every=2) == [("gpu", 0), ("none", 0), ("gpu", 0), ("none", 0), ("gpu", 0)]
    assert r(3, recompute_every=0) == [("none", 0)] * 3
    # blocks of 3 over 8 layers: inputs of 0, 3, 6 stored, the others recomputed from them in backward
    block3 = [("gpu", 0), ("derived", 1), ("derived", 2)] * 2 + [("gpu", 0), ("derived", 1)]
    assert r(8, block=3) == block3
    # offloaded, the top 2 stored inputs (layers 3 and 6) stay on the device: backward needs them first
    assert r(8, block=3, offload=True, gpu_checkpoints=2) == [("host", 0)] + block3[1:]
    assert r(4, offload=True, gpu_checkpoints=9) == [("gpu", 0)] * 4
    assert r(4, recompute_every=2, block=2) == r(4, recompute_every=2)  # blocks only with every layer recomputed


PLANS = {"every-2nd-layer": dict(recompute_every=2), "no-recompute": dict(recompute_every=0),
         "block-2-host": dict(checkpoint_block=2, offload_checkpoints=True),
         "block-3-device": dict(checkpoint_block=3, offload_checkpoints=False),
         "device-and-host": dict(offload_checkpoints=True, gpu_checkpoints=2),
         "block-2-split-tiled": dict(checkpoint_block=2, offload_checkpoints=True, gpu_checkpoints=1, tile_mlp=20)}


_PLAIN: dict = {}  # the plain path's (loss, gradients) per (device, MLP tile)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(PLANS))
def test_plan_paths_match_plain_checkpointing(train_model, name, device):
    """Selective recompute, block checkpoints (an upper layer's input recomputed from its block's stored one, with
    the forward's dropout masks) and checkpoints split between the device and the host give the plain
    gradient-checkpointed path's loss and every trained gradient: a 5-layer PEFT model, LoRA dropout 0.3 on the
    attention and the MLP."""
    from ropescale.training.memory.plan import Plan

    ids, labels = _batch(1000, seed=4, device=device)

    def run(plan):
        pm = train_model("qwen2", lora=LORA, dropout=0.3, device=device, num_layers=5)
        mp = None
        if plan is not None:
            mp = install.setup_memory(pm, argparse.Namespace(), max_len=96, cuda=device == "cuda", dtype=torch.float32,
                                     page_bytes=512, quiet=True, available=2**40, plan=plan)
        torch.manual_seed(123)
        return _step(pm, ids, labels), mp

    plan = Plan(**PLANS[name])
    # a tiled MLP draws its dropout masks chunk by chunk: the reference tiles it too (and stores every checkpoint);
    # one reference per (device, tile) for all the variants
    key = (device, plan.tile_mlp)
    if key not in _PLAIN:
        _PLAIN[key] = run(Plan(tile_mlp=plan.tile_mlp) if plan.tile_mlp else None)[0]
    ref = _PLAIN[key]
    got, mp = run(plan)
    _assert_same(got, ref)
    rec = mp.record()
    if name == "block-2-host":  # stored: layers 0, 2, 4 (to the host); 1 and 3 recomputed from 0 and 2
        st = mp.offloader.stats
        assert st["offloaded"] == 3 and st["recomputed"] == 2 and st["late"] == 1 and st["prefetched"] == 2
        assert rec["host_checkpoints"] == 3 and rec["checkpoint_block"] == 2
    if name == "device-and-host":  # layers 3, 4 on the device; 0-2 on the host, all prefetched
        st = mp.offloader.stats
        assert st["offloaded"] == 3 and st["late"] == 0 and st["prefetched"] == 3
        assert rec["gpu_checkpoints"] == 2 and rec["host_checkpoints"] == 3
    if name == "every-2nd-layer":
        assert mp.count("none") == 2 and rec["recompute_every"] == 2 and mp.offloader is None


def test_block_checkpoints_keep_only_the_blocks_inputs(make_tiny_model):
    """With blocks of 2 on 5 layers only the inputs of layers 0, 2 and 4 are alive after the forward."""
    from ropescale.training.memory.plan import Plan

    ids, labels = _batch(1000)
    model, _ = make_tiny_model(arch="qwen2", save=False, num_layers=5)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    install.setup_memory(model, argparse.Namespace(), max_len=96, cuda=False, dtype=torch.float32, quiet=True,
                        plan=Plan(checkpoint_block=2))
    refs = []
    hooks = [layer.register_forward_pre_hook(lambda m, a, kw: refs.append(weakref.ref(
        a[0] if a else kw["hidden_states"])), with_kwargs=True) for layer in model.model.layers]
    loss = label_only_loss(model, ids, labels)
    gc.collect()
    assert [r() is not None for r in refs] == [True, False, True, False, True]
    loss.backward()
    for h in hooks:
        h.remove()


# ---------------------------------------------------------------- settings and host memory
def test_auto_rules():
    big, small = estimate.AUTO_MIN_TOKENS, estimate.AUTO_MIN_TOKENS - 1
    assert install.resolve_offload("auto", cuda=True, gradient_checkpointing=True, tokens=big)
    assert not install.resolve_offload("auto", cuda=True, gradient_checkpointing=True, tokens=small)
    assert not install.resolve_offload("auto", cuda=False, gradient_checkpointing=True, tokens=big)
    assert not install.resolve_offload("auto", cuda=True, gradient_checkpointing=False, tokens=big)
    assert install.resolve_offload("yes", cuda=False, gradient_checkpointing=True, tokens=1)
    assert not install.resolve_offload(False, cuda=True, gradient_checkpointing=True, tokens=big)
    with pytest.raises(InputError, match="--offload-checkpoints must be auto, true or false"):
        install.parse_offload("sometimes")
    with pytest.raises(InputError, match="needs --gradient-checkpointing"):
        install.resolve_offload("true", cuda=True, gradient_checkpointing=False, tokens=big)
    assert install.resolve_tile(None, cuda=True, tokens=big, hidden=4096) == 4096
    assert install.resolve_tile("auto", cuda=True, tokens=small, hidden=4096) == 0
    assert install.resolve_tile(None, cuda=False, tokens=big, hidden=4096) == 0
    assert install.resolve_tile(1024, cuda=False, tokens=8, hidden=4096) == 1024
    assert install.resolve_tile(0, cuda=True, tokens=big, hidden=4096) == 0


def test_host_memory_figures_for_a_7b_layer_stack():
    # Qwen1.5-7B at 256K tokens, bf16: 2 GiB a layer, 64 GiB for 32 layers (whole 32 MiB pages)
    assert offload.checkpoint_bytes(1, 262144, 4096, 2) == 2 * 2**30
    assert offload.pool_bytes(32, 262144, 4096, 2) == 64 * 2**30
    assert offload.pool_bytes(2, 1000, 10, 2, page_bytes=4096) == 2 * 5 * 4096  # 20,000 bytes -> 5 pages
    need = offload.pool_bytes(32, 262144, 4096, 2)
    assert offload.check_host_memory(need, what="x", available=100 * 2**30) == 100 * 2**30
    with pytest.raises(InputError) as e:
        offload.check_host_memory(need, what="offloading the checkpoints", available=48 * 2**30)
    msg = str(e.value)
    assert "\n" not in msg and "64.0 GiB" in msg and "48.0 GiB" in msg and "--offload-checkpoints false" in msg
    # DeepSpeed's offloaded optimizer (631M trained params) is counted too, and each local process needs its own
    extra = offload.ds_offload_extra({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}, 631_000_000)
    assert extra == 631_000_000 * 16
    assert offload.ds_offload_extra({"zero_optimization": {"offload_optimizer": {"device": "none"}}}, 10) == 0
    with pytest.raises(InputError, match="DeepSpeed's offloaded optimizer states"):
        offload.check_host_memory(need, what="x", extra=extra, extra_what="DeepSpeed's offloaded optimizer states",
                                 available=75 * 2**30)
    with pytest.raises(InputError, match="in each of 2 processes"):
        offload.check_host_memory(need, what="x", available=100 * 2**30, processes=2)


def test_setup_refuses_before_touching_the_model_when_host_memory_is_short(train_model, monkeypatch):
    pm = train_model("qwen2", lora=LORA)
    layers = pm.get_base_model().model.layers
    funcs = [layer._gradient_checkpointing_func for layer in layers]
    # 2 layers x 262,144 tokens x 64 x 4 bytes = 128 MiB of checkpoints; the machine "has" 100 MiB
    monkeypatch.setattr(offload, "available_host_bytes", lambda: 100 * 2**20)
    args = argparse.Namespace(offload_checkpoints="auto", tile_mlp=None, gradient_checkpointing=True)
    with pytest.raises(InputError, match=r"host memory: .* needs 0\.1 GiB .* only 100\.0 MiB is available"):
        install.setup_memory(pm, args, max_len=262144, cuda=True, dtype=torch.float32, quiet=True)
    assert [layer._gradient_checkpointing_func for layer in layers] == funcs
    assert "forward" not in layers[0].mlp.__dict__ and not hasattr(pm, "_ropescale_memory")
    monkeypatch.setattr(offload, "available_host_bytes", lambda: 8 * 2**30)
    plan = install.setup_memory(pm, args, max_len=262144, cuda=True, dtype=torch.float32, quiet=True)
    assert plan.offload_checkpoints and plan.tile_mlp == 64 and plan.host_pool_bytes == 128 * 2**20
    assert plan.offloader.pin is True  # pinned pages on CUDA (allocated at the first forward)


def test_available_host_bytes_without_psutil(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil -> ImportError: /proc/meminfo
    n = offload.available_host_bytes()
    assert isinstance(n, int) and n > 2**20


# ---------------------------------------------------------------- the allocator setting (ropescale.common.process)
def test_expandable_segments_on_cuda_unless_the_user_chose():
    from ropescale.common.process import setup_env

    env = {}
    assert setup_env(env, cuda=True)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and "DS_ACCELERATOR" not in env
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    assert "PYTORCH_CUDA_ALLOC_CONF" not in setup_env(env, cuda=True)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"
    env = {"PYTORCH_ALLOC_CONF": "expandable_segments:False"}  # torch's newer name counts as the user's choice
    setup_env(env, cuda=True)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    env = {}
    set_ = setup_env(env, cuda=False)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and "PYTORCH_CUDA_ALLOC_CONF" not in set_
    assert env["DS_ACCELERATOR"] == "cpu"


# ---------------------------------------------------------------- per-step rates (ropescale.training.trainer)
def test_step_clock_reports_last_step_steady_and_running_rates():
    from ropescale.training.trainer import StepClock

    now = [0.0]
    c = StepClock(clock=lambda: now[0])
    c.begin_train(0)
    tok = 0
    recs = []
    for dt in (10.0, 4.0, 1.0, 1.0, 2.0):  # two slow warm-up steps, then 1000 tokens/step at 1-2 s
        now[0] += 0.5  # data loading between steps: not a step's time
        c.begin_step(tok)
        now[0] += dt
        tok += 1000
        c.end_step(tok)
        recs.append(c.record(tok, world=2))
    assert [r["tokens_per_s"] for r in recs] == [200.0, 500.0, 2000.0, 2000.0, 1000.0]  # x2 processes
    assert "tokens_per_s_steady" not in recs[0] and "tokens_per_s_steady" not in recs[1]
    assert recs[2]["tokens_per_s_steady"] == 2000.0 and recs[4]["tokens_per_s_steady"] == 1500.0
    assert recs[4]["steady_steps"] == 3 and recs[4]["step_seconds"] == 2.0
    assert recs[4]["tokens_per_s_running"] == round(5000 * 2 / 20.5, 1) and recs[4]["seconds"] == 20.5


def test_trainer_log_with_offload_and_tiling_matches_plain_training(tmp_path, train_model):
    """Three steps of LabelOnlyTrainer: the same losses with the memory plan as without; the log has the new
    rates, host memory and the plan."""
    import json
    import weakref as wr

    from transformers import TrainingArguments

    from ropescale.training.data import Collator, PackedDataset
    from ropescale.training.loss import install_label_only_forward
    from ropescale.training.trainer import LabelOnlyTrainer, ProgressCallback

    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(3):
        ids = torch.randint(0, 1000, (64,), generator=g)
        lab = ids.clone()
        lab[:40] = -100
        rows.append({"input_ids": ids.tolist(), "labels": lab.tolist()})

    def train(with_plan: bool, out):
        pm = train_model("llama", lora=LORA)
        if with_plan:
            args = argparse.Namespace(offload_checkpoints="true", tile_mlp=16, gradient_checkpointing=True)
            install.setup_memory(pm, args, max_len=64, cuda=False, dtype=torch.float32, quiet=True)
        install_label_only_forward(pm, 8)
        targs = TrainingArguments(output_dir=str(out), max_steps=3, per_device_train_batch_size=1,
                                  learning_rate=1e-3, warmup_steps=0, lr_scheduler_type="constant", use_cpu=True,
                                  report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
                                  data_seed=0, remove_unused_columns=False, optim="adamw_torch")
        tr = LabelOnlyTrainer(model=pm, args=targs, train_dataset=PackedDataset(rows), data_collator=Collator(0))
        tr.add_callback(ProgressCallback(wr.ref(tr), out / "log.jsonl", True, 1))
        out.mkdir(parents=True, exist_ok=True)
        tr.train()
        return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]

    plain = train(False, tmp_path / "plain")
    planned = train(True, tmp_path / "planned")
    assert [r["step"] for r in planned] == [1, 2, 3]
    for a, b in zip(plain, planned):
        assert abs(a["loss"] - b["loss"]) < 1e-5
    for r in planned:
        assert r["tokens_per_s"] > 0 and r["tokens_per_s_running"] > 0 and r["step_seconds"] > 0
        assert r["host_rss_mb"] > 0 and r["host_peak_rss_mb"] > 0 and r["peak_mem_mb"] > 0
        assert r["offload_checkpoints"] is True and r["tile_mlp"] == 16 and r["offload_host_mb"] > 0
    assert "tokens_per_s_steady" not in planned[1] and planned[2]["tokens_per_s_steady"] > 0
    assert "offload_checkpoints" not in plain[0]


# ---------------------------------------------------------------- under DeepSpeed ZeRO-3 (CPU)
ZERO3_SCRIPT = r"""
import json, sys, argparse
from ropescale.common.process import setup_env
setup_env()
import torch, deepspeed
from deepspeed.utils import safe_get_full_grad
from transformers import AutoModelForCausalLM
from transformers.integrations import HfDeepSpeedConfig
from ropescale.training.loss import install_label_only_forward
from ropescale.training.memory.install import setup_memory
from ropescale.training.model import add_lora

model_dir, variant, out = sys.argv[1], sys.argv[2], sys.argv[3]
from ropescale.common.compat import disable_deepspeed_shm_op
disable_deepspeed_shm_op()  # no JIT build of the shm op (minutes on 2 cores)
deepspeed.init_distributed(dist_backend="gloo")
ds = json.load(open("ds_configs/zero3.json"))
ds.update({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 1,
           "gradient_clipping": 0.0, "bf16": {"enabled": False}, "fp16": {"enabled": False},
           "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False})
ds["zero_optimization"].update(reduce_bucket_size=5e5, stage3_prefetch_bucket_size=5e5,
                               stage3_param_persistence_threshold=0)  # every parameter partitioned
keep = HfDeepSpeedConfig(ds)  # ZeRO-3 partitions while loading
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
model.config.use_cache = False
torch.manual_seed(0)
pm, _ = add_lora(model, r=4, alpha=8, dropout=0.0, targets=("q_proj", "gate_proj", "down_proj"))
for i, (n, p) in enumerate(pm.named_parameters()):
    if "lora_B" in n:  # nonzero B: the MLP's LoRA A gets a gradient through the tiles
        with deepspeed.zero.GatheredParameters([p], modifier_rank=0):
            torch.manual_seed(i)
            p.data.copy_(torch.randn(p.shape) * 0.1)
if variant == "1":  # the recipe plan's activation part: every checkpoint to the host, the MLP tiled
    args = argparse.Namespace(offload_checkpoints="true", tile_mlp=40, gradient_checkpointing=True, micro_batch=1)
    setup_memory(pm, args, max_len=96, cuda=False, dtype=torch.float32, ds_config=ds)
if variant == "2":  # the planner's levers: blocks of 2 (layer 1 recomputed from layer 0's input in backward, a
    # forward of ZeRO-3 partitioned layers inside backward), layer 2's input kept, layer 0's on the host, the head
    # in chunks of 8 under ZeRO-3
    from ropescale.training.memory.install import setup_memory as setup
    from ropescale.training.memory.plan import Plan
    plan = Plan(checkpoint_block=2, offload_checkpoints=True, gpu_checkpoints=1, tile_mlp=40, head_chunk_zero3=True)
    mp = setup(pm, argparse.Namespace(), max_len=96, cuda=False, dtype=torch.float32, ds_config=ds, plan=plan)
if variant == "3":  # the same with each layer tiled by sequence (40-token chunks: 3 a layer) instead of the MLP
    from ropescale.training.memory.install import setup_memory as setup
    from ropescale.training.memory.plan import Plan
    plan = Plan(checkpoint_block=2, offload_checkpoints=True, gpu_checkpoints=1, tile_attention=40,
                head_chunk_zero3=True)
    mp = setup(pm, argparse.Namespace(), max_len=96, cuda=False, dtype=torch.float32, ds_config=ds, plan=plan)
install_label_only_forward(pm, 8, zero3_chunks=variant in ("2", "3"))
opt = torch.optim.SGD([p for p in pm.parameters() if p.requires_grad], lr=0.0)
engine, *_ = deepspeed.initialize(model=pm, optimizer=opt, config=ds)
assert all(hasattr(p, "ds_id") for p in pm.parameters())  # all partitioned: the tiles take the ZeRO-3 branch
engine.train()  # (from_pretrained gives eval mode, where transformers checkpoints nothing)
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, 1000, (1, 96), generator=g)
labels = ids.clone()
labels[:, :50] = -100
o = engine(input_ids=ids, labels=labels)
loss = o["loss_sum"] / o["n_tokens"]
engine.backward(loss)
grads = {n: safe_get_full_grad(p) for n, p in engine.module.named_parameters() if p.requires_grad}
stats = mp.offloader.stats if variant == "2" else {}
if variant == "3":
    from ropescale.training.memory.tiled_attention import STATS
    stats = dict(mp.offloader.stats, tiled=STATS["tiled"], plain=STATS["plain"])
torch.save({"loss": loss.detach(), "grads": grads, "stats": stats}, out)
"""


def test_zero3_gradients_with_offload_and_tiled_lora_mlp_match_plain(tmp_path, make_tiny_model):
    """ZeRO-3 with every parameter partitioned and LoRA on the MLP (each tile accumulates into partitioned
    gradients that DeepSpeed reduces once, after the last tile): the full gradients (gathered from the partitions)
    equal the plain run's, with the recipe plan's checkpoint offload and with the planner's block checkpoints
    (a partitioned layer run forward inside backward), device + host checkpoints and the head in chunks, and the
    same with each layer tiled by sequence (ropescale.training.memory.tiled_attention)."""
    import subprocess
    import sys

    from ft_helpers import ROOT, run_env

    _, model_dir = make_tiny_model(arch="qwen2", orig_ctx=128, num_layers=3)
    script = tmp_path / "z3.py"
    script.write_text(ZERO3_SCRIPT)
    res = []
    for flag in ("0", "1", "2", "3"):
        out = tmp_path / f"grads{flag}.pt"
        p = subprocess.run([sys.executable, str(script), str(model_dir), flag, str(out)], cwd=ROOT, env=run_env(),
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        if flag == "1":
            assert "checkpoints offloaded to host memory" in p.stderr and "MLP tiled over 40-token" in p.stderr
        res.append(torch.load(out))
    ref = res[0]
    assert any("mlp" in n and "lora_A" in n for n in ref["grads"])
    st = res[2]["stats"]
    assert st["recomputed"] == 1 and st["offloaded"] == 1, st  # layer 1 recomputed from 0; 0 on the host
    st = res[3]["stats"]  # the tiled layers: 3 in forward + layer 1 again from its block's input, none plain
    assert st["tiled"] == 3 and st["plain"] == 0 and st["recomputed"] == 1 and st["offloaded"] == 1, st
    for got in res[1:]:
        assert torch.allclose(got["loss"], ref["loss"], **TOL)
        assert got["grads"].keys() == ref["grads"].keys()
        for n, g in ref["grads"].items():
            assert g is not None and g.abs().sum() > 0, n
            assert torch.allclose(got["grads"][n], g, **TOL), (n, (got["grads"][n] - g).abs().max())


# ---------------------------------------------------------------- bench/bench_train_path.py (toy, CPU)
def test_bench_train_path_toy_runs_deepspeed_finetune_and_reports(tmp_path):
    """The bench's CPU smoke mode: a random toy model on disk, packed data of exactly 200 tokens, `deepspeed
    finetune.py --recipe` (ZeRO-3 + offload) for 3 steps; the steady rate and memory come from its train log;
    --report prints the recorded results again."""
    import json
    import subprocess
    import sys

    from ft_helpers import ROOT, run_env

    work = tmp_path / "bench"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_train_path.py"), "--shape", "toy", "--lengths", "200",
           "--steps", "3", "--workdir", str(work), "--json"]
    p = subprocess.run(cmd, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    (r,) = json.loads(p.stdout.strip().splitlines()[-1])["results"]
    assert r["path"] == "finetune" and r["rc"] == 0 and r["seq"] == 200 and r["steps_done"] == 3
    assert r["steady_steps"] == 1 and r["tokens_per_s_steady"] > 0 and r["tokens_per_s_running"] > 0
    assert r["host_peak_rss_gib"] > 0 and "peak_gpu_gib" not in r  # no GPU here
    from ropescale.training.data import load_rows

    rows = load_rows(work / "data" / "packed-200")
    assert len(rows) == 3 and set(rows.lengths().tolist()) == {200}
    assert (rows.labels != -100).sum() == 3 * 6 * 3  # 6 pairs a sample, 10% of each 33-token pair labelled
    rep = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_train_path.py"), "--workdir", str(work),
                          "--report"], cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0 and "seq     200  finetune.py (DeepSpeed)" in rep.stdout and "tok/s" in rep.stdout
