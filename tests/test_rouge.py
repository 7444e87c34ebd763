"""ropescale.common.rouge against the real scorers: PyPI rouge==1.0.1 (CNNSum/CLongEval) and rouge-score (standard).

The reference packages are test-only dependencies. rouge 1.0.1 reconstructs its LCS recursively, so it runs
in a thread with a 512 MB stack and a raised recursion limit.
"""
from __future__ import annotations

import json
import random
import sys

import jieba
import pytest
from rouge import Rouge
from rouge import rouge_score as pkg_rouge_score
from rouge_score import rouge_scorer

from ropescale.common import rouge as R
from ropescale.common.paths import DATA_DIR
from ropescale.common.rouge_reference import run_big_stack

CLONGEVAL = sorted((DATA_DIR / "clongeval").glob("*.jsonl"))


def official(prediction: str, reference: str) -> tuple[float, bool]:
    """CLongEval metrics.rouge_zh_score with the real package: (score, raised). A ValueError of the package
    (nothing left after its '.' split) is what the issue fixes at 0."""
    if prediction == "":
        return 0.0, False
    p = " ".join(jieba.cut(prediction, cut_all=False))
    r = " ".join(jieba.cut(reference, cut_all=False))
    try:
        return Rouge().get_scores(p, r)[0]["rouge-l"]["f"], False
    except ValueError:
        return 0.0, True


def official_many(pairs):
    return run_big_stack(lambda: [official(p, r) for p, r in pairs])


def _real_pairs(per_file: int = 42, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for f in CLONGEVAL:
        rows = [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
        for r in rng.sample(rows, min(per_file, len(rows))):
            pairs.append((r["prediction"], r["reference"]))
    return pairs


EDGE_CASES = [
    ("", "参考摘要。"),
    ("   ", "参考摘要。"),
    ("\n\n", "参考摘要。"),
    (".", "参考摘要。"),
    ("....", "参考摘要。"),
    (". . .", "参考摘要。"),
    (" . \n . ", "参考 . 摘要 . . 。"),  # whitespace-only sentences on both sides (the word "")
    ("，。！？", "参考摘要。"),
    ("！！！", "！！！"),
    ("The quick brown fox jumps over the lazy dog.", "A quick brown dog jumps over the lazy fox."),
    ("Mr. Smith went to Washington. He met Dr. Jones.", "Dr. Jones met Mr. Smith in Washington."),
    ("3.14159 是圆周率，2.718 是自然常数。", "圆周率约等于3.14，自然常数约等于2.718。"),
    ("1234567890 9876543210", "1234567890"),
    ("第一行\n第二行\r\n第三行\t结束", "第一行 第二行\n第三行"),
    ("他说：“你好。”然后离开了。", "他离开了。"),
    ("a.b.c.d", "d.c.b.a"),
    ("U.S.A. 和 e.g. 以及 ... 省略号", "U.S.A.的省略号..."),
    ("同一个词 同一个词 同一个词", "同一个词"),
    ("摘要：\n\n\n摘要：\n\n\n摘要：", "宝玉和黛玉在园中读书。"),
    ("宝玉和黛玉在园中读书。", ""),
    ("宝玉和黛玉在园中读书。", "."),
    ("宝玉和黛玉在园中读书。", "宝玉和黛玉在园中读书。"),
    ("Ｆｕｌｌ　ｗｉｄｔｈ　空格\u3000和\xa0不换行空格", "Ｆｕｌｌ　ｗｉｄｔｈ 空格"),
]


@pytest.fixture(scope="module")
def real_pairs():
    return _real_pairs()


def test_agrees_with_rouge_package_on_real_pairs(real_pairs):
    assert len(real_pairs) >= 200
    ours = [R.cnnsum_rouge_l(p, r) for p, r in real_pairs]
    ref = official_many(real_pairs)
    assert not any(raised for _, raised in ref)
    diffs = [abs(a - b) for a, (b, _) in zip(ours, ref)]
    assert max(diffs) <= 1e-9, max(diffs)
    # the scores are real, varied numbers (a broken scorer returning a constant would fail above anyway)
    assert 0.05 < sum(ours) / len(ours) < 0.5 and len({round(x, 6) for x in ours}) > 180


def test_agrees_on_chapter_texts(chapters):
    rng = random.Random(1)
    pairs = []
    for ch in rng.sample(chapters, 12):
        t = ch["text"]
        a = rng.randrange(0, max(1, len(t) - 700))
        pred = t[a:a + rng.randint(200, 600)]
        # reference: the chapter title (a real one-line summary) or an overlapping excerpt
        ref = ch["title"] if rng.random() < 0.5 else t[a + 100:a + 100 + rng.randint(200, 600)]
        pairs.append((pred, ref))
    ours = [R.cnnsum_rouge_l(p, r) for p, r in pairs]
    ref = official_many(pairs)
    assert max(abs(a - b) for a, (b, _) in zip(ours, ref)) <= 1e-9
    assert any(x > 0.3 for x in ours)  # the overlapping excerpts do score


def test_agrees_on_edge_cases():
    ours = [R.cnnsum_rouge_l(p, r) for p, r in EDGE_CASES]
    ref = official_many(EDGE_CASES)
    for (p, r), a, (b, raised) in zip(EDGE_CASES, ours, ref):
        assert abs(a - b) <= 1e-9, (p, r, a, b)
    raised = {(p, r) for (p, r), (_, x) in zip(EDGE_CASES, ref) if x}
    # exactly the inputs with nothing left after the package's '.' split raise there and score 0 here
    assert raised == {(".", "参考摘要。"), ("....", "参考摘要。"), ("宝玉和黛玉在园中读书。", ""),
                      ("宝玉和黛玉在园中读书。", ".")}
    assert R.cnnsum_rouge_l(".", "参考摘要。") == 0.0
    assert R.cnnsum_rouge_l("", "参考摘要。") == 0.0
    same = R.cnnsum_rouge_l("宝玉和黛玉在园中读书。", "宝玉和黛玉在园中读书。")
    assert same == 2.0 * (1.0 / (2.0 + 1e-8))  # p = r = 1 in the package's f formula


def test_very_long_texts_no_recursion_limit(chapters):
    """> 1000 tokens: the package's recursive traceback crashes at the default recursion limit; ours does not."""
    ch = max(chapters, key=lambda c: len(c["text"]))
    t = ch["text"]
    pred = t[:1600]
    assert len(jieba.lcut(pred)) > 1000
    with pytest.raises(RecursionError):  # what the package does with such a prediction by default
        run_default_stack_package(pred, ch["title"])
    pairs = [(pred, ch["title"]), (pred, t[1200:1800])]
    ours = [R.cnnsum_rouge_l(p, r) for p, r in pairs]
    ref = official_many(pairs)
    assert max(abs(a - b) for a, (b, _) in zip(ours, ref)) <= 1e-9
    assert ours[1] > 0.1
    # and far past what the package can do in reasonable time still works
    long_pred = "".join(c["text"] for c in chapters[:3])[:20000]
    assert 0.0 < R.cnnsum_rouge_l(long_pred, t[:20000]) < 1.0


def run_default_stack_package(pred, ref):
    p = " ".join(jieba.cut(pred))
    r = " ".join(jieba.cut(ref))
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        return Rouge().get_scores(p, r)
    finally:
        sys.setrecursionlimit(old)


def test_summary_level_lcs_matches_package_on_tie_heavy_sequences():
    """Tiny alphabets make many LCSs of equal length: the reconstructed one (and its word set) must be the
    package's, not just its length."""
    rng = random.Random(7)
    for _ in range(1500):
        k = rng.randint(1, 6)
        alphabet = "abcdefg"[:k]

        def sent():
            return [rng.choice(alphabet) for _ in range(rng.randint(1, 30))]

        hyp = [sent() for _ in range(rng.randint(1, 3))]
        ref = [sent() for _ in range(rng.randint(1, 3))]
        expect = pkg_rouge_score.rouge_l_summary_level([" ".join(s) for s in hyp], [" ".join(s) for s in ref])
        assert R.rouge_l_summary_level(hyp, ref) == expect, (hyp, ref)


def test_recon_lcs_matches_package_reconstruction():
    rng = random.Random(3)
    for _ in range(500):
        x = [rng.choice("abcd") for _ in range(rng.randint(0, 25))]
        y = [rng.choice("abcd") for _ in range(rng.randint(0, 25))]
        expect = set(pkg_rouge_score._recon_lcs(x, y)._ngrams) if x and y else set()
        assert R.recon_lcs_words(x, y) == expect


def test_union_lcs_hand_derived():
    """The package docstring's example (Lin 2004): r = w1..w5, C = {w1 w2 w6 w7 w8, w1 w3 w8 w9 w5}:
    union LCS = {w1, w2, w3, w5} -> 4; m = 5 distinct reference words, n = 8 distinct candidate words."""
    hyp = [["w1", "w2", "w6", "w7", "w8"], ["w1", "w3", "w8", "w9", "w5"]]
    ref = [["w1", "w2", "w3", "w4", "w5"]]
    out = R.rouge_l_summary_level(hyp, ref)
    p, r = 4 / 8, 4 / 5
    assert out["p"] == p and out["r"] == r
    assert out["f"] == 2.0 * ((p * r) / (p + r + 1e-8))
    # same thing through text: sentences split on '.'
    assert R.cnnsum_from_tokens("w1 w2 w6 w7 w8 . w1 w3 w8 w9 w5".split(" "), "w1 w2 w3 w4 w5".split(" ")) \
        == out["f"]


def test_rouge_sentences_is_the_packages_split():
    text = " a b . . c  d .. e\n f . "
    ours = R.rouge_sentences(text)
    pkg = [" ".join(s.split()) for s in text.split(".") if len(s) > 0]
    assert ours == [s.split(" ") for s in pkg]
    assert [""] in ours  # a whitespace-only piece survives as the word ""


class JiebaTokenizer:
    """rouge-score tokenizer object: jieba precise-mode tokens without whitespace tokens."""

    def tokenize(self, text):
        return [t for t in jieba.cut(text, cut_all=False) if t.strip()]


def test_standard_matches_rouge_score(real_pairs):
    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=JiebaTokenizer())
    pairs = real_pairs[::4] + EDGE_CASES
    for pred, ref in pairs:
        expect = scorer.score(ref, pred)["rougeL"].fmeasure
        assert abs(R.standard_rouge_l(pred, ref) - expect) <= 1e-12, (pred[:30], ref[:30])


def test_rouge_score_default_tokenizer_drops_chinese():
    """Why 'standard' must not use rouge-score as is: its default tokenizer sees no Chinese at all."""
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    assert scorer.score("宝玉和黛玉在园中读书。", "宝玉和黛玉在园中读书。")["rougeL"].fmeasure == 0.0
    assert R.standard_rouge_l("宝玉和黛玉在园中读书。", "宝玉和黛玉在园中读书。") == 1.0


def test_metrics_differ_where_they_should():
    # cnnsum counts distinct words (sets); standard counts tokens: repetition is punished differently
    pred, ref = "宝玉 宝玉 宝玉 宝玉 读书", "宝玉 读书"
    assert R.rouge_l(pred, ref, "cnnsum") > 0.99  # sets: {宝玉, 读书} vs {宝玉, 读书}
    assert R.rouge_l(pred, ref, "standard") == pytest.approx(2 * (2 / 5) * 1 / (2 / 5 + 1))


def test_jieba_loaded_once(monkeypatch):
    jb = R.load_jieba()
    assert jb is R.load_jieba() is jieba
    assert jieba.dt.initialized
    calls = []
    monkeypatch.setattr(jieba, "initialize", lambda *a, **k: calls.append(1))
    R.load_jieba()
    R.tokenize("再来一次")
    assert calls == []


def test_unknown_metric_is_an_input_error():
    from ropescale.common.io import InputError

    with pytest.raises(InputError):
        R.rouge_l("a", "b", "rouge-2")
