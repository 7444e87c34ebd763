"""continuation: has the model memorised the text? Greedy continuations against the text's own next tokens, beside
the same windows with every character name replaced (a form of the text the model cannot have read).

From each document (``--data``: a ``.txt`` file, a directory of them, or a documents file; several comma-separated)
``--n`` prompts of ``--prompt-len`` tokens are drawn at seeded positions; the model continues each greedily for
``--continuation`` tokens (32 by default), compared with the document's next tokens: an exact match (every token the
same; a proportion, Wilson's interval) and the longest common prefix (tokens, mean). Carlini et al. 2023 (arXiv
2202.07646, Sec 3, Definition 3.1) call a greedy continuation equal to the text's own an extraction of memorised text.

The name-swapped variant reads the same windows in a copy of the document whose character names are replaced
(:func:`swap_names`): a capitalised word (``[A-Z][a-z]+``) that is not a title, weekday or month and occurs at
least ``--min-name-count`` times after a lower-case letter, comma, semicolon or ``Mr.`` / ``Mrs.`` / ``Dr.`` and
white space (so not only at a sentence's start) is a name; names are taken most frequent first and each is given
the unused name of :data:`NAMES` (none occurring in the document) nearest in tokens, then in length, the same in
every occurrence (the possessive too). The window is the same span of characters (its start and end moved by the
replacements before them), so its token count changes by a few at most.
Each window is also scored teacher-forced: the mean loss of its tokens (nats/token), and the swapped window's minus
the original's (``loss_diff``, paired by window): a model that read the text in its original form pays for the new
names, a model that did not pays about nothing.

items.jsonl: one record a prompt and variant (``group`` ``original`` / ``names-swapped``, ``value`` the exact match
0 / 1, ``lcp``, ``loss``, ``loss_diff`` on the swapped one, ``doc``, ``start``, the texts); summary.json: each
variant's exact-match rate with its Wilson interval, mean longest common prefix, mean loss, and the paired loss
difference with its t interval over windows.
"""
from __future__ import annotations

import bisect
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ropescale.common.io import InputError
from ropescale.common.settings import setting

from .common import POSITIVE, ProbeRun, ProbeSettings, data_setting, encode, probe_settings, progress, rng_for
from .data import Doc, data_name, load_docs

# modern given names (one or two tokens in most English vocabularies) and invented or rare ones, none of them in
# Austen's novels (a name the document has is skipped)
NAMES = ("Kevin", "Brian", "Gary", "Linda", "Karen", "Scott", "Wayne", "Dennis", "Gloria", "Tracy", "Shirley",
         "Brenda", "Craig", "Darren", "Kyle", "Tyler", "Megan", "Kayla", "Brandon", "Jason", "Justin", "Ashley",
         "Nicole", "Travis", "Troy", "Keith", "Glenn", "Todd", "Randy", "Chad", "Wendy", "Tiffany", "Crystal",
         "Dustin", "Derek", "Lance", "Shane", "Brent", "Kirk", "Dwayne", "Abel", "Ines", "Oren", "Tova", "Lorcan",
         "Ysolde", "Quill", "Zara", "Bram", "Odile", "Cosmo", "Perpetua", "Thaddeus", "Wren", "Idris", "Marisol",
         "Fenwick", "Ulla", "Caspian", "Dagny", "Ezra", "Greer", "Hollis", "Juno", "Kestrel", "Linnea", "Magnus",
         "Niamh", "Osric", "Petra", "Rurik", "Saoirse", "Tobiah", "Undine", "Vidar", "Wilhelmina", "Xavia", "Yorick",
         "Zebedee", "Ambrose", "Corvin", "Delphine", "Evander", "Fiora", "Gideon", "Hesper", "Ivor", "Jessamy",
         "Kolya", "Lysander", "Merritt", "Orla", "Piran", "Roswitha", "Sorrel", "Tamsin", "Ulric", "Vesna", "Warrick",
         "Ximena", "Anselm", "Birgit", "Cyprian", "Drusilla", "Ebba", "Florian", "Gunnhild", "Hadrian", "Isolde",
         "Jarrah", "Kerensa", "Leofric", "Melisande", "Nikolai", "Oriel", "Pascoe", "Radomir", "Sigrun", "Tancred",
         "Valdemar", "Yseult", "Alaric", "Brangwen", "Casimir", "Dorcas", "Eluned")
NOT_NAMES = frozenset((
    "Mr", "Mrs", "Miss", "Sir", "Lady", "Lord", "Dr", "Colonel", "Captain", "Admiral", "General", "Madam", "Madame",
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "January", "February", "March",
    "April", "May", "June", "July", "August", "September", "October", "November", "December", "God", "Heaven",
    "Chapter", "Volume", "The", "And", "But", "Oh", "Ah", "Yes", "No", "Christmas", "Easter", "English", "French"))
WORD = re.compile(r"\b[A-Z][a-z]+\b")
MID_SENTENCE = re.compile(r"(?:[a-z,;]|\b(?:Mr|Mrs|Ms|Dr|St)\.)\s+$")  # what precedes a word inside a sentence
VARIANTS = ("original", "names-swapped")


@dataclass(frozen=True)
class ContinuationSettings(ProbeSettings):
    data: str = data_setting("a .txt file, a directory of .txt files (one document each) or a documents JSONL; "
                             "several: comma-separated")
    n: int = setting(50, "prompts a document", check=POSITIVE)
    prompt_len: int = setting(256, "tokens a prompt", check=POSITIVE, metavar="P")
    continuation: int = setting(32, "tokens a greedy continuation (compared with the text's own)", check=POSITIVE,
                                metavar="C")
    min_name_count: int = setting(10, "a name: a capitalised word seen this often inside sentences",
                                  check=POSITIVE, metavar="K")


@dataclass(frozen=True)
class Swap:
    """A document with its names replaced: the ``text``, the ``names`` map, and the replaced spans ``(start, end,
    new start, new end)`` in order, which :meth:`where` reads to move a character offset into the new text."""

    text: str
    names: dict
    spans: tuple

    def where(self, c: int) -> int:
        """Offset ``c`` of the original text in the swapped one (a replaced span's inside: the span's new start)."""
        i = bisect.bisect_right([s[0] for s in self.spans], c) - 1
        if i < 0:
            return c
        a, b, na, nb = self.spans[i]
        return na if c < b else c - b + nb


def character_names(text: str, min_count: int) -> list[str]:
    """The capitalised words used as names (the module's rule), most frequent first (ties: alphabetical)."""
    counts: dict[str, int] = {}
    for m in WORD.finditer(text):
        w = m.group()
        if w not in NOT_NAMES and MID_SENTENCE.search(text, max(0, m.start() - 8), m.start()):
            counts[w] = counts.get(w, 0) + 1
    return sorted((w for w, k in counts.items() if k >= min_count), key=lambda w: (-counts[w], w))


def swap_names(text: str, min_count: int, pool=NAMES, cost: Callable[[str], int] | None = None) -> Swap:
    """``text`` with each name of :func:`character_names` replaced by the unused ``pool`` name nearest in ``cost``
    (a name's token count; None: no cost), then in length, then earlier in the pool; names left over when the pool
    runs out stay as they are."""
    present = set(WORD.findall(text))
    free = [n for n in pool if n not in present]
    names = {}
    for w in character_names(text, min_count):
        if not free:
            break
        new = min(free, key=lambda n: (abs(cost(n) - cost(w)) if cost else 0, abs(len(n) - len(w))))
        free.remove(new)
        names[w] = new
    if not names:
        return Swap(text, {}, ())
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b")
    out, spans, last, shift = [], [], 0, 0
    for m in pattern.finditer(text):
        new = names[m.group()]
        out.append(text[last:m.start()] + new)
        spans.append((m.start(), m.end(), m.start() + shift, m.start() + shift + len(new)))
        shift += len(new) - (m.end() - m.start())
        last = m.end()
    out.append(text[last:])
    return Swap("".join(out), names, tuple(spans))


def load_texts(s: ContinuationSettings) -> list[Doc]:
    """``--data``: comma-separated, each a directory's ``*.txt`` files (sorted by name, one document each) or what
    ``load_docs`` reads; the documents in the order given."""
    docs: list[Doc] = []
    for part in [x for x in s.data.split(",") if x.strip()]:
        p = Path(part.strip())
        if not p.is_dir():
            docs += load_docs(p)
            continue
        here = [d for f in sorted(p.glob("*.txt")) for d in load_docs(f)]
        if not here:
            raise InputError("a directory of texts holds *.txt files; none here", p)
        docs += here
    ids = [d.id for d in docs]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup is not None:
        raise InputError(f"--data names document {dup!r} twice (a document's id is its file's stem)", s.data)
    return docs


def tokens_with_offsets(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """(ids, each token's first character) of ``text``."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [a for a, _ in enc["offset_mapping"]]


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt`` (argmax, no stop token), the model's KV cache carried between steps."""
    import torch

    from ropescale.common.compat import cache_kwargs, last_logits_kwargs, output_cache

    out = []
    with torch.no_grad():
        r = model(input_ids=torch.tensor([prompt]), use_cache=True, **last_logits_kwargs(1))
        for step in range(n):
            out.append(int(r.logits[0, -1].argmax()))
            if step + 1 < n:
                r = model(input_ids=torch.tensor([[out[-1]]]), use_cache=True, **cache_kwargs(output_cache(r)))
    return out


def window_loss(model, ids: list[int]) -> float:
    """The mean next-token loss (nats/token) of ``ids`` (positions 1.. given the tokens before), one forward."""
    import torch
    import torch.nn.functional as F

    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids=x).logits[0, :-1].float()
    return float(F.cross_entropy(logits, x[0, 1:]))


def common_prefix(a: list[int], b: list[int]) -> int:
    """The number of leading tokens ``a`` and ``b`` share."""
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def draw_starts(n_tokens: int, n: int, need: int, seed: int, doc: Doc) -> list[int]:
    """``n`` seeded window starts in [0, n_tokens - need] (distinct where there is room), in draw order."""
    if n_tokens < need:
        raise InputError(f"document {doc.id}: {n_tokens} tokens, a window needs {need} (--prompt-len + "
                         f"--continuation)", doc.where.rsplit(":", 1)[0] or None)
    rng = rng_for(seed, "continuation", doc.id)
    room = n_tokens - need + 1
    return rng.sample(range(room), n) if n <= room else [rng.randrange(room) for _ in range(n)]


def read_window(model, ids: list[int], a: int, p: int, c: int) -> dict:
    """One window's readings: prompt ids[a:a+p], the text's next ``c`` tokens, the greedy continuation."""
    prompt, truth = ids[a:a + p], ids[a + p:a + p + c]
    gen = greedy(model, prompt, c)
    lcp = common_prefix(gen, truth)
    return {"exact": int(lcp == c), "lcp": lcp, "loss": window_loss(model, prompt + truth), "prompt_tokens": p,
            "gen": gen, "truth": truth}


def continuation_probe(loaded, docs, settings: ContinuationSettings | None = None, **fields) -> dict:
    """Run the continuation probe into ``settings.out``; returns the summary (cells: exact-match rate a variant)."""
    s = probe_settings(ContinuationSettings, settings, fields)
    s = dataclasses.replace(s, data=data_name(docs) or s.data)
    p, c, tok = s.prompt_len, s.continuation, loaded.tokenizer
    run = ProbeRun("continuation", loaded, s, [c], metric="greedy continuation equal to the text's own (%)",
                   column="continuation tokens", cell_kind="proportion")
    names = {}
    for doc in docs:
        ids, offs = tokens_with_offsets(tok, doc.text)
        sw = swap_names(doc.text, s.min_name_count, cost=lambda w: len(encode(tok, " " + w)))
        names[doc.id] = sw.names
        sids, soffs = tokens_with_offsets(tok, sw.text)
        for i, a in enumerate(progress(draw_starts(len(ids), s.n, p + c, s.seed, doc), f"continuation {doc.id}")):
            key = f"{doc.id}:{i}"
            if run.done(f"{key}:{VARIANTS[1]}"):
                continue
            orig = read_window(loaded.model, ids, a, p, c)
            # the same characters in the swapped text: its first token, and the token where the continuation starts
            sa = bisect.bisect_left(soffs, sw.where(offs[a]))
            sb = bisect.bisect_left(soffs, sw.where(offs[a + p]))
            sb = min(sb, len(sids) - c)
            swapped = read_window(loaded.model, sids, min(sa, sb - 1), sb - min(sa, sb - 1), c)
            swapped["loss_diff"] = swapped["loss"] - orig["loss"]
            for v, r in zip(VARIANTS, (orig, swapped)):
                gen, truth = r.pop("gen"), r.pop("truth")
                if not run.done(f"{key}:{v}"):  # an interrupted run may hold the original's record only
                    run.add({"id": f"{key}:{v}", "group": v, "col": c, "value": r["exact"], **r, "doc": doc.id,
                             "start": a, "continuation": tok.decode(truth), "generated": tok.decode(gen)})
    return run.finish(summarize_variants(run.log.records(), names))


def summarize_variants(records: list[dict], names: dict) -> dict:
    """Each variant's exact-match rate (Wilson), mean longest common prefix and loss; the paired loss difference."""
    from ropescale.common.stats.means import t_interval
    from ropescale.common.stats.proportions import wilson

    out = {"names": names}
    for v in VARIANTS:
        rs = [r for r in records if r["group"] == v]
        if not rs:
            continue
        w = wilson(sum(r["exact"] for r in rs), len(rs))
        out[v] = {"n": len(rs), "exact": w.k, "exact_rate": w.rate, "exact_interval": [w.lo, w.hi],
                  "interval_rule": w.rule, "lcp_mean": sum(r["lcp"] for r in rs) / len(rs),
                  "loss_mean": sum(r["loss"] for r in rs) / len(rs)}
    diffs = [r["loss_diff"] for r in records if r["group"] == VARIANTS[1]]
    if diffs:
        est = t_interval(diffs)
        out["loss_diff"] = {"n": len(diffs), "mean": sum(diffs) / len(diffs), "interval": [est.lo, est.hi],
                            "rule": "t over windows (swapped minus original)"}
    return out


def register(sub) -> None:
    from .command import register_probe

    register_probe(sub, "continuation", ContinuationSettings, run=continuation_probe, load=load_texts,
                   description=__doc__,
                   help="greedy continuations against the text's own, beside a name-swapped copy (memorisation)")
