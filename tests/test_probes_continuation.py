"""probes continuation (ropescale.probes.continuation): the contamination check. A memoriser stub (it knows one
text's tokens and continues any prefix it has seen) gets 100 % exact matches on that text and fails where a name
was swapped; the name swap worked out by hand on a short text; the greedy decoder against transformers' generate;
0 of n read with a Wilson interval that is never [0, 0]; the command end to end on the tiny default."""
from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch

from ropescale.common.io import InputError
from ropescale.common.paths import DATA_DIR
from ropescale.probes import continuation as cont
from ropescale.probes.common import load_model
from ropescale.probes.data import Doc

FIRST = ["Anne", "Walter", "Elliot", "Harriet", "Bingley"]
VERBS = ["walked to", "looked at", "spoke of", "thought about", "wrote to", "laughed with", "waited for"]
PLACES = ["the garden", "the village", "the old church", "the long gallery", "the shrubbery", "the river"]


def hand_text(seed: int = 0, n: int = 60) -> str:
    """Sentences naming five people (each well over 10 times, mostly mid-sentence), seeded; every 120 characters
    hold a whole ``day N``, so a 120-token prompt (about a character a token) occurs once."""
    r = random.Random(seed)
    out = []
    for i in range(n):
        a, b = r.sample(FIRST, 2)
        out.append(f"On day {i} {a} {r.choice(VERBS)} {b} near {r.choice(PLACES)}, and then {b} went home.")
    return " ".join(out)


class Memoriser:
    """A language model that has memorised ``stream``: a prefix found in it is continued as the stream goes on; any
    other prefix by its longest suffix (up to 8 tokens) seen in the stream (the token after the first such place)."""

    def __init__(self, stream: list[int], vocab: int):
        self.stream, self.vocab = stream, vocab
        self.next = {}
        for k in range(8, 0, -1):
            for i in range(len(stream) - k):
                self.next.setdefault(tuple(stream[i:i + k]), stream[i + k])

    def predict(self, seq: list[int]) -> list[int]:
        n = len(seq)
        for s in range(len(self.stream) - n):
            if self.stream[s:s + n] == seq:
                return self.stream[s + 1:s + n + 1]
        out = []
        for j in range(n):
            nxt = 0
            for k in range(min(8, j + 1), 0, -1):
                if tuple(seq[j + 1 - k:j + 1]) in self.next:
                    nxt = self.next[tuple(seq[j + 1 - k:j + 1])]
                    break
            out.append(nxt)
        return out

    def __call__(self, input_ids, use_cache=False, logits_to_keep=0, **kw):
        past = kw.get("cache", kw.get("past_key_values")) or []
        seq = list(past) + input_ids[0].tolist()
        pred = self.predict(seq)[len(past):]
        logits = torch.zeros(1, len(pred), self.vocab)
        logits[0, torch.arange(len(pred)), torch.tensor(pred)] = 30.0
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return SimpleNamespace(logits=logits, cache=seq, past_key_values=seq)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def test_swap_names_by_hand():
    text = ("Anne met Walter. Then Anne and Walter talked, and Anne smiled at Walter's dog. Mr Elliot saw them, and "
            "Mr Elliot left on Monday; on Monday, Anne wept.\nThe End")
    # inside sentences: Anne 3 (not the first word), Walter 3, Elliot 2, End 1; Then (after '. '), Mr and Monday
    # (a title, a weekday) never count
    assert cont.character_names(text, 2) == ["Anne", "Walter", "Elliot"]
    assert cont.character_names(text, 1) == ["Anne", "Walter", "Elliot", "End"]
    # the pool's Walter occurs in the text: skipped; Anne (4) -> Ida (3, the nearest), Walter -> Bertha (6),
    # Elliot -> Osgood
    sw = cont.swap_names(text, 2, pool=("Walter", "Ida", "Bertha", "Osgood"))
    assert sw.names == {"Anne": "Ida", "Walter": "Bertha", "Elliot": "Osgood"}
    assert sw.text == ("Ida met Bertha. Then Ida and Bertha talked, and Ida smiled at Bertha's dog. Mr Osgood saw "
                       "them, and Mr Osgood left on Monday; on Monday, Ida wept.\nThe End")
    assert sw.where(text.index("Then")) == sw.text.index("Then")  # moved back by Anne -> Ida
    assert sw.where(1) == 0  # inside a replaced name: the new name's start
    assert sw.where(len(text)) == len(sw.text)
    assert cont.swap_names(text, 2, pool=("Walter",)).text == text  # the pool ran out: nothing replaced


def test_austen_names():
    text = (DATA_DIR / "english" / "austen" / "emma.txt").read_text(encoding="utf-8")
    names = cont.character_names(text, 10)
    assert {"Emma", "Harriet", "Knightley", "Weston", "Elton", "Woodhouse", "Churchill"} <= set(names)
    assert not {"Mr", "Mrs", "Miss", "The", "Sunday"} & set(names)
    sw = cont.swap_names(text, 10)
    assert "Harriet" not in sw.text and sw.names["Harriet"] not in text


def test_swap_keeps_the_token_count():
    from transformers import AutoTokenizer

    from ropescale.common.paths import QWEN2_TOKENIZER

    tok = AutoTokenizer.from_pretrained(str(QWEN2_TOKENIZER))
    text = (DATA_DIR / "english" / "austen" / "persuasion.txt").read_text(encoding="utf-8")[:150_000]

    def count(s: str) -> int:
        return len(tok(s, add_special_tokens=False)["input_ids"])

    sw = cont.swap_names(text, 10, cost=lambda w: count(" " + w))
    assert {"Anne", "Elliot", "Wentworth", "Musgrove"} <= set(sw.names)
    same = sum(count(" " + a) == count(" " + b) for a, b in sw.names.items())
    assert same >= 0.9 * len(sw.names), sw.names  # the pool has a name of each count for nearly every name
    assert abs(count(sw.text) - count(text)) <= 0.005 * count(text)


def test_greedy_is_transformers_greedy(tiny):
    ids = cont.tokens_with_offsets(tiny.tokenizer, hand_text())[0][:40]
    ref = tiny.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12, min_new_tokens=12,
                              attention_mask=torch.ones(1, 40, dtype=torch.long), pad_token_id=tiny.pad_id)
    assert cont.greedy(tiny.model, ids, 12) == ref[0, 40:].tolist()


def test_memoriser_copies_the_text_and_not_the_swapped_one(tiny, tmp_path):
    text = hand_text()
    ids = cont.tokens_with_offsets(tiny.tokenizer, text)[0]
    loaded = SimpleNamespace(**vars(tiny))
    loaded.model = Memoriser(ids, len(tiny.tokenizer))
    docs = [Doc("hand", "hand", text, "hand.txt:1")]
    s = cont.continuation_probe(loaded, docs, out=str(tmp_path / "run"), n=8, prompt_len=120, continuation=32,
                                min_name_count=10)
    assert set(s["names"]["hand"]) == set(FIRST)
    o, w = s["original"], s["names-swapped"]
    assert (o["exact"], o["n"], o["lcp_mean"]) == (8, 8, 32.0)  # every continuation is the text's own
    assert o["loss_mean"] < 1e-6
    assert w["exact"] < w["n"] and w["lcp_mean"] < 32
    recs = [json.loads(x) for x in (tmp_path / "run" / "items.jsonl").read_text().splitlines()]
    assert len(recs) == 16 and {r["group"] for r in recs} == set(cont.VARIANTS)
    swapped = [r for r in recs if r["group"] == "names-swapped"]
    new = set(s["names"]["hand"].values())
    # a swapped window whose continuation holds a new name is not continued as the text goes on
    with_name = [r for r in swapped if any(n in r["continuation"] for n in new)]
    assert with_name and all(r["exact"] == 0 for r in with_name)
    assert all(abs(r["prompt_tokens"] - 120) <= 8 for r in swapped)  # the same characters: about the same tokens
    assert s["loss_diff"]["mean"] > 0.5 and s["loss_diff"]["n"] == 8


def test_no_match_reads_with_a_wilson_interval_above_zero(tiny, tmp_path):
    text = hand_text(1)
    loaded = SimpleNamespace(**vars(tiny))
    loaded.model = Memoriser([0, 0], len(tiny.tokenizer))  # continues everything with token 0: never the text
    s = cont.continuation_probe(loaded, [Doc("hand", "hand", text, "hand.txt:1")], out=str(tmp_path / "run"), n=5,
                                prompt_len=16, continuation=8)
    o = s["original"]
    assert (o["exact"], o["n"]) == (0, 5) and o["exact_interval"][0] == pytest.approx(0, abs=1e-12)
    assert o["exact_interval"][1] == pytest.approx(0.4345, abs=1e-3)  # Wilson's 0 of 5: z^2 / (n + z^2)


def test_command_on_the_tiny_default(tmp_path, capsys):
    from ropescale.probes.cli import main

    d = tmp_path / "texts"
    d.mkdir()
    (d / "a.txt").write_text(hand_text(2, 20), encoding="utf-8")
    (d / "b.txt").write_text(hand_text(3, 20), encoding="utf-8")
    argv = ["continuation", "--model", "tiny", "--data", str(d), "--n", "2", "--prompt-len", "24", "--continuation",
            "6", "--min-name-count", "3", "--out", str(tmp_path / "run"), "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["original"]["n"] == 4 and out["names-swapped"]["n"] == 4 and set(out["names"]) == {"a", "b"}
    lines = (tmp_path / "run" / "items.jsonl").read_text().splitlines()
    assert len(lines) == 8
    assert main(argv) == 0  # resumed: nothing added
    assert (tmp_path / "run" / "items.jsonl").read_text().splitlines() == lines
    with pytest.raises(InputError) as e:  # a text shorter than a window: one line naming its file
        cont.draw_starts(1633, 2, 5032, 0, Doc("a", "a", "", f"{d / 'a.txt'}:1"))
    assert str(e.value) == (f"{d / 'a.txt'}: document a: 1633 tokens, a window needs 5032 (--prompt-len + "
                            f"--continuation)")


def test_data_takes_several_paths_in_order(tmp_path):
    """--data a,b: the documents of each path in the order given (a directory's sorted), one id twice refused."""
    d = tmp_path / "texts"
    d.mkdir()
    for name, k in (("b", 2), ("c", 3)):
        (d / f"{name}.txt").write_text(hand_text(k, 20), encoding="utf-8")
    (tmp_path / "a.txt").write_text(hand_text(4, 20), encoding="utf-8")
    docs = cont.load_texts(cont.ContinuationSettings(data=f"{d / 'c.txt'},{tmp_path / 'a.txt'}"))
    assert [x.id for x in docs] == ["c", "a"] and docs[1].text == hand_text(4, 20)
    assert [x.id for x in cont.load_texts(cont.ContinuationSettings(data=f"{tmp_path / 'a.txt'},{d}"))] == \
        ["a", "b", "c"]
    with pytest.raises(InputError, match="document 'c' twice"):
        cont.load_texts(cont.ContinuationSettings(data=f"{d},{d / 'c.txt'}"))
