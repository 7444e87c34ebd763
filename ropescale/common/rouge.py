"""ROUGE-L for Chinese summaries, and jieba loading: the one home of both.

Two metrics, both on jieba precise-mode tokens (``jieba.cut(text, cut_all=False)``):

``cnnsum`` (default) — the official CNNSum / CLongEval-LStSum score. CLongEval's ``metrics.rouge_zh_score``
  (zexuanqiu/CLongEval, which CNNSum's Sec 4.2 follows: "jieba for Chinese segmentation and then ROUGE-L") is::

      if prediction == "": return 0.
      prediction = " ".join(jieba.cut(prediction, cut_all=False)); same for the reference
      return Rouge().get_scores(prediction, reference)[0]["rouge-l"]["f"]      # PyPI rouge==1.0.1

  and a subset's score is the mean over samples x 100. ``rouge`` 1.0.1 is not textbook ROUGE-L; what it does
  (rouge/rouge.py ``Rouge._get_scores`` and rouge/rouge_score.py ``rouge_l_summary_level``), reproduced here:

  1. sentences: ``[" ".join(s.split()) for s in text.split(".") if len(s) > 0]`` — split on ASCII '.', drop
     empty pieces, squeeze whitespace (a whitespace-only piece survives as the sentence ``""``); the words of a
     sentence are ``sentence.split(" ")`` (so that sentence is the one word ``""``).
  2. ``m`` / ``n``: the number of *distinct* words of the reference / hypothesis (sets, ``exclusive=True``).
  3. for every (reference sentence, hypothesis sentence) pair, one LCS is reconstructed by the classic DP
     traceback from the end (equal words: take the match; else go up iff ``T[i-1][j] > T[i][j-1]``, else left);
     ``llcs`` = the number of distinct words in the union of all reconstructed LCSs.
  4. ``p = llcs / n``, ``r = llcs / m``, ``f = 2.0 * ((p * r) / (p + r + 1e-8))``.

  The package builds the full DP table in a dict and reconstructs recursively (``RecursionError`` past ~1000
  tokens, O(n*m) Python steps). Here the DP rows are bit vectors (Hyyro's bit-parallel LCS, Python ints) and the
  same traceback runs iteratively on them, so the reconstructed LCS — and the score — is the package's, to the
  last bit, at a fraction of the cost. Inputs the package rejects (``ValueError``: no sentence left after the
  split, e.g. a prediction of only '.'; an empty reference) score 0, as CNNSum/CLongEval report them (the issue
  fixes an all-'.' prediction at 0; CLongEval returns 0 for an empty prediction before calling the package).

``standard`` — textbook ROUGE-L F1 with rouge-score's semantics (``rouge_score.rouge_scorer._score_lcs``): tokens
  are the jieba tokens without whitespace tokens, ``P = LCS/len(pred)``, ``R = LCS/len(ref)``,
  ``F = 2PR/(P+R)`` (0 when either side is empty). rouge-score's default tokenizer drops every non [a-z0-9]
  character, i.e. all Chinese, so it must never be used as is.

jieba is loaded once per process (:func:`load_jieba`), its start-up chatter silenced.
"""
from __future__ import annotations

import functools
import logging
import threading
from typing import Iterable, Sequence

METRICS = ("cnnsum", "standard")
DEFAULT_METRIC = "cnnsum"

_jieba = None
_jieba_lock = threading.Lock()


def load_jieba():
    """The jieba module, initialized once per process (dictionary loaded, log messages below WARNING muted)."""
    global _jieba
    if _jieba is None:
        with _jieba_lock:
            if _jieba is None:
                import jieba

                jieba.setLogLevel(logging.WARNING)
                jieba.initialize()
                _jieba = jieba
    return _jieba


@functools.lru_cache(maxsize=8192)
def _tokenize_cached(text: str) -> tuple:
    return tuple(load_jieba().cut(text, cut_all=False))


def tokenize(text: str) -> list[str]:
    """jieba precise-mode tokens of ``text`` (whitespace tokens included, as ``jieba.cut`` yields them).

    Memoized per process (a reference is scored once per prompt and RoPE setting in a report)."""
    return list(_tokenize_cached(text))


def check_metric(metric: str) -> str:
    if metric not in METRICS:
        from ropescale.common.io import InputError

        raise InputError(f"unknown metric {metric!r} (choose from {', '.join(METRICS)})")
    return metric


# ---------------------------------------------------------------------------------------------- cnnsum metric
def rouge_sentences(text: str) -> list[list[str]]:
    """The sentences (each a list of words) that ``rouge`` 1.0.1 makes of a space-joined text (Rouge._get_scores)."""
    return [" ".join(s.split()).split(" ") for s in text.split(".") if len(s) > 0]


def recon_lcs_words(x: Sequence, y: Sequence) -> set:
    """Distinct words of the LCS that rouge 1.0.1's ``_recon_lcs(x, y)`` reconstructs (x = reference words).

    Row j of the DP table is kept as a bit vector ``V_j`` over positions of x (Hyyro 2004, bit-parallel LCS:
    ``V' = (V + (V & M)) | (V & ~M)``): bit i-1 of ``V_j`` is 0 iff ``T[i][j] = T[i-1][j] + 1``, hence
    ``T[i][j] = i - popcount(V_j & (2^i - 1))``. The traceback is the package's, step for step.
    """
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        return set()
    masks: dict = {}
    for i, w in enumerate(x):
        masks[w] = masks.get(w, 0) | (1 << i)
    full = (1 << n) - 1
    v = full
    rows = [v]
    for w in y:
        mk = masks.get(w)
        if mk:
            u = v & mk
            v = ((v + u) | (v - u)) & full
        rows.append(v)
    cur = n - v.bit_count()  # T[n][m], the LCS length
    out: set = set()
    i, j = n, m
    while cur and i and j:
        if x[i - 1] == y[j - 1]:
            out.add(x[i - 1])
            i -= 1
            j -= 1
            cur -= 1
        elif not (rows[j] >> (i - 1)) & 1:
            # T[i-1][j] = T[i][j] - 1, so T[i][j-1] = T[i][j]: the package goes left
            j -= 1
        elif i - (rows[j - 1] & ((1 << i) - 1)).bit_count() < cur:
            # T[i-1][j] = T[i][j] > T[i][j-1]: the package goes up
            i -= 1
        else:
            j -= 1
    return out


def rouge_l_summary_level(hyp: list[list[str]], ref: list[list[str]]) -> dict:
    """rouge 1.0.1 ``rouge_l_summary_level`` (exclusive=True) on pre-split sentences: {'f', 'p', 'r'}.

    Raises ValueError on an empty side, like the package.
    """
    if len(hyp) <= 0 or len(ref) <= 0:
        raise ValueError("Collections must contain at least 1 sentence.")
    m = len({w for s in ref for w in s})
    n = len({w for s in hyp for w in s})
    union: set = set()
    hyp_sets = [set(s) for s in hyp]
    for r in ref:
        rset = set(r)
        for h, hset in zip(hyp, hyp_sets):
            common = rset & hset
            if common <= union:  # this pair cannot add a word to the union
                continue
            union |= recon_lcs_words(r, h)
    llcs = len(union)
    r_lcs = llcs / m
    p_lcs = llcs / n
    f_lcs = 2.0 * ((p_lcs * r_lcs) / (p_lcs + r_lcs + 1e-8))
    return {"f": f_lcs, "p": p_lcs, "r": r_lcs}


def cnnsum_from_tokens(pred_tokens: Iterable[str], ref_tokens: Iterable[str]) -> float:
    """The cnnsum ROUGE-L F (0..1) from jieba tokens; 0 where the package would raise (nothing left)."""
    hyp = rouge_sentences(" ".join(pred_tokens))
    ref = rouge_sentences(" ".join(ref_tokens))
    if not hyp or not ref:
        return 0.0
    return rouge_l_summary_level(hyp, ref)["f"]


def cnnsum_rouge_l(prediction: str, reference: str) -> float:
    """Official CNNSum/CLongEval ROUGE-L F (0..1) of one pair (CLongEval metrics.rouge_zh_score + rouge 1.0.1)."""
    if prediction == "":
        return 0.0
    return cnnsum_from_tokens(tokenize(prediction), tokenize(reference))


# -------------------------------------------------------------------------------------------- standard metric
def standard_tokens(text: str) -> list[str]:
    """jieba tokens without the whitespace ones (the tokens of the ``standard`` metric)."""
    return [t for t in tokenize(text) if t.strip()]


def lcs_length(a: Sequence, b: Sequence) -> int:
    """Length of the longest common subsequence of two token sequences (rapidfuzz, bit-parallel)."""
    if not a or not b:
        return 0
    from rapidfuzz.distance import LCSseq

    return int(LCSseq.similarity(a, b))


def standard_from_tokens(pred_tokens: Sequence[str], ref_tokens: Sequence[str]) -> float:
    """Textbook ROUGE-L F1 (rouge-score ``_score_lcs`` + ``scoring.fmeasure``) on token lists."""
    if not ref_tokens or not pred_tokens:
        return 0.0
    lcs = lcs_length(ref_tokens, pred_tokens)
    precision = lcs / len(pred_tokens)
    recall = lcs / len(ref_tokens)
    if precision + recall > 0:
        return 2 * precision * recall / (precision + recall)
    return 0.0


def standard_rouge_l(prediction: str, reference: str) -> float:
    """Textbook ROUGE-L F1 (0..1) on jieba tokens (rouge-score semantics)."""
    return standard_from_tokens(standard_tokens(prediction), standard_tokens(reference))


# ------------------------------------------------------------------------------------------------- front door
def rouge_l(prediction: str, reference: str, metric: str = DEFAULT_METRIC) -> float:
    """ROUGE-L F of one pair in 0..1 by ``metric`` ('cnnsum' or 'standard')."""
    check_metric(metric)
    if metric == "cnnsum":
        return cnnsum_rouge_l(prediction, reference)
    return standard_rouge_l(prediction, reference)


def rouge_l_many(pairs: Iterable[tuple[str, str]], metric: str = DEFAULT_METRIC) -> list[float]:
    """ROUGE-L F (0..1) for each (prediction, reference) pair."""
    check_metric(metric)
    fn = cnnsum_rouge_l if metric == "cnnsum" else standard_rouge_l
    return [fn(p, r) for p, r in pairs]
