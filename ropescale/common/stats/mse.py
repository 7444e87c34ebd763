"""MSE(P-IE vs P-IB) of a row (CNNSum Table 2) and its noise floor: the MSE that noise alone gives, beside a percentile
bootstrap interval of the MSE. Its test (labels swapped at random) is :func:`.tests.mse_sign_flip`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping, Optional

import numpy as np

from .distributions import CONFIDENCE
from .resampling import RESAMPLES, SEED, Table, canonical, mapping_mean, percentile_interval, var_of_combination


def mse_ie_ib(ie: dict, ib: dict) -> Optional[float]:
    """CNNSum Table 2 'MSE (P-IE vs P-IB)' (Sec 4.3): the mean over the model's subsets of (IE - IB)^2; None when a
    subset has only one of the two prompts (a subset with neither, like GPT-4o's 3XL, is not one of its subsets)."""
    ie = {c: v for c, v in ie.items() if v is not None}
    ib = {c: v for c, v in ib.items() if v is not None}
    if not ie or set(ie) != set(ib):
        return None
    return sum((ie[c] - ib[c]) ** 2 for c in ie) / len(ie)

@dataclass(frozen=True)
class MSE:
    """MSE(P-IE vs P-IB) of a row (``mse_ie_ib``), its noise floor (the MSE expected with no prompt effect,
    :func:`mse_noise_floor`), the percentile bootstrap interval of the MSE (samples resampled within each cell) and
    the cells it is over."""

    mse: Optional[float]
    floor: Optional[float]
    lo: Optional[float] = None
    hi: Optional[float] = None
    cells: int = 0
    confidence: float = CONFIDENCE

    def to_dict(self) -> dict:
        return {"mse": self.mse, "floor": self.floor, "lo": self.lo, "hi": self.hi, "cells": self.cells}


def mse_noise_floor(cells: Mapping[str, tuple[Mapping[Hashable, float], Mapping[Hashable, float]]]) -> Optional[float]:
    """The MSE(P-IE vs P-IB) expected with no prompt effect: the mean over the cells of Var(IE - IB) (derived below).

    Derivation. A row's MSE is (1/C) sum_c D_c^2 over its C cells (CNNSum Table 2, ``mse_ie_ib``), with
    D_c = mean(IE_c) - mean(IB_c). For any random variable E[D^2] = (E D)^2 + Var(D); with no prompt effect the two
    prompts score a cell alike in expectation, E D_c = 0, so E[MSE] = (1/C) sum_c Var(D_c): the floor. Samples are
    independent across ids, so with n_IE and n_IB samples of which m ids pair,
        Var(D_c) = s_IE^2 / n_IE + s_IB^2 / n_IB - 2 m s_IE,IB / (n_IE n_IB)
    (:func:`.resampling.var_of_combination`). Where every id pairs (n_IE = n_IB = m = n) this is exactly s_d^2 / n,
    the squared paired standard error of the per-id differences d = IE - IB; where none pairs it is se_IE^2 + se_IB^2.
    Each term is an unbiased estimate, so the floor is too. An MSE near its floor is what noise alone gives; None where
    the MSE is None (a cell with one prompt only) or a cell has fewer than 2 samples under a prompt."""
    if not cells:
        return None
    terms = []
    for ie, ib in cells.values():
        if len(ie) < 2 or len(ib) < 2:
            return None
        terms.append(var_of_combination([canonical(ie), canonical(ib)], np.array([1.0, -1.0])))
    return float(np.mean(terms))


def mse_with_floor(cells: Mapping[str, tuple[Mapping[Hashable, float], Mapping[Hashable, float]]], *,
                   resamples: int = RESAMPLES, seed: int = SEED, confidence: float = CONFIDENCE) -> MSE:
    """A row's MSE(P-IE vs P-IB) exactly as the report computes it (``mse_ie_ib`` of the cells' IE and IB
    means), its noise floor (:func:`mse_noise_floor`) and a percentile bootstrap interval of the MSE (ids resampled
    within each cell, cells independently, one generator in the cells' order).

    ``cells``: {column: (IE samples {id: score}, IB samples)}; a column with only one prompt makes the MSE None, as
    in the report. The interval describes the MSE's sampling spread; a squared statistic is biased upward by its own
    noise (E[D^2] = (E D)^2 + Var D), so read the MSE against its floor, not the interval against 0."""
    cells = {c: (canonical(ie), canonical(ib)) for c, (ie, ib) in cells.items()}
    ie_means = {c: mapping_mean(ie) for c, (ie, _) in cells.items()}
    ib_means = {c: mapping_mean(ib) for c, (_, ib) in cells.items()}
    mse = mse_ie_ib(ie_means, ib_means)
    if mse is None:
        return MSE(None, None, cells=0, confidence=confidence)
    floor = mse_noise_floor(cells)
    lo = hi = None
    if floor is not None:
        rng = np.random.default_rng(seed)
        w = np.array([1.0, -1.0])
        sq = [(Table([ie, ib]).bootstrap(resamples, rng) @ w) ** 2 for ie, ib in cells.values()]
        lo, hi = percentile_interval(np.mean(sq, axis=0), confidence)
    return MSE(mse, floor, lo, hi, len(cells), confidence)
