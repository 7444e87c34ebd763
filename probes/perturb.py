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

import argparse

from common.io import InputError

from .common import ProbeRun, add_common_args, check_positive, int_list, prepare, print_summary, progress, rng_for
from .data import load_docs
from .ppl import DEFAULT_TARGET_LEN, _data_name, sample_targets, tokenize_docs
from .scorer import score_continuations

KINDS = ("shuffle", "replace", "drop", "drop-random")


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


def perturb_probe(loaded, docs, *, length: int, distances: list[int], kinds: list[str], n: int, target_len: int,
                  seeds: int, seed: int, out: str, batch_size: int = 4,
                  args: argparse.Namespace | None = None) -> dict:
    """Run the perturbation probe into run dir ``out``; cells: mean loss change per kind x distance."""
    check_positive(n=n, target_len=target_len, seeds=seeds, batch_size=batch_size)
    n_prefix = length - target_len
    if n_prefix <= 0:
        raise InputError(f"--length {length} must exceed --target-len {target_len}")
    bad = [d for d in distances if not 0 <= d < n_prefix]
    if bad:
        raise InputError(f"distances must lie in [0, {n_prefix}) for a {n_prefix}-token prefix: {bad}")
    if "replace" in kinds and len({d.book for d in docs}) < 2:
        raise InputError("'replace' needs at least two books (documents with different 'book')",
                         _data_name(docs))
    run = ProbeRun(out, "perturb", loaded, [length], seed,
                   {"n": n, "target_len": target_len, "distances": distances, "kinds": kinds, "seeds": seeds,
                    "data": _data_name(docs)}, args,
                   metric="loss change (perturbed - intact, nats/token) on the target span",
                   column="distance d = n - m of the perturbed part from the target (tokens)")
    doc_ids = tokenize_docs(loaded.tokenizer, docs)
    targets = sample_targets(doc_ids, docs, n, n_prefix, target_len, seed)
    for t in progress(targets, "perturb"):
        ids = doc_ids[t.doc]
        prefix, target = ids[t.start - n_prefix:t.start], ids[t.start:t.start + target_len]
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
                                     _data_name(docs))
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
    ap = sub.add_parser("perturb", help="loss change when only the distant prefix is perturbed (Sun et al. Sec 4)",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, "documents JSONL or chapters JSONL (one document per book; 'replace' needs >= 2 books)",
                    None)
    ap.add_argument("--length", type=int, default=0,
                    help="total input tokens N = n + k (default: the model's (scaled) context)")
    ap.add_argument("--distances", type=int_list, default=None,
                    help="distances d = n - m (default: 0 and powers of two from 64 below n)")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"perturbations, comma-separated ({', '.join(KINDS)})")
    ap.add_argument("--seeds", type=int, default=5, help="runs averaged per perturbation (default 5, as the paper)")
    ap.add_argument("--target-len", type=int, default=DEFAULT_TARGET_LEN,
                    help=f"target span tokens k (default {DEFAULT_TARGET_LEN}: Sun et al. 2021 Sec 2.2's k = 10 for "
                         f"the token-level experiments of Sec 3 and 4)")
    ap.add_argument("--tail-chapters", type=int, default=0, help="chapters data: keep each book's last N chapters")
    ap.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise InputError(f"unknown --kinds {bad} (choose from {', '.join(KINDS)})")
    docs, loaded = prepare(args, lambda: load_docs(args.data, args.tail_chapters))
    length = args.length or loaded.context
    distances = args.distances if args.distances is not None else default_distances(length - args.target_len)
    summary = perturb_probe(loaded, docs, length=length, distances=distances, kinds=kinds, n=args.n,
                            target_len=args.target_len, seeds=args.seeds, seed=args.seed, out=args.out,
                            batch_size=args.batch_size, args=args)
    print_summary(summary, args.json)
    return 0
