"""Probes on the tiny default read the chapters its build held out (assets/tiny/tiny.json), not its training text,
unless --data says otherwise (issue 23.8)."""
import json

import pytest

import ropescale.probes.data as pdata
from ropescale.common.chapters import read_chapters
from ropescale.common.models import ASSET_DIR
from ropescale.common.paths import CHAPTERS_JSONL


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(pdata, "CACHE_DIR", tmp_path / "cache")
    return tmp_path / "cache"


def _recorded():
    return json.loads((ASSET_DIR / "tiny.json").read_text(encoding="utf-8"))["heldout_chapters"]


def test_tiny_reads_the_chapters_its_build_held_out(cache):
    from ropescale.probes.ppl import PplSettings

    s = pdata.heldout_default(PplSettings(model="tiny", out="x"), data_given=False, log=lambda m: None)
    held = [f"{c.book}:{c.chapter}" for c in read_chapters(s.data)]
    assert s.data != str(CHAPTERS_JSONL) and sorted(held) == sorted(_recorded())
    assert len(held) == 48  # 12 chapters of each of the 4 books
    # the build's training text is every other chapter: none of it is read
    every = [f"{c.book}:{c.chapter}" for c in read_chapters(CHAPTERS_JSONL)]
    assert set(every) - set(held) and not set(held) - set(every)
    # the same chapters, text and all, as the shared file holds them
    shared = {f"{c.book}:{c.chapter}": c.text for c in read_chapters(CHAPTERS_JSONL)}
    assert all(c.text == shared[f"{c.book}:{c.chapter}"] for c in read_chapters(s.data))


def test_other_models_and_explicit_data_are_left_alone(cache, make_tiny_model, tmp_path):
    from ropescale.probes.ppl import PplSettings

    s = PplSettings(model="tiny", out="x")
    assert pdata.heldout_default(s, data_given=True) is s  # --data given, even the default path
    other = PplSettings(model="tiny", out="x", data=str(tmp_path / "docs.jsonl"))
    assert pdata.heldout_default(other, data_given=False) is other
    _, model_dir = make_tiny_model("qwen2", orig_ctx=64)  # not a tiny build: no tiny.json
    plain = PplSettings(model=str(model_dir), out="x")
    assert pdata.heldout_default(plain, data_given=False) is plain


def test_the_command_records_the_heldout_chapters(cache, tmp_path, capsys):
    from ropescale.probes.cli import main

    out = tmp_path / "ppl"
    assert main(["ppl", "--model", "tiny", "--n", "2", "--lengths", "32,64", "--out", str(out), "--json"]) == 0
    meta = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert meta["data"] == str(pdata.tiny_heldout_file("tiny"))
    assert sorted(f"{c.book}:{c.chapter}" for c in read_chapters(meta["data"])) == sorted(_recorded())
    assert "held out from training" in capsys.readouterr().err
