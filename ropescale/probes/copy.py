"""copy: sequence-level copying from the distant context (Sun et al. 2021, Sec 5, "Sequence-level copying").

"We copy the target sequence and paste it into different positions of the prefix": for an N-token input (prefix of
n = N - k tokens, then the k-token target) the target is pasted over the prefix so that the copy ends d tokens
before the target starts (prefix tokens n-d-k .. n-d-1 are overwritten, so the input length and the target's
positions stay the same at every distance). Cells: the target loss (nats/token) vs d, group ``copy``; group
``no-copy`` is the same target with the intact prefix (the baseline, repeated in every column). A model that uses
its context gives the pasted target a very low loss when the copy is near; Sun et al. find the benefit gone beyond
about 2K tokens.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ropescale.common.io import InputError
from ropescale.common.runs.record import RunMeta
from ropescale.common.settings import setting
from ropescale.evaluation.report.intake import declare_variant

from .command import register_probe
from .common import NOT_NEGATIVE, POSITIVE, ProbeRun, ProbeSettings, probe_settings
from .data import data_name
from .perturb import default_distances
from .scorer import check_batch, score_continuations
from .targets import target_spans


@dataclass(frozen=True)
class CopySettings(ProbeSettings):
    length: int = setting(0, "total input tokens N = n + k (0: the model's (scaled) context)", check=NOT_NEGATIVE)
    distances: list[int] | None = setting(None, "distances d between the copy's end and the target, comma-separated; "
                                                "default: 0 and powers of two from 64", check=NOT_NEGATIVE,
                                          metavar="D,D,...")
    target_len: int = setting(128, "target span tokens k", check=POSITIVE)
    tail_chapters: int = setting(0, "chapters data: keep each book's last N chapters", check=NOT_NEGATIVE)


@declare_variant("copy")
def variant_label(meta: RunMeta) -> str:
    """What tells apart copy runs beyond the model, its RoPE spec and training: the input length N."""
    lengths = meta.get("lengths")
    return f"N={lengths[0]}" if lengths else ""


def paste(prefix: list[int], target: list[int], d: int) -> list[int]:
    """The prefix with ``target`` pasted over it so that the copy ends ``d`` tokens before the prefix's end."""
    n, k = len(prefix), len(target)
    if not 0 <= d <= n - k:
        raise ValueError(f"distance {d} outside [0, {n - k}] for a {n}-token prefix and {k}-token target")
    return list(prefix[:n - d - k]) + list(target) + list(prefix[n - d:])


def copy_probe(loaded, docs, settings: CopySettings | None = None, **fields) -> dict:
    """Run the copy probe into run dir ``settings.out`` (or give the settings as keywords); cells: mean target loss
    per distance (copy / no-copy)."""
    s = probe_settings(CopySettings, settings, fields)
    length, n, target_len, seed, batch_size = s.length or loaded.default_length, s.n, s.target_len, s.seed, s.batch_size
    n_prefix = length - target_len
    distances = s.distances if s.distances is not None else \
        [d for d in default_distances(n_prefix) if d <= n_prefix - target_len]
    bad = [d for d in distances if not 0 <= d <= n_prefix - target_len]
    if n_prefix < target_len or bad:
        raise InputError(f"distances must lie in [0, {n_prefix - target_len}] for --length {length} and "
                         f"--target-len {target_len}: {bad or distances}")
    check_batch(loaded.model, [length] * min(batch_size, len(distances) + 1), target_len, what=f"--length {length}")
    s = dataclasses.replace(s, length=length, distances=distances, data=data_name(docs) or s.data)
    run = ProbeRun("copy", loaded, s, [length], metric="loss (nats/token) on the target span",
                   column="distance d of the pasted copy (tokens)", cell_kind="mean", variant=variant_label)
    _, spans = target_spans(loaded, docs, n=n, n_prefix=n_prefix, target_len=target_len, seed=seed, desc="copy")
    for t, prefix, target in spans:
        todo = [d for d in distances if not run.done(f"{t.key}:copy:d{d}")]
        if not todo:
            continue
        variants = [prefix] + [paste(prefix, target, d) for d in todo]
        scores = score_continuations(loaded.model, variants, [target] * len(variants), batch_size=batch_size,
                                     pad_id=loaded.pad_id)
        base = scores[0].loss
        for d, sc in zip(todo, scores[1:]):
            common = {"doc": docs[t.doc].id, "target_start": t.start, "prefix_len": n_prefix}
            run.add({"id": f"{t.key}:copy:d{d}", "group": "copy", "col": d, "value": sc.loss, **common})
            if not run.done(f"{t.key}:no-copy:d{d}"):
                run.add({"id": f"{t.key}:no-copy:d{d}", "group": "no-copy", "col": d, "value": base, **common})
    return run.finish()


def register(sub) -> None:
    register_probe(sub, "copy", CopySettings, description=__doc__,
                   help="target span pasted into the prefix at a distance (Sun et al. Sec 5)", run=copy_probe)
