"""Running the official PyPI ``rouge`` 1.0.1 package as a reference (agreement tests, bench/bench_rouge.py).

Its ROUGE-L LCS is recursive and overflows Python's stack past ~1,000 tokens, so reference calls go through
:func:`run_big_stack`. Scoring itself never uses the package: see :mod:`ropescale.common.rouge`.
"""
from __future__ import annotations

import sys
import threading


def run_big_stack(fn, *args):
    """Run ``fn(*args)`` in a thread with a 512 MB stack and recursion limit 10^6; return its value or re-raise."""
    box = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # handed back to the caller
            box["error"] = e

    old_limit = sys.getrecursionlimit()
    old_size = threading.stack_size(512 * 1024 * 1024)
    sys.setrecursionlimit(1_000_000)
    try:
        t = threading.Thread(target=target)
        t.start()
        t.join()
    finally:
        threading.stack_size(old_size)
        sys.setrecursionlimit(old_limit)
    if "error" in box:
        raise box["error"]
    return box["value"]
