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
    """Random concatenation into samples of length in [lo, hi] (Sec 5), each pair at most once (see module doc)."""
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    samples: list[list[int]] = []
    totals: list[int] = []
    too_long: list[int] = []
    pool: list[int] = []  # pairs that did not fit an open sample still below lo, in arrival order
    cur: list[int] = []
    total = 0
    goal = rng.randint(lo, hi)  # this sample's length goal, uniform in [lo, hi]

    def close():
        nonlocal cur, total, goal
        samples.append(cur)
        totals.append(total)
        cur, total, goal = [], 0, rng.randint(lo, hi)

    def add(i):
        nonlocal total
        cur.append(i)
        total += lengths[i]
        if total >= goal:
            close()
            refill()

    def refill():
        k = 0
        while k < len(pool):
            j = pool[k]
            if total + lengths[j] <= hi:
                pool.pop(k)
                add(j)  # may close the sample and refill the next one from the pool
                k = 0
            else:
                k += 1

    for i in order:
        n = lengths[i]
        if n > hi:
            too_long.append(i)
            continue
        # Close a sample that is long enough when the pair does not fit, or would land it farther past its
        # goal than it now is short of it (so lengths centre on the goals, not above them).
        if total >= lo and (total + n > hi or total + n - goal > goal - total):
            close()
            refill()
        if total + n <= hi:
            add(i)
        else:
            pool.append(i)
    if total >= lo:
        close()
    # Place what is still out into finished samples with room (best fit: the least room that suffices).
    rest = cur + pool
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
    rank = {i: k for k, i in enumerate(order)}
    return Plan(samples, sorted(leftover, key=rank.__getitem__), too_long)


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
