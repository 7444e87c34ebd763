"""Issue 23.6: reports never pool different settings. Two runs that differ only in --rope-base, in YaRN's alpha, in
the prompt wording, or in being fine-tuned, are two rows in every view (Table 2, Table 7, extrapolation, failure
modes, recall, the Fig. 3 legend, the probes report), each labelled by what differs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ropescale.evaluation.cli import main as eval_main
from ropescale.evaluation.report.intake import build_report
from ropescale.evaluation.report.plot import series_from_runs

REF = "【1】那怪闻言，急回头看。\n【2】三藏在马上叫道。"  # a recall reference: two marked sentences
NONE = {"method": "none", "scale": 1.0}
ABF8, ABF5 = ({"method": "abf", "scale": 1.0, "rope_base": b} for b in (8e4, 5e5))
YARN1, YARN01 = ({"method": "yarn", "scale": 8.0, "orig_ctx": 512, "yarn_alpha": a} for a in (1.0, 0.1))


def make_run(root: Path, name: str, *, rope: dict, prompt: str, right: bool, style: str | None = None,
             extra: dict | None = None) -> Path:
    """A generation run directory in the layout every version reads (flat settings at the top of run.json): two
    samples whose predictions are all right (ROUGE-L 100, recall 100) or empty (0)."""
    d = root / name
    d.mkdir(parents=True)
    meta = {"kind": "generate", "model": "tiny", "rope": rope, "prompt": prompt, "prompt_style": style,
            "subset": "T1024", "backend": "hf", **(extra or {})}
    (d / "run.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
    (d / "predictions.jsonl").write_text("".join(json.dumps(
        {"id": i, "subset": "T1024", "prompt": prompt, "input_tokens": 1000 + i, "prediction": REF if right else "",
         "reference": REF}, ensure_ascii=False) + "\n" for i in range(2)), encoding="utf-8")
    return d


def _report(root, capsys, view):
    assert eval_main(["report", str(root), "--view", view, "--format", "json", "--no-save-scores"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("a,b,differs", [
    (dict(rope=ABF8), dict(rope=ABF5), ("base=8e4", "base=5e5")),
    (dict(rope=YARN1), dict(rope=YARN01), ("a=1", "a=0.1")),
    (dict(rope=NONE, style="release"), dict(rope=NONE, style="paper"), ("release", "paper")),
])
def test_two_settings_are_two_rows_in_every_view(tmp_path, capsys, a, b, differs):
    """The issue's case among them: abf with rope_base 8e4 (all right) and 5e5 (all empty) used to be one row,
    'abf x1', 50.00 = the mean of 100 and 0."""
    prompts = ("ie", "ib") if "style" in a else ("ft-ie", "ft-ib")
    for tag, kw, right in (("a", a, True), ("b", b, False)):
        for p in prompts:
            make_run(tmp_path, f"{tag}-{p}", prompt=p, right=right, **kw)
    t2 = _report(tmp_path, capsys, "table2")
    assert len(t2) == 2
    (la, ra), (lb, rb) = sorted(t2.items(), key=lambda kv: -kv[1]["avg"]["T1024"])
    assert differs[0] in la and differs[1] in lb, (la, lb)
    assert ra["avg"]["T1024"] == pytest.approx(100.0, abs=1e-3) and rb["avg"]["T1024"] == 0.0
    t7 = _report(tmp_path, capsys, "table7")
    assert sorted((r["model"], r["prompt"]) for r in t7) == sorted((lab, k) for lab in (la, lb) for k in ("IE", "IB"))
    ex = _report(tmp_path, capsys, "extrapolation")["rows"]
    assert sorted(r["label"] for r in ex) == sorted([la, lb])
    assert {r["label"]: r["cells"]["T1024"] for r in ex} == pytest.approx({la: 100.0, lb: 0.0}, abs=1e-3)
    fails = _report(tmp_path, capsys, "failures")
    assert {Path(r["run"]).name[0]: r["label"] for r in fails} == {"a": la, "b": lb}
    rec = _report(tmp_path, capsys, "recall")["rows"]
    assert {r["model"]: r["marks"] for r in rec if not r["floor"]} == {la: [100.0, 100.0], lb: [0.0, 0.0]}
    legend = {s["label"] for s in series_from_runs(build_report([tmp_path]).runs)}
    assert legend == {la, lb}


def test_fine_tuned_and_load_time_rows_are_told_apart(tmp_path, capsys):
    """The same method and scale, fine-tuned (the model carries a training record) or applied at load time."""
    train = {"id": "run1", "step": 24, "length": {"mean": 1536.4, "min": 1090, "max": 2024}}
    for p in ("ft-ie", "ft-ib"):
        make_run(tmp_path, f"ft-{p}", rope=YARN1, prompt=p, right=True, extra={"train": train})
        make_run(tmp_path, f"load-{p}", rope=YARN1, prompt=p, right=False)
    assert set(_report(tmp_path, capsys, "table2")) == {"tiny · yarn x8 (ft 1536)", "tiny · yarn x8 (no fine-tune)"}
    (ft,) = [r for r in _report(tmp_path, capsys, "extrapolation")["rows"] if r["train"]]
    assert ft["train_length"] == {"mean": 1536.4, "min": 1090, "max": 2024} and ft["train"] == "run1@24"
    assert eval_main(["report", str(tmp_path), "--view", "extrapolation"]) == 0
    md = capsys.readouterr().out
    # n = 2 eval samples a row, each under both prompts; markdown cells carry their interval by default
    assert "| tiny | yarn x8 | 1536 (1090-2024) | 2 | 100.00 [100.0, 100.0] |" in md
    assert "| tiny | yarn x8 | - | 2 | 0.00 [0.0, 0.0] |" in md


def test_probe_runs_that_differ_in_the_rope_base_are_two_rows(tmp_path):
    from ropescale.evaluation.report.intake import load_probe_runs as load_runs
    from ropescale.evaluation.report.probes import render_probes as render

    for name, rope, v in (("b8", ABF8, 1.0), ("b5", ABF5, 3.0)):
        d = tmp_path / name
        d.mkdir()
        (d / "run.json").write_text(json.dumps({"kind": "probe", "probe": "ppl", "model": "tiny", "rope": rope,
                                                "lengths": [512], "metric": "loss", "column": "N"}))
        (d / "items.jsonl").write_text(json.dumps({"id": "a", "group": "", "col": 512, "value": v}) + "\n")
    md = render(load_runs([tmp_path]), "md")
    assert "| tiny | abf x1 base=8e4 | 1 | 1.000 |" in md and "| tiny | abf x1 base=5e5 | 1 | 3.000 |" in md
