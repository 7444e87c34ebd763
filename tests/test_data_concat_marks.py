"""``python -m data_concat unique-marks``: each pair's marks in brackets of its own, worked by hand on the tiny
default's tokenizer (every bracket one token): the ids, the labels, the pair starts and lengths, the counts, the
output rule and the one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "assets" / "tiny"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY))


def enc(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def packed_set(tmp_path: Path, tok, samples: list[list[str]], name: str = "src",
               labelled: dict | None = None) -> tuple[Path, list]:
    """A packed set of ``samples`` (each a list of pair texts), written with the one writer; ``labelled``: {sample:
    number of trailing tokens labelled}. Returns the directory and each sample's (ids, labels, starts)."""
    from data_concat.packed import write_packed

    rows = []
    for i, pairs in enumerate(samples):
        ids, starts = [], []
        for p in pairs:
            starts.append(len(ids))
            ids += enc(tok, p)
        n = (labelled or {}).get(i, 0)
        labels = [-100] * (len(ids) - n) + ids[len(ids) - n:]
        rows.append((ids, labels, starts))
    cols = {"input_ids": [x for r in rows for x in r[0]], "labels": [x for r in rows for x in r[1]],
            "pair_starts": [r[2] for r in rows], "pair_ids": [[f"{i}-{k}" for k in range(len(s))]
                                                              for i, s in enumerate(samples)],
            "length": [len(r[0]) for r in rows]}
    d = tmp_path / name
    write_packed(d, cols, {"format": "ropescale-packed", "tokenizer": str(TINY)}, {"samples": len(rows)})
    return d, rows


def test_every_bracket_is_one_token(tok):
    from data_concat.marks import STYLES, style_ids

    ids = style_ids(tok)
    assert len(ids) == len(STYLES) == 8 and len(set(ids)) == 8
    assert ids[0] == (enc(tok, "【")[0], enc(tok, "】")[0])
    assert ids[3][0] == ids[3][1] == enc(tok, "#")[0]  # #k#: one token opens and closes


def test_pairs_get_their_own_brackets_by_hand(tmp_path, tok):
    """Sample 0: three pairs, the last one's "【3】戊" labelled (an answer); sample 1: one pair (unchanged)."""
    from data_concat.marks import unique_marks
    from data_concat.packed import load_meta, load_packed

    src, rows = packed_set(tmp_path, tok, [["甲【1】乙【2】", "丙【1】丁", "【3】戊"], ["【4】己"]], labelled={0: 3})
    counts = unique_marks(src, tmp_path / "dst")
    got = load_packed(tmp_path / "dst")
    want0 = enc(tok, "甲【1】乙【2】") + enc(tok, "丙[1]丁") + enc(tok, "<3>戊")
    assert len(want0) == len(rows[0][0]) and got[0]["input_ids"] == want0
    assert got[0]["labels"][:-3] == rows[0][1][:-3] and got[0]["labels"][-3:] == enc(tok, "<3>戊")[-3:]
    assert got[1]["input_ids"] == rows[1][0] == enc(tok, "【4】己") and got[1]["labels"] == rows[1][1]
    for g, (ids, _, starts) in zip(got, rows):
        assert g["pair_starts"] == starts and g["length"] == len(ids)
    assert counts == {"samples": 2, "pairs": 4, "brackets_replaced": 4, "samples_with_repeats": 0}
    meta = load_meta(tmp_path / "dst")
    assert meta["marks"] == "each pair of a sample in its own brackets" and meta["tokenizer"] == str(TINY)
    stats = json.loads((tmp_path / "dst" / "stats.json").read_text(encoding="utf-8"))
    assert stats["samples"] == 2 and stats["unique_marks"] == counts


def test_all_eight_styles_then_a_repeat(tmp_path, tok):
    """Ten one-mark pairs: 【】 [] <> ## ^^ || ** () and then 【】 [] again (the ninth pair repeats the first)."""
    from data_concat.marks import unique_marks
    from data_concat.packed import load_packed

    src, _ = packed_set(tmp_path, tok, [[f"【{k}】" for k in range(1, 11)]])
    counts = unique_marks(src, tmp_path / "dst")
    text = "".join(f"{o}{k}{c}" for k, (o, c) in enumerate(
        ["【】", "[]", "<>", "##", "^^", "||", "**", "()", "【】", "[]"], 1))
    want = [t for k, (o, c) in enumerate(["【】", "[]", "<>", "##", "^^", "||", "**", "()", "【】", "[]"], 1)
            for t in enc(tok, f"{o}{k}{c}")]
    assert load_packed(tmp_path / "dst")[0]["input_ids"] == want
    assert tok.decode(want) == text
    assert counts == {"samples": 1, "pairs": 10, "brackets_replaced": 2 * 8, "samples_with_repeats": 1}


def test_command_line_output_rule_and_errors(tmp_path, tok, capsys):
    from data_concat.cli import main
    from data_concat.packed import load_packed

    src, _ = packed_set(tmp_path, tok, [["甲【1】", "乙【2】"]])
    out = tmp_path / "out"
    assert main(["unique-marks", "--data", str(src), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["brackets_replaced"] == 2
    assert load_packed(out)[0]["input_ids"] == enc(tok, "甲【1】") + enc(tok, "乙[2]")
    assert main(["unique-marks", "--data", str(src), "--out", str(out), "--tokenizer", "tiny"]) == 0  # ours: replaced
    assert "1 samples, 2 pairs, 2 brackets rewritten" in capsys.readouterr().out
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine", encoding="utf-8")
    assert main(["unique-marks", "--data", str(src), "--out", str(foreign)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "foreign" in err[0] and "notes.txt" in err[0] and "--overwrite" in err[0]
    assert (foreign / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert main(["unique-marks", "--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing" in err[0] and "not a packed dataset" in err[0]
    assert not (tmp_path / "o2").exists()


def test_a_bracket_of_several_tokens_is_refused(tok):
    from data_concat.marks import style_ids
    from ropescale.common.io import InputError

    class Split:  # a tokenizer that writes "<" as two tokens
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [1, 2] if text == "<" else tok(text, add_special_tokens=False)["input_ids"]}

    with pytest.raises(InputError, match="<> is not one token each"):
        style_ids(Split())
