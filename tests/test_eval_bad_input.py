"""eval_summ bad input (issue 15.7): one line on stderr, exit 2, nothing half-written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ropescale.common.runs.record import RunDir
from ropescale.evaluation.cli import main


def one_line_error(capsys, rc, *what):
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    for w in what:
        assert w in err[0], err
    return err[0]


@pytest.fixture(scope="module")
def model_dir(make_tiny_model):
    return make_tiny_model("qwen2", orig_ctx=64, seed=12)[1]


def data_file(tmp_path: Path, chapters, name="eval.jsonl", n=1) -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps({"context": chapters[i]["text"][:50], "summary": "x"}, ensure_ascii=False) + "\n"
                         for i in range(n)), encoding="utf-8")
    return p


def test_score_empty_predictions_file(tmp_path, capsys):
    p = tmp_path / "preds.jsonl"
    p.write_text("")
    one_line_error(capsys, main(["score", "--pred", str(p)]), "preds.jsonl", "no predictions")
    p.write_text("\n\n")
    one_line_error(capsys, main(["score", "--pred", str(p), "--json"]), "no predictions")


def test_score_run_dir_without_predictions(tmp_path, capsys):
    rd = RunDir(tmp_path / "run")
    rd.write_meta({"kind": "generate", "model": "m", "prompt": "ie"})
    one_line_error(capsys, main(["score", "--pred", str(rd.path)]), "no predictions.jsonl")
    (rd.path / "predictions.jsonl").write_text("")  # a run killed before its first sample
    one_line_error(capsys, main(["score", "--pred", str(rd.path)]), "no predictions yet")
    assert not (rd.path / "scores.json").exists() and not (rd.path / "sample_scores.jsonl").exists()
    (tmp_path / "plain").mkdir()
    one_line_error(capsys, main(["score", "--pred", str(tmp_path / "plain")]), "not a run directory")


@pytest.mark.parametrize("cmd", ["generate", "run"])
def test_empty_data_file(model_dir, tmp_path, capsys, cmd):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n")
    rc = main([cmd, "--model", str(model_dir), "--data", str(p), "--prompt", "ie", "--out", str(tmp_path / "o"),
               "--max-new-tokens", "3"])
    one_line_error(capsys, rc, "empty.jsonl", "no samples")
    assert not (tmp_path / "o").exists()


def test_run_data_dir_with_an_empty_release_file_writes_nothing(model_dir, chapters, tmp_path, capsys):
    rel = tmp_path / "rel"
    rel.mkdir()
    data_file(rel, chapters, "cnnsum_L_16k.jsonl")
    (rel / "cnnsum_XL_32k.jsonl").write_text("")
    rc = main(["run", "--model", str(model_dir), "--data-dir", str(rel), "--out", str(tmp_path / "o"),
               "--max-new-tokens", "3"])
    one_line_error(capsys, rc, "cnnsum_XL_32k.jsonl", "no samples")
    assert not (tmp_path / "o").exists()  # not even the L runs


@pytest.mark.parametrize("argv", [
    ["generate", "--data", "{data}", "--prompt", "ie"],
    ["run", "--data", "{data}", "--prompt", "ie"],
    ["run", "--data-dir", "{rel}"],
])
def test_out_is_an_existing_regular_file(model_dir, chapters, tmp_path, capsys, argv):
    data = data_file(tmp_path, chapters)
    rel = tmp_path / "rel"
    rel.mkdir()
    data_file(rel, chapters, "cnnsum_L.jsonl")
    out = tmp_path / "taken.txt"
    out.write_text("keep me\n")
    argv = [a.replace("{data}", str(data)).replace("{rel}", str(rel)) for a in argv]
    rc = main([argv[0], "--model", str(model_dir), *argv[1:], "--out", str(out), "--max-new-tokens", "3"])
    one_line_error(capsys, rc, "taken.txt", "not a directory")
    assert out.read_text() == "keep me\n"


def test_report_out_is_an_existing_regular_file(model_dir, chapters, tmp_path, capsys):
    from ropescale.evaluation.generate import generate

    run = tmp_path / "runs" / "a"
    generate(str(model_dir), data_file(tmp_path, chapters), "ie", run, max_new_tokens=3, progress=False,
             log=lambda m: None)
    capsys.readouterr()
    out = tmp_path / "tables"
    out.write_text("keep me\n")
    one_line_error(capsys, main(["report", str(tmp_path / "runs"), "--out", str(out)]), "tables",
                   "not a directory")
    assert out.read_text() == "keep me\n"
    assert not (run / "scores.json").exists()  # checked before the scores computed on the fly were saved
    (tmp_path / "fig").mkdir()
    one_line_error(capsys, main(["report", str(tmp_path / "runs"), "--plot", str(tmp_path / "fig")]),
                   "is an existing directory, expected a file path")  # the words of every output check (common.io)
    assert not (run / "scores.json").exists()
