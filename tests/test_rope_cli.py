"""Issue 32 items 2 and 5 through the command lines: every entry's --help lists the new methods; a bad LongRoPE
factor file is one line + exit 2 through each CLI that takes ``--longrope-factors``; reports key rows by the full
setting, LongRoPE's factors by their content hash (two files with the same numbers are one row, other numbers
another row), dynamic YaRN apart from static YaRN, and a scores CSV names its factor file in a column."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rope_scaling.__main__ import main as rope_main
from rope_scaling.spec import LongRopeFactors
from ropescale.cli import main as ropescale_main
from ropescale.evaluation.cli import main as eval_main
from ropescale.probes.cli import main as probes_main
from ropescale.training.cli import main as finetune_main

NEW = ("longrope", "dynamic_yarn", "llama3")

# every entry that takes the RoPE flags, as (main, its leading argv)
ENTRIES = {
    "rope describe": (rope_main, ["describe"]),
    "ropescale rope describe": (ropescale_main, ["rope", "describe"]),
    "finetune train": (finetune_main, ["train"]),
    "eval generate": (eval_main, ["generate"]),
    "eval run": (eval_main, ["run"]),
    "probes ppl": (probes_main, ["ppl"]),
    "probes suffix-id": (probes_main, ["suffix-id"]),
    "probes copy": (probes_main, ["copy"]),
}


def _write(path: Path, obj) -> Path:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_help_lists_the_new_methods(name, capsys):
    main, head = ENTRIES[name]
    with pytest.raises(SystemExit) as e:
        main(head + ["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for m in NEW:
        assert m in out, (name, m)
    assert "--longrope-factors" in out and "--llama3-low-freq-factor" in out


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_a_bad_factor_file_is_one_line_and_exit_2_through_every_cli(name, tmp_path, capsys):
    f = _write(tmp_path / "f.json", {"short_factor": [1.0] * 32, "long_factor": [1.0] * 31 + [-1]})
    main, head = ENTRIES[name]
    rc = main(head + ["--rope", "longrope", "--scale", "8", "--longrope-factors", str(f), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err == f"error: {f}: long_factor values must be finite numbers > 0, got -1 (at index 31)\n"
    assert not (tmp_path / "o").exists()


def test_factors_of_the_wrong_length_for_the_model_are_refused_before_any_work(tmp_path, capsys):
    """A well-formed file whose lists do not match the model's rotary dim (tiny: 64, 32 pairs) is refused where the
    spec meets the config, by each stage that loads a model, in one line naming the factor file; nothing written."""
    f = _write(tmp_path / "f8.json", {"short_factor": [1.0] * 8, "long_factor": [1.0] * 8})
    data = _write(tmp_path / "d.jsonl", '{"context": "甲乙丙", "summary": "乙"}\n')
    flags = ["--rope", "longrope", "--scale", "8", "--longrope-factors", str(f)]
    runs = [(finetune_main, ["--output-dir", str(tmp_path / "o")]),
            (eval_main, ["generate", "--data", str(data), "--prompt", "ie", "--max-new-tokens", "4", "--out",
                         str(tmp_path / "o")]),
            (probes_main, ["ppl", "--out", str(tmp_path / "o")])]
    for main, argv in runs:
        rc = main(argv + flags)
        err = capsys.readouterr().err.splitlines()
        assert rc == 2 and err[-1].startswith("error: ") and sum(ln.startswith("error") for ln in err) == 1
        assert f"{f}: short_factor has 8 values; this model's rotary dim 64 needs 32 (one per pair)" in err[-1]
        assert not (tmp_path / "o").exists(), argv


# ---------------------------------------------------------------- reports: rows keyed by the full setting

A = {"short_factor": [1.0] * 32, "long_factor": [1.0 + 7 * i / 31 for i in range(32)]}
B = {"short_factor": [1.0] * 32, "long_factor": [1.0 + 7 * (i / 31) ** 2 for i in range(32)]}
REF = "【1】那怪闻言，急回头看。"


def _run(root: Path, name: str, rope: dict, right: bool, sid: int = 0) -> None:
    """Two generation run dirs (IE and IB, as Table 2 averages them) of one setting, all right or all empty; ``sid``:
    the sample's id (two runs of one setting pool only different samples)."""
    for prompt in ("ie", "ib"):
        d = root / f"{name}-{prompt}"
        d.mkdir(parents=True)
        meta = {"kind": "generate", "model": "tiny", "rope": rope, "prompt": prompt, "subset": "T1024",
                "backend": "hf"}
        _write(d / "run.json", meta)
        _write(d / "predictions.jsonl", json.dumps({"id": sid, "subset": "T1024", "prompt": prompt,
                                                    "input_tokens": 1000, "prediction": REF if right else "",
                                                    "reference": REF}, ensure_ascii=False) + "\n")


def _table2(argv, capsys) -> dict:
    assert eval_main(["report", *argv, "--view", "table2", "--format", "json", "--no-save-scores"]) == 0
    return json.loads(capsys.readouterr().out)


def test_runs_with_other_factors_are_other_rows_named_by_the_factor_hash(tmp_path, capsys):
    ha, hb = (LongRopeFactors.from_dict(x).short_hash for x in (A, B))
    lr = {"method": "longrope", "scale": 8.0, "orig_ctx": 512}
    _run(tmp_path, "a1", {**lr, "longrope_factors": {**A, "source": "one/a.json"}}, True)
    _run(tmp_path, "a2", {**lr, "longrope_factors": {**A, "source": "other/copy.json"}}, True, sid=1)  # same numbers
    _run(tmp_path, "b", {**lr, "longrope_factors": B}, False)
    _run(tmp_path, "y", {"method": "yarn", "scale": 8.0, "orig_ctx": 512}, True)
    _run(tmp_path, "dy", {"method": "dynamic_yarn", "scale": 8.0, "orig_ctx": 512}, False)
    _run(tmp_path, "l3", {"method": "llama3", "scale": 8.0, "orig_ctx": 512, "llama3_low": 2.0}, True)
    t2 = _table2([str(tmp_path)], capsys)
    cells = {label: row["avg"]["T1024"] for label, row in t2.items()}
    assert len(cells) == 5, cells
    la = [lab for lab in cells if f"factors={ha}" in lab]
    lb = [lab for lab in cells if f"factors={hb}" in lab]
    assert len(la) == 1 and len(lb) == 1 and ha != hb
    assert cells[la[0]] == pytest.approx(100.0) and cells[lb[0]] == 0.0  # a1 and a2 pooled, b apart
    assert any("dynamic_yarn x8" in lab for lab in cells) and any(lab.endswith("yarn x8") for lab in cells)
    assert any("llama3 x8 low=2" in lab for lab in cells)


def test_a_scores_csv_names_its_factor_file_in_a_column(tmp_path, capsys):
    _write(tmp_path / "a.json", A)
    _write(tmp_path / "b.json", B)
    csv = tmp_path / "scores.csv"
    csv.write_text("model,prompt,subset,rouge_l,rope,scale,longrope_factors\n"
                   "m,ie,L,30,longrope,8,a.json\nm,ib,L,20,longrope,8,a.json\n"
                   "m,ie,L,10,longrope,8,b.json\nm,ib,L,10,longrope,8,b.json\n"
                   "m,ie,L,5,yarn,8,\nm,ib,L,5,yarn,8,\n", encoding="utf-8")
    t2 = _table2(["--scores", str(csv)], capsys)
    ha, hb = (LongRopeFactors.from_dict(x).short_hash for x in (A, B))
    got = {next(h for h in (ha, hb, "yarn") if h in lab): row["avg"]["L"] for lab, row in t2.items()}
    assert got == {ha: 25.0, hb: 10.0, "yarn": 5.0}

    csv.write_text("model,prompt,subset,rouge_l,rope,scale\nm,ie,L,30,longrope,8\n", encoding="utf-8")
    assert eval_main(["report", "--scores", str(csv), "--no-save-scores"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {csv}:2: rope 'longrope' needs its factors: a longrope_factors column")
    assert err.count("\n") == 1

    _write(tmp_path / "bad.json", {"short_factor": [1.0] * 32, "long_factor": [1.0] * 31})
    csv.write_text("model,prompt,subset,rouge_l,rope,scale,longrope_factors\nm,ie,L,30,longrope,8,bad.json\n",
                   encoding="utf-8")
    assert eval_main(["report", "--scores", str(csv), "--no-save-scores"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {csv}:2: rope 'longrope' scale 8.0: {tmp_path / 'bad.json'}: short_factor has 32 "
                   f"values, long_factor 31: both need one per rotary pair\n")
