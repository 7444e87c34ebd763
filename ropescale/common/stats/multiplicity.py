"""Many tests read together: Benjamini-Hochberg q per declared family. A family is the set of tests one
reading draws from (a page's table of comparisons, the IE - IB cells of a study); a test is "resolved" only at
q < ``ALPHA`` in its family, and the family's size is stated beside it."""
from __future__ import annotations

from typing import Hashable, Mapping, Optional, Sequence, TypeVar

import numpy as np

from .tests import Significance

K = TypeVar("K", bound=Hashable)


def bh_q(p_values: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Benjamini-Hochberg adjusted p values (q) of one family, in the order given: q_(i) = min_{j >= i} m p_(j) / j
    over the p values sorted ascending, capped at 1 (Benjamini & Hochberg 1995, JRSS B 57:289, Sec. 3; as
    ``scipy.stats.false_discovery_control(ps, method='bh')``). None entries are not tests: they keep None and do
    not count in m."""
    idx = [k for k, p in enumerate(p_values) if p is not None]
    out: list[Optional[float]] = [None] * len(p_values)
    if not idx:
        return out
    p = np.array([float(p_values[k]) for k in idx])
    if np.any((p < 0) | (p > 1)) or np.any(np.isnan(p)):
        raise ValueError(f"p values must lie in [0, 1], got {p_values}")
    m = len(p)
    order = np.argsort(p, kind="stable")
    scaled = p[order] * m / np.arange(1, m + 1)
    q_sorted = np.minimum.accumulate(scaled[::-1])[::-1].clip(max=1.0)
    q = np.empty(m)
    q[order] = q_sorted
    for k, v in zip(idx, q):
        out[k] = float(v)
    return out


def family(tests: Mapping[K, Significance]) -> dict[K, Significance]:
    """The tests of one declared family, each with its BH q and the family's size (the tests with a p)."""
    keys = list(tests)
    qs = bh_q([tests[k].p for k in keys])
    m = sum(1 for q in qs if q is not None)
    return {k: tests[k].with_q(q, m) for k, q in zip(keys, qs)}
