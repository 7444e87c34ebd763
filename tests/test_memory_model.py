"""The memory model (ropescale.training.memory.estimate) against numbers derived by hand for the 7B Qwen1.5 shape, and
against the H100 measurements it claims to match."""
from __future__ import annotations

import math

import pytest

from ropescale.common.forward_memory import GIB
from ropescale.training.memory.estimate import (
    H100_MEASURED,
    QWEN15_7B,
    Setup,
    check_h100,
    estimate,
    longest_context,
    main,
)

H, F, V, L = 4096, 11008, 151936, 32
LAYER = 4 * H * H + 3 * H * F  # q, k, v, o (MHA: 32 KV heads) + gate, up, down = 202,375,168
EMBED = V * H  # 622,329,856
TRAINED = L * 4 * 8 * (H + H) + EMBED + (2 * L + 1) * H  # LoRA r=8 on q,k,v,o + embeddings + norms: 631M
TOTAL = 2 * EMBED + L * (LAYER + 2 * H) + H  # untied head: 7.72B (biases left out)


def test_parameter_counts():
    assert LAYER == 202_375_168 and TRAINED == 630_984_704 and TOTAL == 7_720_931_328
    assert QWEN15_7B.layer_params() == LAYER and QWEN15_7B.total_params() == TOTAL


def test_recipe_path_16k_by_hand():
    """ZeRO-3 with parameter + optimizer offload, one GPU, bf16, 16K tokens, 10% labelled, LoRA dropout 0.05."""
    e = estimate(QWEN15_7B, Setup(length=16384))
    t = 16384
    weights = (EMBED + LAYER) * 2  # gathered: the embedding and one layer, bf16 (everything else on the host)
    ckpt = L * t * H * 2
    # per token in a layer's recompute: norms 2 x (4 + 2) h, q k v + attn out + layer out 2 x (h + h + h + h + h)
    # ... = 22 h; LoRA dropout copies + masks 4 x 3 h = 12 h; MLP 4 x 2 f = 8 f; backward: MLP grads 2 x 2 f = 4 f
    # (more than dq, dk, dv: 6 h) + residual gradients 2 x 2 h = 4 h
    per_token = 22 * H + 12 * H + 8 * F + 4 * F + 4 * H
    assert per_token == 287_744
    act = t * per_token
    labelled = math.ceil(0.1 * t)  # 1,639: the head runs on all of them at once under ZeRO-3
    logits = labelled * V * 14 + t * H * 6  # + the final norm (fp32 in, bf16 out)
    assert (e.weights, e.state, e.checkpoints, e.activations, e.logits) == (weights, 0, ckpt, act, logits)
    assert e.at == "layer" and e.peak == weights + ckpt + act == 10_658_775_040  # 9.93 GiB
    assert e.host == TOTAL * 2 + 16 * TRAINED  # bf16 parameters + fp32 master, m, v, gradient


def test_sequence_parallel_divides_the_tokens():
    """--sequence-parallel 4 on 4 GPUs at 64K holds 16K tokens per GPU: the 16K estimate plus the all-to-all's
    copy of q, k, v and the output (2 x (h + h + h + h) bytes a token); ZeRO-3 parts of the host state by 4."""
    one = estimate(QWEN15_7B, Setup(length=16384))
    four = estimate(QWEN15_7B, Setup(length=65536, sp=4, world=4))
    assert four.tokens == 16384
    assert four.peak - one.peak == 16384 * 8 * H
    assert four.host == math.ceil(TOTAL * 2 / 4) + math.ceil(16 * TRAINED / 4)


def test_no_deepspeed_by_hand():
    e = estimate(QWEN15_7B, Setup(length=16384, zero=0, offload_param=False, offload_optimizer=False))
    assert e.weights == (TOTAL - TRAINED) * 2 + TRAINED * 4  # fp32 master copies of the trained tensors
    assert e.state == 8 * TRAINED + 4 * (TRAINED - EMBED)  # Adam m, v; fp32 gradients but the embedding's
    assert e.logits == 1639 * V * 14 + 16384 * H * 6  # 1,639 <= the 4,096-position head chunk
    # the README's no-ZeRO measurements (bench/gpu_train_step.py on an H100): 28.5 GiB at 16K, 36.6 GiB at 32K
    assert abs(e.peak / GIB / 28.5 - 1) < 0.05
    assert abs(estimate(QWEN15_7B, Setup(length=32768, zero=0, offload_param=False,
                                         offload_optimizer=False)).peak / GIB / 36.6 - 1) < 0.05


def test_offload_and_tiling_by_hand():
    e = estimate(QWEN15_7B, Setup(length=131072, offload_checkpoints=True, tile_mlp=H))
    t = 131072
    assert e.checkpoints == 2 * t * H * 2  # the one in use and the one being fetched
    # the MLP keeps only its output (2 h); its chunk costs 6 x 2 x f x 4096 once; backward: dq, dk, dv (6 h) + 4 h
    assert e.activations == t * (22 * H + 12 * H + 2 * H + 6 * H + 4 * H) + 6 * 2 * F * H
    assert e.host == TOTAL * 2 + 16 * TRAINED + L * t * H * 2


@pytest.mark.parametrize("n", sorted(H100_MEASURED))
def test_model_matches_the_h100_measurements(n):
    row = {r["length"]: r for r in check_h100()}[n]
    assert abs(row["error"]) < 0.06, row  # -4.6%, +0.3%, +1.0%


def test_longest_context_grows_with_the_gpus_and_fits():
    n1, e1 = longest_context(QWEN15_7B, 1)
    n8, e8 = longest_context(QWEN15_7B, 8)
    assert 128 * 1024 < n1 and n8 >= 7 * n1
    assert e1.peak <= 0.9 * 80 * GIB and e8.peak <= 0.9 * 80 * GIB
    over = estimate(QWEN15_7B, Setup(length=n1 + 1024, offload_checkpoints=True, tile_mlp=H))
    assert over.peak > 0.9 * 80 * GIB  # the next length up does not fit


def test_cli_table(capsys):
    assert main(["--table", "--gpus", "1", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| GPUs x 80 GB") and out.count("\n") == 4
    assert main(["--check"]) == 0
    assert "| 128K | 68.0 GiB |" in capsys.readouterr().out
