"""probes CLI on bad input (issue 15): a run that fails before its first result leaves nothing behind (so the
corrected command can reuse --out), a pre-existing run is never touched, and bad sizes / paths are one line on
stderr with exit code 2, before any model is loaded."""
from __future__ import annotations

import json
import os
import stat

import pytest

from ropescale.probes.cli import main


@pytest.fixture(scope="module")
def model_dir(make_tiny_model):
    _, d = make_tiny_model(orig_ctx=64, seed=3)
    return d


@pytest.fixture(scope="module")
def docs(chapters, tmp_path_factory):
    """Two documents (two books) of real novel text, a few thousand tiny-tokenizer tokens each."""
    rows = [{"id": f"d{i}", "book": c["book"], "text": c["text"][:1500]}
            for i, c in enumerate([chapters[0], chapters[-1]])]
    p = tmp_path_factory.mktemp("docs") / "docs.jsonl"
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return p


def _snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _err(capsys, argv) -> str:
    """Exit 2 and one error line on stderr (after any progress bar a model load drew there)."""
    rc = main(argv)
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1] if err.strip() else ""
    assert rc == 2 and last.startswith("error: ") and err.count("error:") == 1 and "Traceback" not in err, (rc, err)
    return last


@pytest.mark.parametrize("probe,bad,good", [
    ("ppl", ["--lengths", "99999"], ["--lengths", "40", "--target-len", "8"]),
    ("copy", ["--length", "999999", "--target-len", "8"], ["--length", "48", "--target-len", "8",
                                                          "--distances", "0,16"]),
])
def test_a_failed_run_leaves_nothing_and_the_fix_reuses_out(probe, bad, good, model_dir, docs, tmp_path, capsys,
                                                            one_thread):
    out = tmp_path / "run"
    common = [probe, "--model", str(model_dir), "--data", str(docs), "--n", "1", "--out", str(out)]
    assert "no document is long enough" in _err(capsys, common + bad)
    assert not out.exists()  # was: a run.json with the bad settings, which made the corrected run refuse
    assert main(common + good + ["--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    meta = json.loads((out / "run.json").read_text())
    assert meta["info"]["probe"] == probe and (out / "items.jsonl").is_file() and (out / "summary.json").is_file()
    # a failing re-run into a finished run's directory leaves every file of that run as it was
    before = _snapshot(out)
    err = _err(capsys, common + bad)
    assert "different" in err or "no document is long enough" in err
    assert _snapshot(out) == before


def test_a_failed_run_keeps_an_existing_unrelated_directory(model_dir, docs, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    _err(capsys, ["ppl", "--model", str(model_dir), "--data", str(docs), "--n", "1", "--lengths", "99999",
                  "--out", str(out)])
    assert _snapshot(out) == {"notes.txt": b"keep me"}


@pytest.mark.parametrize("argv,msg", [
    (["ppl", "--n", "0"], "--n must be positive, got 0"),
    (["ppl", "--batch-size", "0"], "--batch-size must be positive, got 0"),
    (["ppl", "--target-len", "0"], "--target-len must be positive, got 0"),
    (["ppl", "--lengths", "0,40"], "--lengths must be positive"),
    (["perturb", "--seeds", "0"], "--seeds must be positive, got 0"),
    (["perturb", "--target-len", "-3"], "--target-len must be positive, got -3"),
    (["copy", "--n", "-1"], "--n must be positive, got -1"),
    (["shuffle", "--batch-size", "0"], "--batch-size must be positive"),
    (["suffix-id", "--suffix-len", "0"], "--suffix-len must be positive, got 0"),
    (["suffix-id", "--n", "0"], "--n must be positive, got 0"),
    # a length counts the prefix and the candidate: 100 tokens leave no room beside a 128-token candidate
    (["suffix-id", "--variant", "sentence", "--lengths", "100,512"], "--lengths 100: a length counts the prefix and "
                                                                     "the 128-token candidate"),
    (["ppl", "--threads", "-1"], "--threads must not be negative"),
])
def test_non_positive_sizes_are_one_line(argv, msg, model_dir, docs, tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(argv + ["--model", str(model_dir), "--data", str(docs), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and msg in err, err  # before a model loads
    assert not out.exists()


def test_paths_of_the_wrong_kind_are_one_line(model_dir, docs, tmp_path, capsys):
    f = tmp_path / "file.txt"
    f.write_text("x")
    d = tmp_path / "dir"
    d.mkdir()
    base = ["--model", str(model_dir), "--n", "1"]
    # an existing file as the run directory (was a FileExistsError traceback)
    for probe in ("ppl", "suffix-id", "shuffle"):
        assert f"{f}: output exists and is not a directory" in _err(capsys, [probe, *base, "--data", str(docs),
                                                                             "--out", str(f)])
    assert "is not a directory" in _err(capsys, ["ppl", *base, "--data", str(docs), "--out", str(f / "sub")])
    # a directory as the data file (was "no such file")
    assert f"{d}: is a directory, expected a file" in _err(capsys, ["ppl", *base, "--data", str(d), "--out",
                                                                    str(tmp_path / "o")])
    assert f.read_text() == "x" and list(d.iterdir()) == [] and not (tmp_path / "o").exists()


def test_report_outputs_of_the_wrong_kind_and_modes(model_dir, docs, tmp_path, capsys, one_thread):
    out = tmp_path / "runs" / "ppl"
    assert main(["ppl", "--model", str(model_dir), "--data", str(docs), "--n", "1", "--lengths", "40",
                 "--target-len", "8", "--out", str(out)]) == 0
    capsys.readouterr()
    d = tmp_path / "dir"
    d.mkdir()
    # --out takes a directory (or, the old spelling, a .md/.csv/.json/.txt file): an existing directory for the
    # one-file spelling and an existing file for the directory are refused before anything is written
    md_dir = d / "x.md"
    md_dir.mkdir()
    assert f"{md_dir}: output is an existing directory" in _err(capsys, ["report", str(tmp_path / "runs"), "--out",
                                                                          str(md_dir)])
    assert f"{d}: output is an existing directory" in _err(capsys, ["report", str(tmp_path / "runs"), "--plot",
                                                                     str(d)])
    f = tmp_path / "file.txt"
    f.write_text("x")
    b = tmp_path / "tables"
    b.write_text("x")
    assert f"{b}: output exists and is not a directory" in _err(capsys, ["report", str(tmp_path / "runs"), "--out",
                                                                        str(b)])
    assert "is a file, expected a run directory" in _err(capsys, ["report", str(f)])
    old = os.umask(0o022)
    try:
        assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "t.md"), "--plot",
                     str(tmp_path / "p.png")]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "tables2")]) == 0  # --out DIR
    capsys.readouterr()
    # the tables, and the record of what this tool wrote there (the one output rule: a re-run may replace them)
    assert sorted(p.name for p in (tmp_path / "tables2").iterdir()) == [".ropescale-outputs.json", "ppl.csv",
                                                                        "ppl.json", "ppl.md"]
    for p in (tmp_path / "t.md", tmp_path / "p.png", tmp_path / "tables2" / "ppl.md"):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o644, p
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    from ropescale.common.io import OUTPUTS_RECORD

    # no temp file left behind: only the record of what this tool wrote
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.name != OUTPUTS_RECORD]
