"""Issue 23.1: exact recall per mark for the recall task, beside ROUGE-L, and the marks-only floor. Checked on
hand-made predictions (every mark right, none, the marks alone, a right sentence under a wrong mark) and on a
report of hand-made runs whose per-mark shares are counted by hand."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ropescale.common.recall import mark_recall, marked_sentences, marks_only, reference
from ropescale.evaluation.cli import main as eval_main
from ropescale.evaluation.score import score_records

S = ["那怪闻言，急回头看。", "三藏在马上叫道。", "行者笑道：“不妨。”", "八戒只是不语。"]
REF = reference(S)  # 【1】那怪闻言，急回头看。\n【2】三藏在马上叫道。\n...


def test_the_reference_format_read_back():
    assert REF.splitlines()[1] == "【2】三藏在马上叫道。"
    assert marked_sentences(REF) == S
    assert marked_sentences("宝玉和黛玉在园中读书。") is None  # a CNNSum summary: not the recall task
    assert marked_sentences("【2】a\n【1】b") is None  # marks out of order
    assert mark_recall("anything", "a plain summary") is None


@pytest.mark.parametrize("prediction,expected", [
    (REF, [True, True, True, True]),  # every mark right
    ("", [False, False, False, False]),  # nothing
    ("【1】\n【2】\n【3】\n【4】", [False, False, False, False]),  # the marks alone
    ("【1】那怪闻言，急回头看。\n【2】八戒只是不语。\n【3】 行者笑道：“不妨。” \n【4】", [True, False, True, False]),
    ("【2】那怪闻言，急回头看。\n【1】三藏在马上叫道。", [False, False, False, False]),  # right sentences, wrong marks
    ("【1】那怪闻言，急回头看。【2】三藏在马上叫道。", [True, True, False, False]),  # no line break between them
    ("那怪闻言，急回头看。\n三藏在马上叫道。", [False, False, False, False]),  # no marks: not recall by mark
    ("【1】那怪闻言，急回头看。再说", [False, False, False, False]),  # more than the sentence
])
def test_mark_recall_on_hand_made_predictions(prediction, expected):
    assert mark_recall(prediction, REF) == expected


def test_marks_only_is_the_floor_prediction():
    assert marks_only(REF) == "【1】\n【2】\n【3】\n【4】"
    assert marks_only("no marks") is None


def _run(root: Path, name: str, prompt: str, predictions: list[str]) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"kind": "generate", "model": "tiny", "rope": {"method": "none"},
                                            "prompt": prompt, "subset": "T1024"}), encoding="utf-8")
    (d / "predictions.jsonl").write_text("".join(json.dumps(
        {"id": i, "subset": "T1024", "input_tokens": 900, "prediction": p, "reference": REF}, ensure_ascii=False)
        + "\n" for i, p in enumerate(predictions)), encoding="utf-8")


def test_the_recall_table_counts_marks_and_shows_the_floor(tmp_path, capsys):
    """IE: 4 samples -- all right, marks 1+2 right, mark 1 under mark 2, nothing; IB: 1 sample, all right. Per
    mark (IE share, IB share) -> mean of the two prompts: mark 1 (2/4, 1) -> 75, mark 2 (2/4, 1) -> 75, marks 3
    and 4 (1/4, 1) -> 62.5."""
    ie = [REF, "【1】那怪闻言，急回头看。\n【2】三藏在马上叫道。", "【2】那怪闻言，急回头看。", ""]
    _run(tmp_path, "ie", "ft-ie", ie)
    _run(tmp_path, "ib", "ft-ib", [REF])
    out = tmp_path / "tables"
    assert eval_main(["report", str(tmp_path), "--out", str(out), "--no-save-scores"]) == 0
    md = capsys.readouterr().out
    for ext in ("md", "csv", "json"):
        assert (out / f"recall.{ext}").stat().st_size > 0
    rec = json.loads((out / "recall.json").read_text(encoding="utf-8"))
    assert rec["marks"] == 4
    (row,) = [r for r in rec["rows"] if not r["floor"]]
    # n: 4 eval samples (sample 0 is scored under both prompts: one sample, not two)
    assert row["marks"] == [75.0, 75.0, 62.5, 62.5] and row["mean"] == 68.75 and row["n"] == 4
    rouge = [score_records([{"prediction": p, "reference": REF}])["rouge_l"] for p in ie]
    assert row["rouge_l"] == pytest.approx((sum(rouge) / 4 + 100.0) / 2, abs=0.01)
    # the floor: what a prediction of the marks alone scores (ROUGE-L well above 0, exact recall 0)
    (floor,) = [r for r in rec["rows"] if r["floor"]]
    want = score_records([{"prediction": "【1】\n【2】\n【3】\n【4】", "reference": REF}])["rouge_l"]
    assert floor["model"] == "marks only (floor)" and floor["marks"] == [0.0] * 4 and floor["mean"] == 0.0
    assert floor["rouge_l"] == pytest.approx(want, abs=0.01) and 5 < want < 60
    assert "Recall task: exact recall per mark" in md and "| marks only (floor) | T1024 | 0.00 |" in md
