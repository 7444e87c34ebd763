"""The memory planner (ropescale.training.memory.plan), the attention check (ropescale.training.attn_pick) and their
wiring into finetune.py: the planner's choice for the 7B Qwen1.5 shape on an H200 (139.8 GiB) and an H100 80GB
(79.6 GiB), each with 125 GiB of host memory, at 16K, 128K, 512K and 1M, worked by hand below; the time model's
constants solved again from the measurements they come from; MFU's FLOPs by hand; the fastest kernel picked from a
timing table."""
from __future__ import annotations

import json
import math

import pytest
from ft_helpers import packed, train_log

from ropescale.common.forward_memory import GIB
from ropescale.common.io import InputError
from ropescale.training.memory import plan as planner
from ropescale.training.memory.estimate import QWEN15_7B, Setup, estimate

H, F, V, L = 4096, 11008, 151936, 32
LAYER = 4 * H * H + 3 * H * F  # 202,375,168 (q, k, v, o + gate, up, down; biases left out)
EMBED = V * H  # 622,329,856
TRAINED = L * 4 * 8 * (H + H) + EMBED + (2 * L + 1) * H  # LoRA r=8 on q,k,v,o + embeddings + norms: 630,984,704
TOTAL = 2 * EMBED + L * (LAYER + 2 * H) + H  # 7,720,931,328
# bytes a token costs in one layer (bf16, LoRA dropout on q,k,v,o; tests/test_memory_model.py derives them):
PER_TOKEN = 287_744  # a recomputed layer: attention 22h + dropout 12h + MLP 8f + backward (4f + 4h)
KEPT = PER_TOKEN - (4 * F + 4 * H)  # a layer kept from forward (no backward yet): 227,328
TILED = 46 * H  # a recomputed layer with the MLP tiled: 22h + 12h + 2h + backward (6h + 4h) = 188,416
TILE_CONST = 6 * 2 * F * H  # the MLP chunk's own memory at --tile-mlp 4096: 0.50 GiB
WEIGHTS_ON_GPU = 2 * TOTAL + 2 * (EMBED + LAYER)  # every weight in bf16 + the gathered embedding and layer: 15.92 GiB
WEIGHTS_OFFLOADED = 2 * (EMBED + LAYER)  # only what ZeRO-3 gathers at a time: 1.54 GiB
STATE_ON_GPU = 18 * TRAINED  # fp32 master + m + v + fp32 grad + bf16 grad: 10.58 GiB
OPTIMIZER_ON_HOST = 16 * TRAINED  # 9.40 GiB
BUDGET_H200 = 0.9 * 139.8  # FITS_SHARE of the card: 125.82 GiB
BUDGET_H100 = 0.9 * 79.6  # 71.64 GiB
HOST_BUDGET = 0.9 * 125 - 12  # HOST_HEADROOM of 125 GiB less the measured base (process, libraries): 100.5 GiB


def gib(x) -> float:
    return x / GIB


def _choose(machine, n):
    return planner.choose(QWEN15_7B, Setup(length=n), machine)


def test_h200_16k_keeps_three_layers_in_four_and_everything_on_the_gpu():
    # Weights 15.92 + optimizer state 10.58 = 26.50 GiB on the GPU leave 99.3 of the 125.82 budget. Keeping every
    # layer's activations: 32 x 16,384 x 227,328 B = 111 GiB (no). Recomputing every 4th layer (0, 4, ..., 28: 8
    # layers) keeps 24: 83.25 GiB, + 8 checkpoints (1 GiB) + one recomputed layer's 16,384 x 287,744 B (4.39 GiB).
    # Tiling the MLP instead of recomputing would fit too (32 x 16,384 x (188,416 - 40,960) B = 72 GiB), but runs
    # the MLP's forward once more: more time than recomputing 8 of 32 layers (the time model, compared below).
    c = _choose(planner.H200, 16384)
    p = c.plan
    assert (p.offload_params, p.offload_optimizer, p.recompute_every, p.checkpoint_block, p.offload_checkpoints,
            p.tile_mlp) == (False, False, 4, 1, False, 0)
    t = 16384
    peak = WEIGHTS_ON_GPU + STATE_ON_GPU + 8 * t * H * 2 + 24 * t * KEPT + t * PER_TOKEN
    assert c.estimate.peak == peak and round(gib(peak), 2) == 115.14 and gib(peak) <= BUDGET_H200
    assert gib(24 * t * KEPT) == pytest.approx(83.25, abs=0.01) and gib(32 * t * KEPT) > 110
    tiled = planner.Plan(offload_params=False, offload_optimizer=False, recompute_every=0, tile_mlp=H)
    assert gib(estimate(QWEN15_7B, tiled.setup(Setup(length=t))).peak) < BUDGET_H200
    slower = planner.step_seconds(QWEN15_7B, tiled.setup(Setup(length=t)))["step"]
    assert c.seconds["step"] < slower
    assert c.host_need == 12 * GIB  # nothing offloaded: only the base


def test_h200_128k_recomputes_every_layer_with_every_checkpoint_on_the_gpu():
    # 32 checkpoints of 131,072 x 4,096 x 2 B = 32 GiB; one recomputed layer 131,072 x 287,744 B = 35.12 GiB; the
    # head (one call under ZeRO-3: 13,108 labelled x 151,936 x 14 B = 25.97 GiB + the final norm 3 GiB) comes after
    # the checkpoints only: 60.97 < 67.12. Peak 26.50 + 32 + 35.12 = 93.62 GiB: no offload and no tiling needed.
    c = _choose(planner.H200, 131072)
    p = c.plan
    assert (p.offload_params, p.offload_optimizer, p.recompute_every, p.offload_checkpoints, p.tile_mlp) == \
        (False, False, 1, False, 0)
    t = 131072
    peak = WEIGHTS_ON_GPU + STATE_ON_GPU + 32 * t * H * 2 + t * PER_TOKEN
    assert c.estimate.peak == peak and round(gib(peak), 2) == 93.62
    # keeping even every other layer's activations: 16 x 131,072 x 227,328 B = 444 GiB
    assert gib(16 * t * KEPT) > 400


def test_h200_512k_needs_blocks_of_two_and_host_checkpoints():
    # One recomputed layer with the MLP tiled: 524,288 x 188,416 B = 92 GiB + the chunk 0.50 GiB. With a stored
    # checkpoint (4 GiB) per layer, 32 x 4 = 128 GiB must live somewhere: the GPU has room for a few, the host
    # (100.5 GiB for the model's figure) cannot take the rest beside the optimizer. With one per block of 2 layers:
    # 16 stored; on the GPU the top one, two in flight and the block's recomputed upper input (4 x 4 = 16 GiB):
    # 15.92 (weights) + 16 + 92.50 = 124.42 GiB <= 125.82; the optimizer (9.40) and 15 checkpoints (60 GiB) on
    # the host: 69.40 GiB <= 100.5.
    c = _choose(planner.H200, 524288)
    p = c.plan
    assert (p.offload_params, p.offload_optimizer, p.recompute_every, p.checkpoint_block, p.offload_checkpoints,
            p.gpu_checkpoints, p.tile_mlp, p.head_chunk_zero3) == (False, True, 1, 2, True, 1, H, True)
    t = 524288
    ck = t * H * 2
    peak = WEIGHTS_ON_GPU + 4 * ck + t * TILED + TILE_CONST
    assert c.estimate.peak == peak and round(gib(peak), 2) == 124.42
    assert c.estimate.host == 15 * ck + OPTIMIZER_ON_HOST and round(gib(c.estimate.host), 2) == 69.40
    # every checkpoint stored, weights offloaded to make the most room: 1.54 + 92.50 + 2 in flight (8) leave 23.78
    # GiB, 5 checkpoints on the GPU; the host needs 27 x 4 + 14.38 (weights) + 9.40 = 131.8 GiB > 100.5
    room = BUDGET_H200 - gib(WEIGHTS_OFFLOADED + t * TILED + TILE_CONST + 2 * ck)
    kept = int(room // 4)
    assert kept == 5 and 4 * (32 - kept) + gib(2 * TOTAL + OPTIMIZER_ON_HOST) > HOST_BUDGET
    assert c.seconds["step"] > 540  # one step is longer than a 9-minute command (see docs/gpu.md)


@pytest.mark.parametrize("machine,budget", [(planner.H200, BUDGET_H200), (planner.H100, BUDGET_H100)])
def test_1m_fits_no_plan_on_one_gpu_without_the_tiled_layer(machine, budget):
    # One recomputed layer at 1,048,576 tokens with the MLP tiled: 1,048,576 x 188,416 B = 184 GiB, more than either
    # card holds, whatever goes to the host (the layer tiled by sequence is the lever: test_1m_on_one_h200_...).
    assert gib(1048576 * TILED) == 184.0 and 184 > budget
    with pytest.raises(planner.NoFit) as e:
        planner.choose(QWEN15_7B, Setup(length=1048576), machine, {"tile_attention": 0})
    msg = str(e.value)
    assert "\n" not in msg and "1,048,576-token" in msg and "GiB of GPU memory" in msg


def test_h100_16k_recomputes_every_layer_on_the_gpu():
    # 71.64 GiB budget: weights + state 26.50, every checkpoint (4 GiB) and one layer (4.39 GiB): 34.89. Keeping
    # any layer's activations does not fit: even every 4th recomputed keeps 83.25 GiB.
    c = _choose(planner.H100, 16384)
    p = c.plan
    assert (p.offload_params, p.offload_optimizer, p.recompute_every, p.offload_checkpoints, p.tile_mlp) == \
        (False, False, 1, False, 0)
    t = 16384
    assert c.estimate.peak == WEIGHTS_ON_GPU + STATE_ON_GPU + 32 * t * H * 2 + t * PER_TOKEN
    assert round(gib(c.estimate.peak), 2) == 34.89


def test_h100_128k_splits_the_checkpoints_between_gpu_and_host():
    # 26.50 + one layer 35.12 = 61.62 GiB leave 10.02 of 71.64: two checkpoints (1 GiB each) in flight and 8 kept on
    # the GPU; the other 24 (24 GiB) on the host.
    c = _choose(planner.H100, 131072)
    p = c.plan
    assert (p.offload_params, p.offload_optimizer, p.recompute_every, p.offload_checkpoints, p.gpu_checkpoints,
            p.tile_mlp) == (False, False, 1, True, 8, 0)
    t = 131072
    assert c.estimate.peak == WEIGHTS_ON_GPU + STATE_ON_GPU + (8 + 2) * t * H * 2 + t * PER_TOKEN
    assert c.estimate.host == 24 * t * H * 2


def test_h100_512k_does_not_fit():
    # the least GPU memory any plan needs at 512K: 1.54 (weights offloaded) + 92.50 (one tiled layer) + 3
    # checkpoints of 4 GiB (one in use, one prefetched, a block's upper input) = 106 GiB > 71.64
    with pytest.raises(planner.NoFit, match=r"needs 106\.0 GiB of GPU memory \(budget 71\.6 GiB\)"):
        planner.choose(QWEN15_7B, Setup(length=524288), planner.H100, {"tile_attention": 0})


def test_reach_of_each_family():
    """The longest sample each family fits (``python -m ropescale.training.memory --reach``): the recipe's plan 304K
    on the H200, every checkpoint on the GPU then the host 448K, blocks of 2 608K; without the layer tiled by sequence
    nothing reaches 1M (one layer's recompute), with it 1,040K (H100: 336K and 624K)."""
    from ropescale.training.memory import reach

    got = {f.name: reach.reach(QWEN15_7B, planner.H200, f)[0] // 1024 for f in reach.FAMILIES}
    assert list(got.values()) == [304, 448, 608, 560, 608, 1040, 1040]
    assert reach.reach(QWEN15_7B, planner.H100, reach.FAMILIES[-3])[0] // 1024 == 336
    assert reach.reach(QWEN15_7B, planner.H100, reach.FAMILIES[-1])[0] // 1024 == 624


def test_1m_on_one_h200_fits_with_the_layer_tiled_by_sequence():
    """1,048,576 tokens on one H200 + 125 GiB host: the planner takes the layer tiled by sequence (4,096-token
    chunks), everything offloaded, one checkpoint per 4 layers; the numbers by hand from the model's terms."""
    t, ck = 1048576, 1048576 * H * 2  # a checkpoint: 8 GiB
    c = _choose(planner.H200, t)
    p = c.plan
    assert (p.offload_params, p.offload_optimizer, p.recompute_every, p.checkpoint_block, p.offload_checkpoints,
            p.gpu_checkpoints, p.tile_attention, p.tile_mlp, p.head_chunk_zero3) == \
        (True, True, 1, 4, True, 0, H, 0, True)
    # what the tiled layer holds for the whole sequence, a token (MHA: kv = h): keys + values in bf16 (4h), their
    # fp32 gradients (8h), one chunk's share of them as SDPA returns it, up to all keys (4h), the residual
    # gradients in and out (4h): 20h = 81,920 B; one chunk: 4,096 tokens x the plain layer's 287,744 B
    whole = (2 * H * 2) + (2 * H * 4) + (2 * H * 2) + (2 * 2 * H)
    chunk = 4096 * PER_TOKEN
    # 8 stored checkpoints (32 / 4), all on the host; on the GPU two in flight + a block's 3 recomputed inputs
    peak = WEIGHTS_OFFLOADED + 5 * ck + t * whole + chunk
    assert whole == 81920 and c.estimate.peak == peak and round(gib(peak), 2) == 122.63 and gib(peak) <= BUDGET_H200
    host = 2 * TOTAL + OPTIMIZER_ON_HOST + 8 * ck  # 14.38 + 9.40 + 64
    assert c.estimate.host == host and round(gib(host), 2) == 87.78 and gib(host) <= HOST_BUDGET
    # the plain recompute (MLP tiled) would need 184 GiB for one layer alone; 2M tiled needs 160 GiB of keys,
    # values and gradients alone: no placement fits that on the card, and reach names that term
    assert gib(t * TILED) == 184.0 and gib(2 * t * whole) == 160.0 > BUDGET_H200
    from ropescale.training.memory import reach

    b = reach.binding(QWEN15_7B, Setup(length=2 * t), planner.H200)
    assert not b["fits"] and b["where"] == "GPU" and b["term"].startswith("the layer tiled by sequence")
    assert b["term_gib"] >= 160.0 and b["need_gib"] > BUDGET_H200
    # the time model charges the tiled layer's attention at SDPA's FlashAttention-2 rate: over an hour a step
    assert c.seconds["attention"] > 3600


def test_flags_fix_choices_and_contradictions_are_refused():
    fixed = {"recompute_every": 1, "offload_params": True}
    c = planner.choose(QWEN15_7B, Setup(length=16384), planner.H200, fixed)
    assert c.plan.recompute_every == 1 and c.plan.offload_params
    # nothing recomputed or tiled, nothing offloaded: 111 GiB of activations + 26.50 of weights and state
    with pytest.raises(planner.NoFit, match="the closest"):
        planner.choose(QWEN15_7B, Setup(length=16384), planner.H200, {"recompute_every": 0, "tile_mlp": 0,
                                                                      "offload_params": False,
                                                                      "offload_optimizer": False})

    # a fixed --tile-mlp N leaves the layer tiled by sequence out, a fixed --tile-attention N needs every layer
    # recomputed (the tiled layer is the recompute)
    c = planner.choose(QWEN15_7B, Setup(length=1048576), planner.H200, {"tile_attention": H})
    assert c.plan.tile_attention == H and c.plan.recompute_every == 1 and c.plan.tile_mlp == 0
    c = planner.choose(QWEN15_7B, Setup(length=16384), planner.H200, {"tile_attention": H})
    assert c.plan.recompute_every == 1 and c.plan.tile_attention == H
    with pytest.raises(planner.NoFit):
        planner.choose(QWEN15_7B, Setup(length=1048576), planner.H200, {"tile_mlp": H})

    class S:  # TrainSettings' fields the planner reads
        offload_params = "true"
        offload_optimizer = recompute_every = checkpoint_block = gpu_checkpoints = tile_mlp = tile_attention = None
        offload_checkpoints = chunk_head = "auto"
        gradient_checkpointing = True

    S.offload_optimizer = "auto"
    with pytest.raises(InputError, match="--offload-params true needs ZeRO-3"):
        planner.fixed_choices(S, Setup(length=16, zero=2))
    S.offload_params, S.recompute_every, S.offload_checkpoints = "auto", 0, "true"
    with pytest.raises(InputError, match="--offload-checkpoints true needs recomputed layers"):
        planner.fixed_choices(S, Setup(length=16))


# ---------------------------------------------------------------- the time model and MFU
def test_time_model_constants_come_from_the_measurements():
    """The rates solve the two no-ZeRO H100 measurements (16K 6,790 tok/s, 32K 5,587); the offload constants are
    the H200 recipe step at 16K (5,864.7 tok/s) less that; the H200 recipe step at 128K (2,507.6 tok/s), used for
    none of them, comes out within 1%."""
    def parts(n):
        s = Setup(length=n, zero=0, offload_param=False, offload_optimizer=False)
        f = planner.step_flops(QWEN15_7B, s)
        head = 3 if math.ceil(0.1 * n) > 4096 else 2
        return f["matmul"] * 3 + f["lora"] * 4 + f["head"] * head, f["attention"] * 4.5

    (a1, b1), (a2, b2) = parts(16384), parts(32768)
    y1, y2 = 16384 / 6790, 32768 / 5587
    det = a1 * b2 - a2 * b1
    rate_token, rate_attn = det / (y1 * b2 - y2 * b1), det / (a1 * y2 - a2 * y1)  # Cramer's rule for 1 / rate
    assert rate_token == pytest.approx(planner.RATE_TOKEN, rel=0.005)
    assert rate_attn == pytest.approx(planner.RATE_ATTN, rel=0.005)
    no_offload = a1 / rate_token + b1 / rate_attn
    assert planner.OFFLOAD_PARAMS_S + planner.OFFLOAD_OPTIMIZER_S == pytest.approx(16384 / 5864.7 - no_offload,
                                                                                   abs=0.005)
    s128 = Setup(length=131072, offload_checkpoints=True, tile_mlp=H)
    assert planner.step_seconds(QWEN15_7B, s128)["step"] == pytest.approx(131072 / 2507.6, rel=0.01)


def test_model_flops_and_mfu_by_hand():
    # 16K: decoder matmuls 2 x 16,384 x 32 x 202,375,168 = 2.1221e14 a forward; LoRA 2 x 16,384 x 8,388,608 =
    # 2.749e11; attention 32 x 2 x 16,384^2 x 4,096 = 7.0369e13; head 2 x 1,639 x 151,936 x 4,096 = 2.040e12.
    # Model FLOPs: forward + backward (input gradients only for frozen weights, LoRA's weight gradients, attention
    # backward = 2 forwards): 2 x 2.1221e14 + 3 x 2.749e11 + 3 x 7.0369e13 + 2 x 2.040e12 = 6.4042e14.
    s = Setup(length=16384)
    f = planner.step_flops(QWEN15_7B, s)
    assert f["matmul"] == 2 * 16384 * 32 * LAYER and f["lora"] == 2 * 16384 * 8_388_608
    assert f["attention"] == 32 * 2 * 16384**2 * 4096 and f["head"] == 2 * 1639 * V * H
    flops = planner.model_flops(QWEN15_7B, s)
    assert flops == pytest.approx(6.4042e14, rel=1e-4)
    # 5,864.7 tok/s (the H200's recipe path at 16K): 16,384 / 5,864.7 = 2.7937 s a step: 23.2% of 989.4 TFLOP/s
    assert planner.mfu(flops, 16384 / 5864.7, planner.peak_flops("NVIDIA H200")) == pytest.approx(0.2317, abs=1e-3)
    assert planner.peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12 and planner.peak_flops("cpu") is None
    assert planner.mfu(flops, 1.0, None) is None


# ---------------------------------------------------------------- the attention check
def test_the_fastest_kernel_that_ran_is_picked():
    from ropescale.training.attn_pick import pick

    assert pick({"cudnn": 3.1, "flash": 4.0, "efficient": "unavailable: RuntimeError: no kernel"}) == "cudnn"
    assert pick({"cudnn": "unavailable: x", "flash": 4.0, "efficient": 5.5}) == "flash"
    assert pick({"flash": 4.0, "flash_attention_2": 3.9}) == "flash_attention_2"
    assert pick({"cudnn": "unavailable: x"}) is None


def test_choose_prefers_the_measured_kernel_and_records_the_check():
    import torch

    from ropescale.common.compat import reset_sdpa_backend
    from ropescale.training import attn_pick

    table = {"cudnn": 2.5, "flash": 4.0, "efficient": 6.0}
    seen = {}

    def fake(**kw):
        seen.update(kw)
        return dict(table)

    try:
        attn, rec = attn_pick.choose("auto", "auto", cuda=True, heads=32, head_dim=128, tokens=131072,
                                     measure_fn=fake)
        assert attn == "sdpa" and rec["sdpa_backend"] == "cudnn" and rec["timings_ms"] == table
        assert seen["tokens"] == attn_pick.PROBE_TOKENS and seen["heads"] == 32 and rec["how"] == "priority"
        # torch now tries cuDNN's kernel first (others behind it)
        assert torch._C._get_sdp_priority_order()[0] == int(torch.nn.attention.SDPBackend.CUDNN_ATTENTION)
    finally:
        reset_sdpa_backend()
    assert attn_pick.choose("auto", "auto", cuda=False, heads=4, head_dim=16, tokens=64)[0] == "sdpa"
    attn, rec = attn_pick.choose("auto", "auto", cuda=True, heads=4, head_dim=16, tokens=64, world=2,
                                 measure_fn=fake)
    assert rec["sdpa_backend"] == "default" and "2 processes" in rec["why"]
    failed = attn_pick.choose("sdpa", "auto", cuda=True, heads=4, head_dim=16, tokens=64,
                              measure_fn=lambda **kw: {"cudnn": "unavailable: x"})
    assert failed == ("sdpa", failed[1]) and failed[1]["sdpa_backend"] == "default"


def test_measure_times_the_kernels_this_machine_has():
    import torch

    from ropescale.training.attn_pick import measure, pick

    t = measure(heads=2, head_dim=16, tokens=64, device=torch.device("cpu"), kernels=("math", "cudnn"), reps=1)
    assert isinstance(t["math"], float) and t["math"] > 0
    assert isinstance(t["cudnn"], str) and t["cudnn"].startswith("unavailable:")  # no cuDNN kernel on a CPU
    assert pick(t) == "math"


# ---------------------------------------------------------------- wired into finetune.py
def test_ds_config_gets_the_plan_s_offload(tmp_path):
    from ropescale.common.paths import DS_CONFIGS_DIR

    cfg = planner.ds_config_dict(DS_CONFIGS_DIR / "zero3_offload.json", cuda=True, cpu_adam="auto",
                                 offload=(False, True))
    zo = cfg["zero_optimization"]
    assert zo["offload_param"] == {"device": "none"} and zo["offload_optimizer"]["device"] == "cpu"
    assert cfg["optimizer"]["type"] == "AdamW"  # DeepSpeed's CPU Adam for the offloaded optimizer
    cfg = planner.ds_config_dict(DS_CONFIGS_DIR / "zero3_offload.json", cuda=True, cpu_adam="auto",
                                 offload=(False, False))
    assert cfg["zero_optimization"]["offload_optimizer"] == {"device": "none"} and "optimizer" not in cfg
    z2 = planner.ds_config_dict(DS_CONFIGS_DIR / "zero2.json", cuda=True, cpu_adam="auto", offload=(True, True))
    assert "offload_param" not in z2["zero_optimization"]  # no parameter offload under ZeRO-2


@pytest.fixture(scope="module")
def ft_data(tmp_path_factory, make_tiny_model, chapters, tiny_tokenizer_dir):
    tmp = tmp_path_factory.mktemp("planner_ft")
    _, model_dir = make_tiny_model(orig_ctx=64, num_layers=3)
    return model_dir, packed(chapters, tiny_tokenizer_dir, tmp / "packed", 300, 480, n=8), tmp


def test_finetune_runs_a_fit_plan_fixed_by_hand_and_records_it(ft_data, capsys):
    """``--memory-plan fit`` with every choice fixed by hand on CPU: blocks of 2 over 3 layers (layer 1 recomputed
    from layer 0's input), layer 2's input kept, layer 0's on the host; run.json and the train log say so."""
    from ropescale.training.cli import main

    model_dir, data, tmp = ft_data
    out = tmp / "run"
    rc = main([str(a) for a in ("--model", model_dir, "--data", data, "--rope", "pi", "--scale", "8", "--max-steps",
                                "2", "--global-batch", "1", "--save-steps", "100", "--memory-plan", "fit",
                                "--recompute-every", "1", "--checkpoint-block", "2", "--offload-checkpoints", "true",
                                "--gpu-checkpoints", "1", "--tile-mlp", "0", "--output-dir", out)])  # in process
    err = capsys.readouterr().err
    assert rc == 0, err[-3000:]
    rec = json.loads((out / "run.json").read_text())
    plan = rec["info"]["memory"]["plan"]
    assert plan["name"] == "fit" and plan["checkpoint_block"] == 2 and plan["gpu_checkpoints"] == 1
    assert rec["info"]["memory"]["estimate_gib"]["peak"] > 0 and rec["info"]["attention"]["attn"] == "sdpa"
    log = train_log(out)
    assert len(log) == 2 and log[-1]["checkpoint_block"] == 2 and log[-1]["host_checkpoints"] == 1
    assert log[-1]["gpu_checkpoints"] == 1 and "[finetune] memory plan fit:" in err


def test_finetune_refuses_a_plan_that_cannot_fit_before_loading(ft_data, capsys):
    from ropescale.training.cli import main

    model_dir, data, tmp = ft_data
    rc = main([str(a) for a in ("--model", model_dir, "--data", data, "--rope", "pi", "--scale", "8",
                                "--memory-plan", "fit", "--device-memory-gib", "0.0001", "--output-dir",
                                tmp / "refused")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: no memory plan fits") and "trainable params" not in err  # no model loaded
    assert not (tmp / "refused" / "run.json").exists()


def test_the_command_line(capsys):
    from ropescale.training.memory.__main__ import main

    assert main(["--plan", "16384", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["plan"]["recompute_every"] == 4 and rec["estimate_gib"]["peak"] == pytest.approx(115.14, abs=0.01)
    assert rec["tokens_per_s"] == pytest.approx(16384 / rec["seconds"]["step"], rel=1e-3)
    assert main(["--reach"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| machine | plans |") and "| 608K (622,592) |" in out and "| 1,040K (1,064,960) |" in out
    assert "| 2,048K | no plan fits" in out and "the layer tiled by sequence (largest part: key value grads" in out
    assert main(["--plan", "2097152"]) == 1 and "no memory plan fits" in capsys.readouterr().err
    assert main([]) == 2


# ---------------------------------------------------------------- the compat shims these rest on
def test_a_layer_switched_off_is_not_checkpointed(make_tiny_model):
    """compat.set_layer_checkpointing: transformers reads each layer's flag at each call."""
    import torch

    from ropescale.common import compat

    model, _ = make_tiny_model(save=False)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    calls = []
    layers = list(model.model.layers)
    for i, layer in enumerate(layers):
        own = layer._gradient_checkpointing_func
        compat.set_checkpoint_function(layer, lambda f, *a, own=own, i=i, **k: (calls.append(i), own(f, *a, **k))[1])
    compat.set_layer_checkpointing(layers[0], False)
    model(input_ids=torch.randint(0, 100, (1, 16))).logits.sum().backward()
    assert calls == [1]


def test_prefer_sdpa_backend_without_set_priority(monkeypatch):
    """Where torch's sdpa_kernel has no set_priority (before 2.6), the kernel alone is enabled ("exclusive")."""
    import contextlib

    import torch.nn.attention as att

    from ropescale.common import compat

    seen = []

    @contextlib.contextmanager
    def old_sdpa_kernel(backends):
        seen.append(backends)
        yield

    monkeypatch.setattr(att, "sdpa_kernel", old_sdpa_kernel)
    try:
        assert compat.prefer_sdpa_backend("cudnn") == "exclusive"
        assert seen == [att.SDPBackend.CUDNN_ATTENTION]
    finally:
        compat.reset_sdpa_backend()
