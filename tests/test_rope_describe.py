"""Issue 32 phase 2 (and 31.4): ``rope_scaling describe`` for every method -- the angle bound as a bound, the
fine-tune-aware bound from ``--trained-length`` or a model directory's training record, Liu et al.'s d_extra /
T_extra for a changed base, and the methods that follow the length at ``--seq-len``. Numbers worked by hand on the
tiny default (head_dim 64, base 1e4, original context 512)."""
from __future__ import annotations

import json
import math
import shutil

import pytest

from rope_scaling.describe import main as describe_main

TINY = ["--config", "assets/tiny"]


def run(capsys, *argv) -> dict:
    assert describe_main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_ntk_bounds_pretrain_finetune_and_liu(capsys):
    d = run(capsys, *TINY, "--rope", "ntk", "--scale", "8", "--trained-length", "2024")
    b = d["bound"]
    # pre-training: pair 16 first, 512 x its ratio 8^(32/62) = 512 x 2^(48/31)
    assert b["pretrain"] == d["reach"] == pytest.approx(512 * 2 ** (48 / 31))
    # a fine-tune at 2,024 tokens (issue 31.4's example): pair 16 now turned 2024 x 1e-2 / 8^(32/62) = 6.9 > 2 pi
    # radians (every angle); pairs whose ratio 8^(2i/62) is below 2024 / 512 (17-20) saw 2024 x theta'_i, bounded at
    # 2024; the rest at 512 x their ratio > 2024: the bound is 2024
    assert b["finetune"] == pytest.approx(2024) and b["trained_length"] == 2024
    # Liu et al.: d_extra = 2 ceil(32 log_1e4(512 / 2 pi)) = 2 ceil(15.29) = 32; T_extra = 2 pi b'^(32/64),
    # b' = 1e4 x 8^(64/62): 2 pi x 100 x 2^(96/62) = 1,837.8 (issue 31.4: "1,838 here")
    assert b["critical"]["d_extra"] == 32
    assert b["critical"]["T_extra"] == pytest.approx(2 * math.pi * 100 * 2 ** (96 / 62))
    assert round(b["critical"]["T_extra"]) == 1838
    assert "critical" not in run(capsys, *TINY, "--rope", "yarn", "--scale", "8")["bound"]  # base unchanged


def test_trained_length_from_the_model_directory(capsys, tmp_path):
    shutil.copy("assets/tiny/config.json", tmp_path / "config.json")
    args = ["--config", str(tmp_path), "--rope", "pi", "--scale", "8"]
    assert run(capsys, *args)["bound"]["finetune"] is None  # no record: no fine-tune bound
    rec = {"length": {"mean": 1536, "min": 1090, "max": 2024}}
    (tmp_path / "ropescale_train.json").write_text(json.dumps(rec))
    # PI x8: every pair at 1/8; a fine-tune at 2,024 lifts pairs 16-31 (seen 512 theta) to 2024 theta / 8: the
    # bound is min over them of max(512 theta, 2024 theta / 8) / (theta / 8) = 4096 (pre-training wins)
    d = run(capsys, *args)
    assert d["bound"]["trained_length"] == 2024 and d["bound"]["finetune"] == pytest.approx(4096)
    rec["coverage"] = {"longest_distance": 6000}  # a later issue's histogram: its longest distance wins
    (tmp_path / "ropescale_train.json").write_text(json.dumps(rec))
    d = run(capsys, *args)
    assert d["bound"]["trained_length"] == 6000
    # pairs with 6000 theta_i / 8 >= 2 pi now saw every angle; the first still bounded, i0 = the smallest i with
    # 6000 / 8 x 1e4^(-2i/64) < 2 pi, is bounded at 6000
    assert d["bound"]["finetune"] == pytest.approx(6000)
    # a coverage counted from a later step (a resume from a checkpoint that kept none) misses the first steps: the
    # longest sample stands in, as for a record without coverage
    rec["coverage"]["from_step"] = 12
    (tmp_path / "ropescale_train.json").write_text(json.dumps(rec))
    assert run(capsys, *args)["bound"]["trained_length"] == 2024
    assert run(capsys, *args, "--trained-length", "3000")["bound"]["trained_length"] == 3000  # the flag first
    (tmp_path / "ropescale_train.json").write_text(json.dumps({"length": {"max": "long"}}))
    assert describe_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ropescale_train.json" in err and "'long'" in err


def test_longrope_set_at_seq_len_with_hash_and_source(capsys, tmp_path):
    short = [1.0 + 0.01 * i for i in range(32)]
    long = [1.0 + 7 * i / 31 for i in range(32)]
    f = tmp_path / "factors.json"
    f.write_text(json.dumps({"short_factor": short, "long_factor": long}))
    args = [*TINY, "--rope", "longrope", "--scale", "8", "--longrope-factors", str(f)]
    for L, want, side in ((512, short, "short"), (513, long, "long"), (None, long, "long")):
        d = run(capsys, *args, *(["--seq-len", str(L)] if L else []))
        assert d["longrope"]["set"] == side and [r["ratio"] for r in d["dims"]] == pytest.approx(want)
        assert d["longrope"]["source"] == str(f) and d["label"] == f"longrope x8 factors={d['longrope']['hash']}"
    assert describe_main(args + ["--seq-len", "100"]) == 0
    out = capsys.readouterr().out
    assert "the short factors, within the original context" in out and str(f) in out


def test_dynamic_yarn_at_seq_len(capsys):
    theta = [1e4 ** (-2 * i / 64) for i in range(32)]
    for L in (300, 1024, 4096):
        d = run(capsys, *TINY, "--rope", "dynamic_yarn", "--scale", "8", "--seq-len", str(L))
        s = max(1.0, L / 512)
        assert d["yarn"]["scale_at_seq_len"] == s
        assert d["attention_factor"] == pytest.approx(1.0 if s == 1 else 0.1 * math.log(s) + 1)
        # the ramp ends: floor(i(32)) = 3 and ceil(i(1)) = 16, i(r) = 64 ln(512 / (2 pi r)) / (2 ln 1e4)
        for i in (0, 3, 16, 31):
            g = min(max((i - 3) / (16 - 3), 0.0), 1.0)
            want = theta[i] / (theta[i] / s * g + theta[i] * (1 - g))
            assert d["dims"][i]["ratio"] == pytest.approx(want)
        assert d["counts"]["interpolated"] == (0 if s == 1 else 16)  # pairs 16-31 divided by s at its s
