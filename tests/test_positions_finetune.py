"""Issue 33 phase 2 through finetune.py: PoSE over a resume (the same draws: the same losses and the same position
coverage as an uninterrupted run), the coverage in run.json, each checkpoint and the merged model's record, the
policy in the settings record (a resume with another one is refused), and bad combinations as one line + exit 2."""
from __future__ import annotations

import json
import shutil

import pytest
from ft_helpers import finetune_cmd, packed, run, train_log

from ropescale.training.cli import main
from ropescale.training.positions import Coverage

STEPS = 4


@pytest.fixture(scope="module")
def setup(make_tiny_model, chapters, tiny_tokenizer_dir, tmp_path_factory):
    _, model_dir = make_tiny_model(orig_ctx=64)
    data = packed(chapters, tiny_tokenizer_dir, tmp_path_factory.mktemp("posft") / "packed", 300, 480, n=24)
    return model_dir, data


def _args(model_dir, data, out, steps, *more):
    return ["--model", model_dir, "--data", data, "--rope", "yarn", "--scale", "8", "--max-steps", steps,
            "--global-batch", "2", "--save-steps", "2", "--warmup-steps", "1", "--lr", "5e-3", "--seed", "7",
            "--pose-target", "512", "--output-dir", out, *more]


def _ft(capfd, argv):
    """(exit code, stderr) of an in-process finetune.py call (no DeepSpeed: a second DeepSpeed run in one process
    fails; the process itself is not what these tests are about)."""
    capfd.readouterr()
    rc = main([str(a) for a in argv])
    return rc, capfd.readouterr().err


def _err(capsys, argv):
    """(exit code, the error lines): progress lines before the check are not errors."""
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    return rc, [x for x in err if not x.startswith("[")]


def test_pose_resume_redraws_the_same_positions(setup, tmp_path, capfd, one_thread):
    model_dir, data = setup
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
    rc, err = _ft(capfd, _args(model_dir, data, ref_dir, STEPS))
    assert rc == 0, err[-2000:]
    rc, err = _ft(capfd, _args(model_dir, data, cut_dir, 2))
    assert rc == 0, err[-2000:]
    old_dir = tmp_path / "old"
    shutil.copytree(cut_dir, old_dir)  # the same 2-step run, for the resume from a checkpoint without coverage below
    rc, err = _ft(capfd, [*_args(model_dir, data, cut_dir, STEPS), "--resume", "auto"])
    assert rc == 0, err[-2000:]
    assert "resuming from" in err and "checkpoint-2" in err

    ref_log, cut_log = train_log(ref_dir), train_log(cut_dir)
    assert [r["step"] for r in cut_log] == list(range(1, STEPS + 1))
    for a, b in zip(ref_log, cut_log):
        assert abs(a["loss"] - b["loss"]) < 1e-4, (a, b)
    rec = json.loads((ref_dir / "run.json").read_text())
    cov = Coverage.from_json(rec["train"]["coverage"])
    assert rec["settings"]["pose_target"] == 512 and rec["settings"]["positions"] == "continuous"
    assert json.loads((cut_dir / "run.json").read_text())["train"]["coverage"] == cov.to_json()  # resumed: the same
    assert cov.context == 512 and cov.samples == 2 * STEPS and cov.total_tokens > 0
    assert 300 < cov.longest < 512 and cov.longest_distance == cov.longest  # one segment from position 0
    assert sum(cov.tokens[8:]) > 0  # PoSE: positions in the upper half of the context, from <= 480-token samples
    half = Coverage.from_json(json.loads((cut_dir / "checkpoint-2" / "coverage.json").read_text()))
    assert half.samples == 4 and half.total_tokens < cov.total_tokens and cov.from_step == 0

    # a checkpoint written before runs kept a coverage record: the resume says so, and its coverage counts the
    # steps after the checkpoint only, recorded as from_step
    (old_dir / "checkpoint-2" / "coverage.json").unlink()
    rc, err = _ft(capfd, [*_args(model_dir, data, old_dir, STEPS), "--resume", "auto"])
    assert rc == 0, err[-2000:]
    assert "holds no position coverage" in err and "counted from step 2" in err
    part = Coverage.from_json(json.loads((old_dir / "run.json").read_text())["train"]["coverage"])
    assert part.from_step == 2 and part.samples == 2 * (STEPS - 2)

    out = tmp_path / "merged"
    assert main(["merge", "--run", str(ref_dir), "--out", str(out)]) == 0
    assert json.loads((out / "ropescale_train.json").read_text())["coverage"] == cov.to_json()

    # the policy is a setting of the run: a resume with another one is refused in one line
    rc, err = _ft(capfd, [*_args(model_dir, data, cut_dir, STEPS + 2), "--resume", "auto", "--pose-chunks", "3"])
    assert rc == 2 and "pose_chunks" in err.replace("-", "_"), err[-1000:]


def test_bad_combinations_are_one_line_and_exit_2(setup, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    model_dir, data = setup
    rc, err = _err(capsys, _args(model_dir, data, tmp_path / "a", 1, "--positions", "reset"))
    assert rc == 2 and len(err) == 1 and "--positions reset needs --attention document" in err[0], err
    bare = tmp_path / "bare"
    bare.mkdir()
    pq.write_table(pa.table({"input_ids": [[5, 6, 7, 8]], "labels": [[-100, -100, 7, 8]]}), bare / "train.parquet")
    rc, err = _err(capsys, _args(model_dir, bare, tmp_path / "b", 1, "--attention", "document"))
    assert rc == 2 and len(err) == 1 and "pair boundaries" in err[0] and str(bare) in err[0], err
    rc, err = _err(capsys, _args(model_dir, data, tmp_path / "c", 1, "--pose-target", "256"))
    assert rc == 2 and len(err) == 1 and "longer than --pose-target 256" in err[0], err
    with pytest.raises(SystemExit) as e:  # argparse: usage, then one error line
        main([str(a) for a in _args(model_dir, data, tmp_path / "d", 1, "--positions", "diagonal")])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "--positions" in last and "continuous, reset" in last, last


def test_document_mask_under_zero3_trains_what_plain_pytorch_trains(setup, tmp_path, capfd, one_thread):
    """reset + document on padded micro-batches of 2 under ZeRO-3 (partitioned weights gathered per layer, one
    process): the same losses as without DeepSpeed, and the same position coverage (reset: the ids restart at each
    pair, so the longest id is the longest pair's last, below the samples' 300 tokens)."""
    model_dir, data = setup
    common = ["--model", model_dir, "--data", data, "--rope", "yarn", "--scale", "8", "--max-steps", 2,
              "--global-batch", 2, "--micro-batch", 2, "--save-steps", 2, "--warmup-steps", 0, "--lr", "1e-2",
              "--seed", 3, "--positions", "reset", "--attention", "document", "--gradient-checkpointing", "true"]
    plain, zero3 = tmp_path / "plain", tmp_path / "zero3"
    rc, err = _ft(capfd, [*common, "--output-dir", plain])  # without DeepSpeed: in process
    assert rc == 0, err[-2000:]
    b = run(finetune_cmd(*common, "--deepspeed", "zero3", "--output-dir", zero3))
    assert b.returncode == 0, b.stderr[-2000:]
    la, lb = train_log(plain), train_log(zero3)
    assert [r["step"] for r in la] == [r["step"] for r in lb] == [1, 2]
    for x, y in zip(la, lb):
        assert abs(x["loss"] - y["loss"]) < 1e-4, (x, y)
    cov = Coverage.from_json(json.loads((plain / "run.json").read_text())["train"]["coverage"])
    assert cov.samples == 4 and cov.longest < 300  # reset: positions restart per pair (pairs < 300 tokens)
    assert cov.longest_distance == cov.longest
    assert json.loads((zero3 / "run.json").read_text())["train"]["coverage"] == cov.to_json()
