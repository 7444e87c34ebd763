"""eval_summ run --data-dir: the paper's whole evaluation matrix for one model in one command (issue 15.2)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

# release-style names, mixing the accepted spellings: 2XL/XXL, 3XL/XXXL, with and without the _16k suffix
NAMES = {"L": "cnnsum_L_16k.jsonl", "XL": "cnnsum_XL.jsonl", "2XL": "cnnsum_2XL_64k.jsonl",
         "3XL": "cnnsum_XXXL_128k.jsonl"}


def write_release(d: Path, chapters, names=NAMES, n=2) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for k, (sub, name) in enumerate(names.items()):
        with open(d / name, "w", encoding="utf-8") as f:
            for i in range(n):
                ch = chapters[(4 * k + i) % len(chapters)]
                f.write(json.dumps({"id": f"{sub}-{i}", "context": ch["text"][: 30 + 10 * i], "summary": ch["title"]},
                                   ensure_ascii=False) + "\n")
    return d


@pytest.fixture(scope="module")
def model_dir(make_tiny_model):
    return make_tiny_model("qwen2", orig_ctx=64, seed=11)[1]


def test_find_release_files_spellings_and_gaps(tmp_path, chapters):
    from ropescale.common.io import InputError
    from ropescale.evaluation.data import find_release_files

    d = write_release(tmp_path / "rel", chapters)
    (d / "notes.jsonl").write_text("{}\n")
    files, missing = find_release_files(d)
    assert {k: p.name for k, p in files.items()} == NAMES and list(files) == ["L", "XL", "2XL", "3XL"]
    assert missing == []
    two = write_release(tmp_path / "two", chapters, {"L": "cnnsum_L.jsonl", "3XL": "cnnsum_3XL.jsonl"})
    files, missing = find_release_files(two)
    assert list(files) == ["L", "3XL"] and missing == ["XL", "2XL"]
    (two / "cnnsum_L_16k.jsonl").write_text("{}\n")
    with pytest.raises(InputError, match="two files for subset L"):
        find_release_files(two)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no CNNSum release files"):
        find_release_files(tmp_path / "empty")


def test_one_call_runs_every_subset_and_prompt(model_dir, chapters, tmp_path, capsys, monkeypatch):
    from ropescale.evaluation import backends
    from ropescale.evaluation.cli import main

    loads = []
    init = backends.HFBackend.__init__

    def counting_init(self, *a, **kw):
        loads.append(1)
        init(self, *a, **kw)

    monkeypatch.setattr(backends.HFBackend, "__init__", counting_init)

    data = write_release(tmp_path / "release", chapters)
    out = tmp_path / "eval"
    argv = ["run", "--model", str(model_dir), "--data-dir", str(data), "--out", str(out), "--max-new-tokens", "4",
            "--min-new-tokens", "1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    cells = [f"{s}_{p}" for s in ("L", "XL", "2XL", "3XL") for p in ("ie", "ib")]
    for c in cells:
        run = out / c
        preds = [json.loads(x) for x in (run / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
        assert len(preds) == 2 and {r["subset"] for r in preds} == {c.split("_")[0]}
        scores = json.loads((run / "scores.json").read_text())
        assert scores["n"] == 2 and scores["prompt"] == c.split("_")[1]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(cells + ["report"])
    t2 = json.loads((out / "report" / "table2.json").read_text())
    (row,) = t2.values()
    assert list(row["avg"]) == ["L", "XL", "2XL", "3XL"] and row["mse"] is not None
    for name in ("table2", "table7", "extrapolation", "failure_modes"):
        assert (out / "report" / f"{name}.md").stat().st_size > 0
    assert (out / "fig3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Table 2 view" in printed and "Table 7 view" in printed and "Extrapolation" in printed
    assert len(loads) == 1  # the model is loaded once for the eight cells

    # resumable: a second call generates nothing new and gives the same table
    mtime = (out / "L_ie" / "predictions.jsonl").stat().st_mtime_ns
    assert main(argv + ["--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert all(r["generate"]["generated"] == 0 for r in res["runs"].values()) and len(res["runs"]) == 8
    assert (out / "L_ie" / "predictions.jsonl").stat().st_mtime_ns == mtime
    assert json.loads((out / "report" / "table2.json").read_text()) == t2


def test_missing_subsets_are_reported_and_skipped(model_dir, chapters, tmp_path, capsys):
    from ropescale.evaluation.cli import main

    data = write_release(tmp_path / "release", chapters, {"XL": "cnnsum_XL_32k.jsonl"}, n=1)
    out = tmp_path / "eval"
    assert main(["run", "--model", str(model_dir), "--data-dir", str(data), "--prompts", "ib", "--out", str(out),
                 "--max-new-tokens", "3", "--json"]) == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert list(res["runs"]) == ["XL_ib"] and res["skipped"] == ["L", "2XL", "3XL"]
    for s in ("L", "2XL", "3XL"):
        assert f"no file for subset {s}, skipped" in cap.err
    assert (out / "report" / "table2.md").is_file() and (out / "fig3.png").is_file()


@pytest.mark.parametrize("extra,what", [
    (["--data-dir", "{empty}"], "no CNNSum release files"),
    (["--data-dir", "{missing}"], "no such directory"),
    (["--data-dir", "{rel}", "--prompts", "ie,xx"], "unknown prompt 'xx'"),
    (["--data-dir", "{rel}", "--subset", "L"], "--subset does not go with --data-dir"),
    (["--data-dir", "{rel}", "--data", "{rel}/cnnsum_XL.jsonl"], "not both"),
    (["--data-dir", "{rel}", "--plot", "x.png"], "OUT/fig3.png"),
    ([], "--data FILE (one run) or --data-dir DIR"),
])
def test_matrix_bad_input_is_one_line(model_dir, chapters, tmp_path, capsys, extra, what):
    from ropescale.evaluation.cli import main

    rel = write_release(tmp_path / "rel", chapters, n=1)
    (tmp_path / "empty").mkdir()
    sub = {"{empty}": str(tmp_path / "empty"), "{missing}": str(tmp_path / "nope"), "{rel}": str(rel)}
    args = []
    for a in extra:
        for k, v in sub.items():
            a = a.replace(k, v)
        args.append(a)
    rc = main(["run", "--model", str(model_dir), "--out", str(tmp_path / "o"), "--max-new-tokens", "3", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and what in err[0], err
    assert not (tmp_path / "o").exists()
