"""The tiny default (issue 14): a build is deterministic (same weights bit for bit), the committed asset is the
default and is checked against its sha256, and what the build measures is recorded."""
import json
import shutil

import pytest

import ropescale.common.tiny as tiny
from ropescale.common.io import InputError, sha256_file

MINI = tiny.TinySpec(vocab_size=1000, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                     orig_ctx=512, tokenizer_chars=150_000, steps=4, batch_size=2, warmup=2, short_steps=2,
                     short_len=32, short_batch=4, heldout_per_book=3, heldout_windows=2)


@pytest.fixture(scope="module")
def small_chapters(tmp_path_factory, chapters):
    """Two books of 10 chapters each from the shared novels (keeps the build's tokenizing fast)."""
    rows, per = [], {}
    for c in chapters:
        if per.get(c["book"], 0) < 10 and c["book"] in ("sanguo_yanyi", "xiyou_ji"):
            per[c["book"]] = per.get(c["book"], 0) + 1
            rows.append(c)
    p = tmp_path_factory.mktemp("chs") / "chapters.jsonl"
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return p


def test_build_is_deterministic(tmp_path, small_chapters):
    a = tiny.build_tiny(MINI, tmp_path / "a", chapters_path=small_chapters, log=lambda m: None)
    b = tiny.build_tiny(MINI, tmp_path / "b", chapters_path=small_chapters, log=lambda m: None)
    for f in (tiny.MODEL_FILE, "tokenizer.json", "config.json"):
        assert sha256_file(a / f) == sha256_file(b / f), f
    info = json.loads((a / "tiny.json").read_text(encoding="utf-8"))
    assert info["key"] == MINI.key() and info["sha256"][tiny.MODEL_FILE] == sha256_file(a / tiny.MODEL_FILE)
    for k in ("ppl_heldout", "ppl_heldout_random", "copy_loss", "nocopy_loss", "recall_rouge_l", "train_log"):
        assert k in info
    assert set(info["recall_rouge_l"]) == {"ft-ie", "ft-ib"}
    # the held-out chapters are the last ones of each book, and the build says which
    assert info["heldout_chapters"] == ["sanguo_yanyi:8", "sanguo_yanyi:9", "sanguo_yanyi:10",
                                        "xiyou_ji:8", "xiyou_ji:9", "xiyou_ji:10"]


def test_mixture_phases(small_chapters, tiny_tokenizer):
    from ropescale.common.chapters import read_chapters
    from ropescale.common.recall import sources, split_part

    chs = split_part(read_chapters(small_chapters), "train", 3)
    ids = tiny_tokenizer("".join(c.text for c in chs), add_special_tokens=False)["input_ids"]
    mix = tiny.Mixture(MINI, tiny_tokenizer, ids, sources(chs, tiny_tokenizer), seed=0)
    first, later = mix.batch(0), mix.batch(MINI.short_steps)
    assert len(first) == MINI.short_batch and all(len(w) == MINI.short_len for w in first)
    assert len(later) == MINI.batch_size and all(len(w) == MINI.orig_ctx for w in later)
    # a recall window holds the F.2 prompt, the marked sentences as the answer, then EOS
    w = mix.recall(MINI.orig_ctx)
    text = tiny_tokenizer.decode(w)
    assert "[摘要]" in text and "【1】" in text and tiny_tokenizer.eos_token_id in w
    # synthetic windows are repeats: every token after the first block is predictable by looking back
    s = mix.synthetic(64)
    assert len(s) == 64 and len(set(s)) < 40


def test_the_committed_asset_is_the_default_and_is_checked(tmp_path, monkeypatch):
    info = tiny.asset_info()
    assert info is not None, "assets/tiny is missing"
    assert info["key"] == tiny.DEFAULT_SPEC.key(), "assets/tiny was built from another spec: rebuild it"
    assert tiny.resolve_model("tiny") == tiny.ASSET_DIR
    assert sha256_file(tiny.ASSET_DIR / tiny.MODEL_FILE) == info["sha256"][tiny.MODEL_FILE]
    # a damaged copy is refused with a clear line
    bad = tmp_path / "tiny"
    shutil.copytree(tiny.ASSET_DIR, bad)
    with open(bad / tiny.MODEL_FILE, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    monkeypatch.setattr(tiny, "ASSET_DIR", bad)
    monkeypatch.setattr(tiny, "_VERIFIED", set())
    with pytest.raises(InputError, match="sha256"):
        tiny.resolve_model("tiny")
