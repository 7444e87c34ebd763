"""RULER's task configurations (NVIDIA/RULER scripts/synthetic.yaml), the ones this probe runs: data, not code.

niah_single_1 (noise haystack), niah_single_2 (novel haystack: RULER's essays are Paul Graham's, here Austen or the
Chinese novels), niah_multikey_1 (four keys, three of them distractors), niah_multivalue (four values of one key),
niah_multiquery (four keys asked together), vt, cwe, fwe; and ``niah_grid``: niah_single_1 with the needle at
given depths (the depth x length grid).
"""
from __future__ import annotations

from ropescale.common.io import InputError

from .base import Context, Sample
from .cwe import CweConfig, cwe_sample
from .fwe import FweConfig, fwe_sample
from .niah import NiahConfig, niah_sample
from .vt import VtConfig, vt_sample

TASKS = {
    "niah_single_1": NiahConfig("noise"),
    "niah_single_2": NiahConfig("novel"),
    "niah_multikey_1": NiahConfig("novel", num_k=4),
    "niah_multivalue": NiahConfig("novel", num_v=4),
    "niah_multiquery": NiahConfig("novel", num_q=4),
    "vt": VtConfig(),
    "cwe": CweConfig(),
    "fwe": FweConfig(),
}
GRID = "niah_grid"  # niah_single_1 at fixed depths
GRID_CONFIG = TASKS["niah_single_1"]


def check_tasks(names: list[str]) -> list[str]:
    bad = [t for t in names if t not in TASKS and t != GRID]
    if bad:
        raise InputError(f"--tasks: unknown task(s) {', '.join(bad)}; known: {', '.join(list(TASKS) + [GRID])}")
    return names


def make_sample(ctx: Context, task: str, length: int, index: int, seed: int, depth: float | None = None,
                budget: int = 0) -> Sample:
    """Sample ``index`` of ``task`` at ``length`` (deterministic given the seed); ``depth`` for the grid; ``budget``
    the generation budget (0: RULER's for the task)."""
    cfg = GRID_CONFIG if task == GRID else TASKS[task]
    if isinstance(cfg, NiahConfig):
        return niah_sample(ctx, cfg, task, length, index, seed, depth, budget)
    if isinstance(cfg, VtConfig):
        return vt_sample(ctx, cfg, task, length, index, seed, budget)
    if isinstance(cfg, CweConfig):
        return cwe_sample(ctx, cfg, task, length, index, seed, budget)
    return fwe_sample(ctx, cfg, task, length, index, seed, budget)
