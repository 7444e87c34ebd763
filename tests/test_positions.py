"""ropescale.training.positions: the packing policy (continuous / reset x causal / document), PoSE position ids
(Zhu et al., arXiv 2309.10400, Sec 3.2) and the coverage histogram, checked against hand-worked values and the
distributions the paper's sampling implies; what training asks the policy, against its two flags."""
from __future__ import annotations

import collections
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from ropescale.common.io import InputError
from ropescale.training.positions import (
    COVERAGE_BINS,
    PAD_SEGMENT,
    Coverage,
    Policy,
    check_samples,
    draw_pose,
    longest_distance,
    pose_ids,
    pose_rng,
    sample_positions,
    segment_ids,
    spans,
)

RESET = Policy("reset", "document")
CONT_DOC = Policy("continuous", "document")


# ---------------------------------------------------------------- the policy
@pytest.mark.parametrize("kw, words", [
    (dict(positions="reset", attention="causal"), "--positions reset needs --attention document"),
    (dict(positions="restart"), "--positions must be one of continuous, reset"),
    (dict(attention="full"), "--attention must be one of causal, document"),
    (dict(pose_target=0), "--pose-target must be a positive"),
    (dict(pose_target=512, pose_chunks=0), "--pose-chunks must be >= 1"),
])
def test_bad_policies_are_one_line(kw, words):
    with pytest.raises(InputError) as e:
        Policy(**kw).check()
    assert words in str(e.value) and "\n" not in str(e.value)


def test_good_policies_and_labels():
    assert Policy().check().is_default and Policy().label() == "continuous+causal"
    assert not Policy().needs_boundaries
    assert RESET.check().needs_boundaries and CONT_DOC.needs_boundaries
    p = Policy(pose_target=4096)
    assert not p.is_default and p.label() == "continuous+causal, PoSE 4096 (2 chunks)"
    assert json.loads(json.dumps(p.to_dict())) == {"positions": "continuous", "attention": "causal",
                                                   "pose_target": 4096, "pose_chunks": 2}


# ---------------------------------------------------------------- boundaries
@pytest.mark.parametrize("positions,attention,pose,boundaries,carries,varlen", [
    ("continuous", "causal", None, False, (), False),  # the paper's: 0 .. n-1, one mask, nothing carried
    ("continuous", "causal", 4096, False, ("position_ids",), False),
    ("continuous", "document", None, True, ("position_ids", "segment_ids"), True),
    ("reset", "document", None, True, ("position_ids", "segment_ids"), True),
    ("reset", "document", 4096, True, ("position_ids", "segment_ids"), True),
])
def test_what_training_asks_the_policy(positions, attention, pose, boundaries, carries, varlen):
    """The answers the dataset, the collator, the model set-up and sequence parallelism read (never the strings):
    the pair boundaries (reset or document), the keys a sample and a shard carry, the varlen SDPA core under
    sequence parallelism with document attention (one process: none)."""
    pol = Policy(positions, attention, pose).check()
    assert pol.needs_boundaries is boundaries and pol.carries() == carries
    assert pol.segments is ("segment_ids" in carries)
    assert pol.varlen_kernel(2) is varlen and pol.varlen_kernel(1) is False
    pos, seg = sample_positions(pol, 6, [0, 3], seed=1, index=0)
    assert (seg.tolist() == [0, 0, 0, 1, 1, 1]) is pol.segments


def test_segments_and_spans_from_pair_boundaries():
    assert segment_ids([0, 4, 7], 10).tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert segment_ids([0], 3).tolist() == [0, 0, 0]
    assert spans(RESET, 10, [0, 4, 7]) == [(0, 4), (4, 7), (7, 10)]
    assert spans(CONT_DOC, 10, [0, 4, 7]) == [(0, 10)]
    for bad in ([1, 4], [0, 4, 4], [0, 10], [0, 7, 4], []):
        with pytest.raises(InputError):
            segment_ids(bad, 10)


def test_reset_restarts_at_zero_per_pair():
    pos, seg = sample_positions(RESET, 10, [0, 4, 7])
    assert pos.tolist() == [0, 1, 2, 3, 0, 1, 2, 0, 1, 2]
    assert seg.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    pos, seg = sample_positions(CONT_DOC, 10, [0, 4, 7])
    assert pos.tolist() == list(range(10)) and seg.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    pos, seg = sample_positions(Policy(), 10, [0, 4, 7])  # the paper's: one causal segment, 0 .. n-1
    assert pos.tolist() == list(range(10)) and seg.tolist() == [0] * 10
    with pytest.raises(InputError, match="needs the pair boundaries"):
        sample_positions(RESET, 10, None)


def test_check_samples_refuses_before_training(tmp_path):
    where = tmp_path / "train.parquet"
    with pytest.raises(InputError, match="has none") as e:
        check_samples(CONT_DOC, [10, 12], None, where)
    assert str(e.value).startswith(f"{where}: ")
    with pytest.raises(InputError, match="sample 1: pair boundaries"):
        check_samples(RESET, [10, 12], [[0, 4], [0, 12]], where)
    with pytest.raises(InputError, match="12-token sample is longer than --pose-target 11"):
        check_samples(Policy(pose_target=11), [10, 12], None, where)
    # under reset, PoSE spans are the pairs: the longest pair (8) must fit, not the sample
    assert check_samples(Policy("reset", "document", pose_target=8), [10, 12], [[0, 4], [0, 4]], where) == 8
    assert check_samples(Policy(), [10, 12], None, where) == 12


# ---------------------------------------------------------------- PoSE: hand-worked
def test_pose_ids_follow_eq_3_and_4():
    # chunks of 3 and 5 tokens (st = 0, 3), skips u0 = 0, u1 = 10: {0,1,2} and {10+3 .. 10+3+4}
    assert pose_ids([3, 5], [0, 10]).tolist() == [0, 1, 2, 13, 14, 15, 16, 17]
    # three chunks 2, 1, 3 (st = 0, 2, 3), skips 0, 4, 9
    assert pose_ids([2, 1, 3], [0, 4, 9]).tolist() == [0, 1, 6, 12, 13, 14]
    assert pose_ids([], []).tolist() == []


class Scripted:
    """A stand-in generator whose randint answers are given, checking each asked range."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.asked = []

    def randint(self, a, b):
        want, value = self.answers.pop(0)
        assert (a, b) == want, f"asked randint{(a, b)}, the paper's procedure asks randint{want}"
        self.asked.append((a, b))
        return value


def test_pose_draw_asks_the_papers_ranges():
    # n = 8 tokens, target L = 32, N = 2: l0 ~ U{1..7}; u1 ~ U{u0 = 0 .. L - n = 24}
    rng = Scripted([((1, 7), 3), ((0, 24), 10)])
    assert draw_pose(8, 32, 2, rng) == ([3, 5], [0, 10])
    # N = 3 (Appendix B's code): l0 ~ U{1..n-2}, l1 ~ U{1..n-l0-1}, l2 = rest; u1 ~ U{0..24}, u2 ~ U{u1..24}
    rng = Scripted([((1, 6), 2), ((1, 5), 1), ((0, 24), 4), ((4, 24), 9)])
    lengths, skips = draw_pose(8, 32, 3, rng)
    assert (lengths, skips) == ([2, 1, 5], [0, 4, 9])
    assert pose_ids(lengths, skips).tolist() == [0, 1, 6, 12, 13, 14, 15, 16]
    # the bound: the largest skip puts the last id at L - 1 < L
    assert pose_ids(*draw_pose(8, 32, 2, Scripted([((1, 7), 7), ((0, 24), 24)]))).tolist()[-1] == 31


def test_pose_bound_and_small_spans():
    assert draw_pose(8, 8, 2, pose_rng(0, 0))[1] == [0, 0]  # L = n: u1 ~ U{0..0}
    assert pose_ids(*draw_pose(8, 8, 2, pose_rng(0, 1))).tolist() == list(range(8))  # L = n: no room to skip
    assert draw_pose(1, 100, 2, pose_rng(0, 0)) == ([1], [0])  # one token: one chunk
    assert draw_pose(2, 100, 5, pose_rng(0, 0))[0] == [1, 1]  # fewer tokens than chunks: a chunk per token
    with pytest.raises(InputError, match="9-token span is longer than --pose-target 8"):
        draw_pose(9, 8, 2, pose_rng(0, 0))


@pytest.mark.parametrize("n, target, chunks", [(8, 32, 2), (50, 64, 2), (30, 400, 3), (7, 7, 2), (20, 1000, 4)])
def test_pose_ids_are_chunks_of_consecutive_ids_below_the_target(n, target, chunks):
    for index in range(300):
        pos, seg = sample_positions(Policy(pose_target=target, pose_chunks=chunks), n, seed=1, index=index)
        d = np.diff(pos)
        assert len(pos) == n and pos[0] == 0 and pos[-1] < target and (seg == 0).all()
        assert (d >= 1).all() and int((d > 1).sum()) <= chunks - 1  # strictly increasing; at most N-1 skips


# ---------------------------------------------------------------- PoSE: distributions over many draws
def _close(freq: dict, pmf: dict, draws: int, sigmas: float = 5.0) -> None:
    assert set(freq) <= set(pmf), f"values outside the support: {sorted(set(freq) - set(pmf))}"
    for k, p in pmf.items():
        sd = math.sqrt(draws * p * (1 - p))
        assert abs(freq.get(k, 0) - draws * p) <= sigmas * sd + 1, (k, freq.get(k, 0), draws * p)


def test_pose_two_chunk_distribution():
    """N = 2, n = 8, L = 32: the cut l0 is uniform on 1..7 and u1 on 0..24, so the last id u1 + 7 is uniform on
    7..31, and over many draws every id in [0, 32) is covered."""
    n, big_l, draws = 8, 32, 20000
    cuts, lasts, seen = collections.Counter(), collections.Counter(), set()
    for i in range(draws):
        pos, _ = sample_positions(Policy(pose_target=big_l), n, seed=7, index=i)
        jump = np.flatnonzero(np.diff(pos) != 1)
        cuts[int(jump[0]) + 1 if jump.size else None] += 1
        lasts[int(pos[-1])] += 1
        seen.update(pos.tolist())
    # a cut without a skip (u1 = 0, probability 1/25) shows no jump
    p0 = 1 / (big_l - n + 1)
    _close(cuts, {**{c: (1 - p0) / (n - 1) for c in range(1, n)}, None: p0}, draws)
    _close(lasts, {k: 1 / (big_l - n + 1) for k in range(n - 1, big_l)}, draws)
    assert seen == set(range(big_l))


def test_pose_three_chunk_last_position_distribution():
    """N = 3: u1 ~ U{0..M}, u2 ~ U{u1..M} (M = L - n), so P(u2 = k) = sum_{j<=k} 1/(M+1) x 1/(M-j+1), and the last id
    is u2 + n - 1; l0 is uniform on 1..n-2."""
    n, big_l, draws = 6, 20, 20000
    m = big_l - n
    pmf_u2 = {k: sum(1 / (m + 1) / (m - j + 1) for j in range(k + 1)) for k in range(m + 1)}
    assert abs(sum(pmf_u2.values()) - 1) < 1e-12
    lasts, firsts = collections.Counter(), collections.Counter()
    for i in range(draws):
        lengths, skips = draw_pose(n, big_l, 3, pose_rng(11, i))
        lasts[pose_ids(lengths, skips)[-1].item()] += 1
        firsts[lengths[0]] += 1
    _close(lasts, {k + n - 1: p for k, p in pmf_u2.items()}, draws)
    _close(firsts, {c: 1 / (n - 2) for c in range(1, n - 1)}, draws)


# ---------------------------------------------------------------- PoSE: the same draws from the same (seed, index)
def test_pose_draws_depend_only_on_seed_and_index():
    pol = Policy(pose_target=4096)
    first = {i: sample_positions(pol, 512, seed=3, index=i)[0] for i in (5, 0, 9)}
    for i in (9, 2, 5, 0, 1):  # another order, other samples in between: the same ids
        pos, _ = sample_positions(pol, 512, seed=3, index=i)
        if i in first:
            assert np.array_equal(pos, first[i])
    others = [sample_positions(pol, 512, seed=s, index=i)[0] for s, i in ((4, 5), (3, 6))]
    assert not any(np.array_equal(o, first[5]) for o in others)
    assert not np.array_equal(sample_positions(pol, 512, seed=3, index=5, epoch=1)[0], first[5])
    # under reset each pair draws its own span, all from 0
    pos, _ = sample_positions(Policy("reset", "document", pose_target=300), 600, [0, 200, 450], seed=3, index=5)
    assert pos[0] == pos[200] == pos[450] == 0 and pos[:200].max() < 300 and pos[450:].max() < 300
    assert not np.array_equal(pos[:150], pos[200:350])


def test_pose_draws_are_the_same_in_a_fresh_process():
    """A resumed run is a new process (another hash seed): it must redraw the same ids."""
    code = ("from ropescale.training.positions import Policy, sample_positions;"
            "print(sample_positions(Policy(pose_target=4096), 512, seed=3, index=5)[0].tolist())")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PYTHONPATH": str(__import__("pathlib").Path(__file__)
                                                                           .resolve().parent.parent)})
    here = sample_positions(Policy(pose_target=4096), 512, seed=3, index=5)[0].tolist()
    assert json.loads(res.stdout) == here


# ---------------------------------------------------------------- coverage
def _hand_batch():
    """Two rows of 8 tokens, context 64 in 4 bins of 16 (0-15, 16-31, 32-47, 48-63) and beyond.
    row 0 (one causal segment, PoSE-like ids): 0 1 2 3 20 21 40 70; labels on the tokens at 4, 5 and 7
    row 1 (two pairs, reset, then 2 pads):    0 1 2 0 1 2 P P;      labels on the tokens at 2 and 5"""
    pos = np.array([[0, 1, 2, 3, 20, 21, 40, 70], [0, 1, 2, 0, 1, 2, 0, 0]])
    seg = np.array([[0] * 8, [0, 0, 0, 1, 1, 1, PAD_SEGMENT, PAD_SEGMENT]])
    lab = np.full((2, 8), -100)
    lab[0, [4, 5, 7]] = 7
    lab[1, [2, 5]] = 7
    return pos, seg, lab


def test_coverage_counts_a_hand_made_batch():
    pos, seg, lab = _hand_batch()
    cov = Coverage(64, 4).add(pos, seg, lab)
    assert cov.edges == [0, 16, 32, 48, 64]
    # tokens: row 0 -> bin0: 0,1,2,3 (4); bin1: 20,21 (2); bin2: 40 (1); beyond: 70 (1); row 1 -> bin0: 6 real
    assert cov.tokens == [10, 2, 1, 0] and cov.tokens_beyond == 1
    # labelled = the predicting positions (token t-1 for a label on t): row 0 -> 3, 20, 40; row 1 -> 1, 1
    assert cov.labelled == [3, 1, 1, 0] and cov.labelled_beyond == 0
    assert cov.samples == 2 and cov.longest == 70
    # row 0: 70 - 0; row 1: each pair 2 - 0 (pads left out)
    assert cov.longest_distance == 70
    assert cov.total_tokens == 14


def test_coverage_attention_mask_and_distances():
    pos, seg, lab = _hand_batch()
    mask = (seg != PAD_SEGMENT).astype(int)
    a = Coverage(64, 4).add(pos[1], None, lab[1], attention_mask=mask[1])  # row 1 read as one causal segment
    assert a.tokens == [6, 0, 0, 0] and a.longest == 2
    assert a.longest_distance == 2  # 2 - min(0, 1, 2, 0, 1, 2)
    assert longest_distance([[0, 1, 2, 0, 1, 2]], [[0, 0, 0, 1, 1, 1]]) == 2
    assert longest_distance([[5, 6, 100]], [[0, 0, 0]]) == 95
    assert longest_distance([[0, 1]], [[PAD_SEGMENT, PAD_SEGMENT]]) == -1


def test_coverage_is_additive_and_json():
    pos, seg, lab = _hand_batch()
    whole = Coverage(64, 4).add(pos, seg, lab)
    parts = [Coverage(64, 4).add(pos[i], seg[i], lab[i]) for i in range(2)]
    assert Coverage.total(parts, 64, 4) == whole
    resumed = Coverage.from_json(json.loads(json.dumps(parts[0].to_json())))  # a checkpoint's record, continued
    assert resumed.add(pos[1], seg[1], lab[1]) == whole
    with pytest.raises(ValueError, match="cannot add"):
        whole.merge(Coverage(128, 4))
    bad = dict(whole.to_json(), tokens=[1, 2])
    with pytest.raises(InputError, match="run.json: not a position coverage record"):
        Coverage.from_json(bad, where="run.json")


def test_coverage_default_bins_are_sixteenths():
    cov = Coverage(4096)
    assert cov.bins == COVERAGE_BINS == 16 and cov.edges[1] == 256 and cov.edges[-1] == 4096
    cov.add(np.arange(4096 + 10))
    assert cov.tokens == [256] * 16 and cov.tokens_beyond == 10 and cov.longest == 4105
    e = Coverage(100, 16).edges  # uneven context: floors, every position in exactly one bin
    assert e[0] == 0 and e[-1] == 100 and sum(b - a for a, b in zip(e, e[1:])) == 100
