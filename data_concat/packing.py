"""How pairs become samples (CNNSum Sec 5): the random concatenation of encoded pairs into samples whose length lies
in [min, max], and the flat columns of the result. Pure: no files, no tokenizer (see data_concat.pack for the
algorithm's description)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .packed import IGNORE_INDEX


@dataclass
class Plan:
    """Which pairs (indices into the encoded list) make each sample, and what was left out."""

    samples: list[list[int]]
    leftover: list[int]
    too_long: list[int]


def plan_packing(lengths: Sequence[int], lo: int, hi: int, seed: int) -> Plan:
    """Random concatenation into samples of length in [lo, hi] (Sec 5), each pair at most once (see module doc):
    the pairs in a seeded random order go into samples of a random goal length (:class:`_Concatenation`), then
    what is still out is placed by best fit (:func:`_best_fit`)."""
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    cat = _Concatenation(lengths, lo, hi, rng)
    for i in order:
        cat.take(i)
    cat.finish()
    leftover = _best_fit(cat.cur + cat.pool, cat.samples, cat.totals, lengths, hi)
    rank = {i: k for k, i in enumerate(order)}
    return Plan(cat.samples, sorted(leftover, key=rank.__getitem__), cat.too_long)


class _Concatenation:
    """The open sample and the finished ones: each sample has a length goal drawn uniformly in [lo, hi] (the same
    seeded RNG as the order); a pair that does not fit the open sample waits in a pool, which refills each new
    sample first."""

    def __init__(self, lengths: Sequence[int], lo: int, hi: int, rng: random.Random):
        self.lengths, self.lo, self.hi, self.rng = lengths, lo, hi, rng
        self.samples: list[list[int]] = []
        self.totals: list[int] = []
        self.too_long: list[int] = []
        self.pool: list[int] = []  # pairs that did not fit an open sample still below lo, in arrival order
        self.cur: list[int] = []
        self.total = 0
        self.goal = rng.randint(lo, hi)  # this sample's length goal, uniform in [lo, hi]

    def take(self, i: int) -> None:
        n = self.lengths[i]
        if n > self.hi:
            self.too_long.append(i)
            return
        # Close a sample that is long enough when the pair does not fit, or would land it farther past its
        # goal than it now is short of it (so lengths centre on the goals, not above them).
        if self.total >= self.lo and (self.total + n > self.hi or self.total + n - self.goal > self.goal - self.total):
            self.close()
            self.refill()
        if self.total + n <= self.hi:
            self.add(i)
        else:
            self.pool.append(i)

    def finish(self) -> None:
        if self.total >= self.lo:
            self.close()

    def close(self) -> None:
        self.samples.append(self.cur)
        self.totals.append(self.total)
        self.cur, self.total, self.goal = [], 0, self.rng.randint(self.lo, self.hi)

    def add(self, i: int) -> None:
        self.cur.append(i)
        self.total += self.lengths[i]
        if self.total >= self.goal:
            self.close()
            self.refill()

    def refill(self) -> None:
        k = 0
        while k < len(self.pool):
            j = self.pool[k]
            if self.total + self.lengths[j] <= self.hi:
                self.pool.pop(k)
                self.add(j)  # may close the sample and refill the next one from the pool
                k = 0
            else:
                k += 1


def _best_fit(rest: list[int], samples: list[list[int]], totals: list[int], lengths: Sequence[int],
              hi: int) -> list[int]:
    """Place the pairs still out into finished samples with room (longest first; best fit: the least room that
    suffices); returns those that fit nowhere."""
    leftover: list[int] = []
    for i in sorted(rest, key=lambda j: -lengths[j]):
        n = lengths[i]
        best, best_room = -1, None
        for s, t in enumerate(totals):
            room = hi - t
            if room >= n and (best_room is None or room < best_room):
                best, best_room = s, room
        if best < 0:
            leftover.append(i)
        else:
            samples[best].append(i)
            totals[best] += n
    return leftover


def build_columns(encoded: Sequence, plan: Plan) -> dict:
    """Flat numpy columns (values + offsets) for the samples of ``plan``."""
    ids_parts, lab_parts, lengths, starts, pids = [], [], [], [], []
    for members in plan.samples:
        pos = 0
        st = []
        for i in members:
            e = encoded[i]
            st.append(pos)
            ids_parts += [e.prompt_ids, e.target_ids]
            lab_parts += [np.full(len(e.prompt_ids), IGNORE_INDEX, dtype=np.int32), e.target_ids]
            pos += len(e)
        lengths.append(pos)
        starts.append(st)
        pids.append([encoded[i].id for i in members])
    values = np.concatenate(ids_parts).astype(np.int32) if ids_parts else np.zeros(0, np.int32)
    labels = np.concatenate(lab_parts).astype(np.int32) if lab_parts else np.zeros(0, np.int32)
    return {"input_ids": values, "labels": labels, "length": np.asarray(lengths, dtype=np.int32),
            "pair_starts": starts, "pair_ids": pids}
