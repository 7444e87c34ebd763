"""perturb: how much the loss on a target span changes when only the distant part of the prefix is perturbed
(Sun et al. 2021, Sec 4).

Given a prefix P = (w_0, ..., w_{n-1}) before a target span (w_n, ..., w_{n+k-1}), a perturbation rho is applied to
the first m prefix tokens only, keeping w_m .. w_{n-1} intact: P~ = (rho(w_0..w_{m-1}), w_m, ..., w_{n-1}). The
distance of the perturbed part from the target is d = n - m. Perturbations (Sun et al. Sec 4):

- ``shuffle``: the tokens of w_0..w_{m-1} are shuffled across the whole window (sentence boundaries ignored);
- ``replace``: w_0..w_{m-1} is replaced by a random m-token span of another book (document with another ``book``);
- ``drop``: the tokens of w_0..w_{m-1} whose next appearance is in the target (Sun et al. Sec 4: "we drop tokens in
  the distant context whose next appearance is in the target sequence") are replaced by the padding token (so
  positions do not move): for each target token type, its last occurrence in the prefix, when that lies in
  w_0..w_{m-1}; an earlier occurrence whose next appearance is still in the prefix is kept;
- ``drop-random``: the control: the same number of random tokens of w_0..w_{m-1} replaced by the padding token.

Each perturbation is averaged over ``--seeds`` runs (5, as in the paper; ``drop`` is deterministic and run once).
The cell is the loss change (perturbed minus intact target loss, nats/token) for one kind vs the distance d.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ropescale.common.io import InputError
from ropescale.common.runs.record import RunMeta
from ropescale.common.settings import setting
from ropescale.evaluation.report.intake import declare_variant

from .command import register_probe
from .common import NOT_NEGATIVE, POSITIVE, ProbeRun, ProbeSettings, data_setting, probe_settings, rng_for
from .data import data_name
from .scorer import check_batch, score_continuations
from .targets import DEFAULT_TARGET_LEN, target_spans

KINDS = ("shuffle", "replace", "drop", "drop-random")


@dataclass(frozen=True)
class PerturbSettings(ProbeSettings):
    data: str = data_setting("documents JSONL or chapters JSONL (one document per book; 'replace' needs >= 2 books)")
    length: int = setting(0, "total input tokens N = n + k (0: the model's (scaled) context)", check=NOT_NEGATIVE)
    distances: list[int] | None = setting(None, "distances d = n - m, comma-separated; default: 0 and powers of two "
                                                "from 64 below n", check=NOT_NEGATIVE, metavar="D,D,...")
    kinds: list[str] = setting(list(KINDS), "perturbations, comma-separated", check=(lambda k: k in KINDS,
                                                                                    f"among {', '.join(KINDS)}"))
    seeds: int = setting(5, "runs averaged per perturbation (as the paper)", check=POSITIVE)
    target_len: int = setting(DEFAULT_TARGET_LEN, "target span tokens k (Sun et al. 2021 Sec 2.2's k = 10 for the "
                                                  "token-level experiments of Sec 3 and 4)", check=POSITIVE)
    tail_chapters: int = setting(0, "chapters data: keep each book's last N chapters", check=NOT_NEGATIVE)


@declare_variant("perturb")
def variant_label(meta: RunMeta) -> str:
    """What tells apart perturb runs beyond the model, its RoPE spec and training: the input length N."""
    lengths = meta.get("lengths")
    return f"N={lengths[0]}" if lengths else ""


def perturb_prefix(prefix: list[int], m: int, kind: str, rng, *, target: list[int] | None = None,
                   other: list[int] | None = None, pad_id: int = 0) -> list[int]:
    """Apply perturbation ``kind`` to ``prefix[:m]`` and keep ``prefix[m:]`` unchanged (Sun et al. 2021 Sec 4).
    ``other``: a different book's tokens (for ``replace``, a random m-token span is taken from it); ``target``:
    the target span (for ``drop``: the tokens of ``prefix[:m]`` whose next appearance is in the target;
    ``drop-random``: as many random tokens of ``prefix[:m]``)."""
    if not 0 <= m <= len(prefix):
        raise ValueError(f"m={m} outside the prefix (0..{len(prefix)})")
    head, tail = list(prefix[:m]), list(prefix[m:])
    if kind == "shuffle":
        rng.shuffle(head)
    elif kind == "replace":
        if other is None or len(other) < m:
            raise ValueError("replace needs another book with at least m tokens")
        s = rng.randint(0, len(other) - m)
        head = list(other[s:s + m])
    elif kind in ("drop", "drop-random"):
        if target is None:
            raise ValueError(f"{kind} needs the target span")
        tset = set(target)
        last = {t: i for i, t in enumerate(prefix)}  # each token's last occurrence in the whole prefix
        hits = [i for i, t in enumerate(head) if t in tset and last[t] == i]  # next appearance: in the target
        if kind == "drop-random":
            hits = rng.sample(range(m), len(hits))
        for i in hits:
            head[i] = pad_id
    else:
        raise ValueError(f"unknown perturbation {kind!r} ({', '.join(KINDS)})")
    return head + tail


def default_distances(prefix_len: int, smallest: int = 64) -> list[int]:
    """Powers of two from ``smallest`` below the prefix length (d = n - m), plus 0 (the whole prefix perturbed)."""
    out, d = [0], smallest
    while d < prefix_len:
        out.append(d)
        d *= 2
    return out


def perturb_probe(loaded, docs, settings: PerturbSettings | None = None, **fields) -> dict:
    """Run the perturbation probe into run dir ``settings.out`` (or give the settings as keywords); cells: mean
    loss change per kind x distance."""
    s = probe_settings(PerturbSettings, settings, fields)
    length = s.length or loaded.default_length
    kinds, n, target_len, seeds, seed = s.kinds, s.n, s.target_len, s.seeds, s.seed
    batch_size = s.batch_size
    if not kinds:
        raise InputError(f"--kinds: give at least one of {', '.join(KINDS)}")
    n_prefix = length - target_len
    distances = s.distances if s.distances is not None else default_distances(n_prefix)
    if n_prefix <= 0:
        raise InputError(f"--length {length} must exceed --target-len {target_len}")
    bad = [d for d in distances if not 0 <= d < n_prefix]
    if bad:
        raise InputError(f"distances must lie in [0, {n_prefix}) for a {n_prefix}-token prefix: {bad}")
    if "replace" in kinds and len({d.book for d in docs}) < 2:
        raise InputError("'replace' needs at least two books (documents with different 'book')",
                         data_name(docs))
    rows = min(batch_size, 1 + len(kinds) * len(distances) * seeds)  # drop's variants are shorter: padded
    check_batch(loaded.model, [length] * rows, target_len, what=f"--length {length}", padded="drop" in kinds)
    s = dataclasses.replace(s, length=length, distances=distances, data=data_name(docs) or s.data)
    run = ProbeRun("perturb", loaded, s, [length],
                   metric="loss change (perturbed - intact, nats/token) on the target span",
                   column="distance d = n - m of the perturbed part from the target (tokens)", cell_kind="mean",
                   variant=variant_label)
    doc_ids, spans = target_spans(loaded, docs, n=n, n_prefix=n_prefix, target_len=target_len, seed=seed,
                                  desc="perturb")
    for t, prefix, target in spans:
        todo = [(kind, d) for kind in kinds for d in distances if not run.done(f"{t.key}:{kind}:d{d}")]
        if not todo:
            continue
        others = [i for i, dd in enumerate(docs) if dd.book != docs[t.doc].book and len(doc_ids[i]) >= n_prefix]
        variants, keys = [prefix], [None]
        for kind, d in todo:
            for s in range(1 if kind == "drop" else seeds):
                rng = rng_for(seed, "perturb", t.key, kind, d, s)
                other = doc_ids[others[rng.randrange(len(others))]] if kind == "replace" and others else None
                if kind == "replace" and other is None:
                    raise InputError(f"'replace' needs another book with at least {n_prefix} tokens",
                                     data_name(docs))
                variants.append(perturb_prefix(prefix, n_prefix - d, kind, rng, target=target, other=other,
                                               pad_id=loaded.pad_id))
                keys.append((kind, d, s))
        scores = score_continuations(loaded.model, variants, [target] * len(variants), batch_size=batch_size,
                                     pad_id=loaded.pad_id)
        base = scores[0].loss
        per: dict[tuple, list[float]] = {}
        for key, sc in zip(keys[1:], scores[1:]):
            per.setdefault(key[:2], []).append(sc.loss - base)
        for kind, d in todo:
            deltas = per[(kind, d)]
            run.add({"id": f"{t.key}:{kind}:d{d}", "group": kind, "col": d, "value": sum(deltas) / len(deltas),
                     "deltas": deltas, "base_loss": base, "m": n_prefix - d, "prefix_len": n_prefix,
                     "doc": docs[t.doc].id, "target_start": t.start})
    return run.finish()


def register(sub) -> None:
    register_probe(sub, "perturb", PerturbSettings, description=__doc__,
                   help="loss change when only the distant prefix is perturbed (Sun et al. Sec 4)", run=perturb_probe)
