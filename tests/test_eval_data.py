"""eval_summ --data: the subset travels with the records (issue 15.1) and HF datasets sources (issue 15.3)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ropescale.common.io import InputError

ROOT = Path(__file__).resolve().parent.parent


def rows(chapters, n, subset=None, base=40, step=17):
    out = []
    for i in range(n):
        r = {"id": f"s{i}", "context": chapters[i]["text"][: base + step * i], "summary": chapters[i]["title"]}
        if subset is not None:
            r["subset"] = subset
        out.append(r)
    return out


def write_jsonl(path: Path, recs) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    return path


def preds(out) -> list[dict]:
    return [json.loads(x) for x in (Path(out) / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]


def meta(out) -> dict:
    """run.json's record fields with its settings (subset, max_new_tokens...) beside them."""
    m = json.loads((Path(out) / "run.json").read_text(encoding="utf-8"))
    return {**m.pop("settings"), **m}


@pytest.fixture(scope="module")
def model_dir(make_tiny_model):
    return make_tiny_model("qwen2", orig_ctx=64, seed=4)[1]


@pytest.fixture
def ds_cache(tmp_path, monkeypatch):
    """datasets writes its Arrow cache under HF_DATASETS_CACHE: keep it in the test's temp dir."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    return tmp_path / "hf_cache"


# ------------------------------------------------------------------ 15.1: the subset travels with the data
def test_subset_from_the_records_of_a_data_concat_file(model_dir, chapters, tmp_path):
    """The README pipeline: data_concat sample --subset L --out cnnsum_L.jsonl, then generate without --subset."""
    from ropescale.evaluation.generate import generate

    d = write_jsonl(tmp_path / "cnnsum_L.jsonl", rows(chapters, 2, subset="L"))
    generate(str(model_dir), d, "ie", tmp_path / "a", limit=1, progress=False)  # no --subset, no --max-new-tokens
    m = meta(tmp_path / "a")
    assert (m["subset"], m["max_new_tokens"]) == ("L", 400)
    assert preds(tmp_path / "a")[0]["subset"] == "L"

    t = write_jsonl(tmp_path / "scaled.jsonl", rows(chapters, 3, subset="T512"))
    generate(str(model_dir), t, "ib", tmp_path / "t", max_new_tokens=4, progress=False)
    assert meta(tmp_path / "t")["subset"] == "T512"
    assert {r["subset"] for r in preds(tmp_path / "t")} == {"T512"}


def test_subset_precedence_flag_records_filename(chapters, tmp_path):
    from ropescale.evaluation.data import load_samples
    from ropescale.evaluation.generate import resolve_subset

    recs = load_samples(write_jsonl(tmp_path / "cnnsum_XL_32k.jsonl", rows(chapters, 3, subset="XXL")))
    assert resolve_subset(None, "cnnsum_XL_32k.jsonl", recs).name == "2XL"  # records beat the file name
    assert resolve_subset("L", "cnnsum_XL_32k.jsonl", recs).name == "L"  # --subset beats the records
    plain = load_samples(write_jsonl(tmp_path / "cnnsum_XL_32k.jsonl", rows(chapters, 2)))
    assert resolve_subset(None, "cnnsum_XL_32k.jsonl", plain).name == "XL"  # no field: the file name
    assert resolve_subset(None, "cnnsum_XXXL.jsonl", plain).name == "3XL"  # suffix-less release name
    assert resolve_subset(None, "mine.jsonl", plain) is None


@pytest.mark.parametrize("subs,line,what", [
    (["L", "L", "XL"], 3, "has subset 'XL' but line 1 has 'L'"),
    (["T512", None, "T512"], 2, "has no 'subset' but line 1 has 'T512'"),
    ([None, "L"], 2, "has subset 'L' but line 1 has none"),
    (["L", "Q"], 2, "unknown subset 'Q'"),
])
def test_records_that_disagree_name_the_first_disagreeing_line(model_dir, chapters, tmp_path, capsys, subs, line,
                                                               what):
    from ropescale.evaluation.cli import main

    recs = rows(chapters, len(subs))
    for r, s in zip(recs, subs):
        if s is not None:
            r["subset"] = s
    p = write_jsonl(tmp_path / "mixed.jsonl", recs)
    rc = main(["generate", "--model", str(model_dir), "--data", str(p), "--prompt", "ie", "--out",
               str(tmp_path / "o"), "--max-new-tokens", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert f"mixed.jsonl:{line}: " in err[0] and what in err[0]
    assert not (tmp_path / "o").exists()
    # --subset decides, whatever the records say
    assert main(["generate", "--model", str(model_dir), "--data", str(p), "--prompt", "ie", "--out",
                 str(tmp_path / "o"), "--max-new-tokens", "3", "--subset", "T256"]) == 0
    assert meta(tmp_path / "o")["subset"] == "T256"


# ------------------------------------------------------------------ 15.3: datasets sources
def test_save_to_disk_dir_and_parquet_folder_give_the_jsonl_predictions(model_dir, chapters, tmp_path, ds_cache):
    import datasets

    from ropescale.evaluation.generate import generate

    recs = rows(chapters, 4, subset="T512")
    jsonl = write_jsonl(tmp_path / "eval.jsonl", recs)
    disk = tmp_path / "saved"
    datasets.Dataset.from_list(recs).save_to_disk(str(disk))
    folder = tmp_path / "pq"
    folder.mkdir()
    datasets.Dataset.from_list(recs).to_parquet(str(folder / "part-0.parquet"))

    kw = dict(max_new_tokens=6, progress=False)
    generate(str(model_dir), jsonl, "ie", tmp_path / "j", **kw)
    generate(str(model_dir), disk, "ie", tmp_path / "d", **kw)
    generate(str(model_dir), folder, "ie", tmp_path / "p", **kw)
    generate(str(model_dir), folder / "part-0.parquet", "ie", tmp_path / "f", **kw)  # a Parquet file
    want = {r["id"]: r["prediction"] for r in preds(tmp_path / "j")}
    for name in ("d", "p", "f"):
        assert {r["id"]: r["prediction"] for r in preds(tmp_path / name)} == want, name
        assert meta(tmp_path / name)["subset"] == "T512"  # the records' field, through datasets too
    assert meta(tmp_path / "d")["data"] == str(disk.resolve())
    # resuming the datasets run is a no-op
    assert generate(str(model_dir), disk, "ie", tmp_path / "d", **kw)["generated"] == 0


def test_dataset_splits_and_data_files(model_dir, chapters, tmp_path, ds_cache):
    import datasets

    from ropescale.evaluation.data import CNNSUM_HUB_ID, load_samples, open_source

    a, b = rows(chapters, 3), rows(chapters, 2, base=90)
    dd = datasets.DatasetDict({"test": datasets.Dataset.from_list(a), "dev": datasets.Dataset.from_list(b)})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(InputError, match=r"2 splits \(test, dev\): pass --data-split"):
        load_samples(tmp_path / "dd")
    assert [s["id"] for s in load_samples(tmp_path / "dd", split="dev")] == ["s0", "s1"]
    with pytest.raises(InputError, match="no split 'train'"):
        load_samples(tmp_path / "dd", split="train")
    # a folder holding the four release files: --data-files picks one, and its name tells the subset
    rel = tmp_path / "release"
    rel.mkdir()
    write_jsonl(rel / "cnnsum_L_16k.jsonl", a)
    write_jsonl(rel / "cnnsum_XL_32k.jsonl", b)
    src = open_source(rel, data_files="cnnsum_XL_32k.jsonl")
    assert len(load_samples(None, source=src)) == 2 and src.file_name == "cnnsum_XL_32k.jsonl"
    from ropescale.common.subsets import from_filename as subset_from_filename

    assert subset_from_filename(src.file_name).name == "XL"
    assert open_source(CNNSUM_HUB_ID).kind == "datasets"  # a name goes to datasets.load_dataset


def test_bad_datasets_sources_are_one_line(model_dir, tmp_path, ds_cache, capsys):
    import datasets

    from ropescale.evaluation.cli import main

    datasets.Dataset.from_list([{"text": "甲", "summary": "乙"}]).save_to_disk(str(tmp_path / "nocontext"))
    cases = [
        (str(tmp_path / "nocontext"), "missing column(s) 'context'"),
        (str(tmp_path / "missing.jsonl"), "no such file or directory"),
        ("no-such-owner-ropescale/no-such-dataset", "datasets could not load it"),
    ]
    capsys.readouterr()
    for data, what in cases:
        rc = main(["generate", "--model", str(model_dir), "--data", data, "--prompt", "ie", "--out",
                   str(tmp_path / "o"), "--max-new-tokens", "3"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and what in err[0], (data, err)
        assert not (tmp_path / "o").exists()


def test_jsonl_does_not_import_datasets(tmp_path, chapters):
    p = write_jsonl(tmp_path / "eval.jsonl", rows(chapters, 2))
    code = ("import sys; from ropescale.evaluation.data import load_samples; "
            f"assert len(load_samples({str(p)!r})) == 2; print('datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
