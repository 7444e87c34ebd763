"""Passkey retrieval and the loss by position, read together from one forward over a long window of English prose.

The passkey test is the one the YaRN (arXiv 2309.00071) and LongRoPE (arXiv 2402.13753) papers report, from
Mohtashami & Jaggi 2023 (Landmark Attention, arXiv 2305.16300; its prompt: "There is an important info hidden inside
a lot of irrelevant text. Find it and memorize them. I will quiz you about the important information there. ... The
pass key is 12345. Remember it. 12345 is the pass key. ... What is the pass key? The pass key is").
Here one window carries several keys, each with a person's name (``Alice's pass key is 12345``) so that its question
asks for one of them (RULER's multi-key needle, arXiv 2404.06654, in the passkey's words), and the answer digits
follow each question (teacher-forced), so that one forward reads them all:

- a window of ``max(lengths)`` tokens is a novel's text (the haystack) with, for every length L of ``lengths`` and
  every depth f of ``depths``, one key sentence inserted at about f x L and its question + answer in a block that
  ends exactly at token L (the keys of one length are asked in a random order). A key is *retrieved* when the
  model's argmax predicts every digit of its answer (what greedy decoding would write after the question);
- the same forward gives the next-token loss at every position: :func:`bucket_losses` averages it over the
  haystack tokens (the inserted sentences left out) of each 1,024-position bucket.

A forward over the first L tokens of the window is what a model reading L tokens computes; for a rope whose
frequencies do not depend on the length (``formulas.Method.by_length`` false) the first L positions of the longest
forward are that forward, so one forward serves every length; a rope that follows the length (dynamic NTK, dynamic
YaRN, LongRoPE's factor switch) is run once per length, and a forward whose frequencies are those of one made
already on the window (by this run, or by another through ``--forwards``) is read, not run (:class:`Forwards`).
``--novels`` draws the real-model table's windows (:func:`novel_windows`); ``--bucket`` adds the loss by bucket of
the same forwards (buckets.jsonl, in_window.jsonl: the score files of experiments/real_model.yaml).
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ropescale.common.settings import setting

from .common import NOT_NEGATIVE, POSITIVE, ProbeRun, ProbeSettings, progress

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz "
         "you about the important information there.\n\n")
NAMES = ("Alice", "Robert", "Maria", "Thomas", "Helen", "George", "Oliver", "Sophie", "Daniel", "Laura", "Victor",
         "Grace", "Henry", "Julia", "Peter", "Nora")
BUCKET = 1024  # positions per loss bucket


def key_text(name: str, number: str) -> str:
    return f"\n{name}'s pass key is {number}. Remember it. {number} is {name}'s pass key.\n"


def question_text(name: str) -> str:
    return f"\nWhat is {name}'s pass key? {name}'s pass key is "


@dataclass
class Key:
    name: str
    number: str  # five digits
    length: int  # the question block ends at this token (the context a reader of it needs)
    depth: float  # the key's position as a share of ``length``
    key_pos: int = 0  # where its sentence starts
    answer_pos: list[int] = field(default_factory=list)  # the positions of its answer digits

    @property
    def distance(self) -> int:
        """Tokens from the key sentence to its answer."""
        return self.answer_pos[0] - self.key_pos


@dataclass
class Window:
    source: str  # the novel (file stem)
    start: int  # the haystack's first token in the novel
    ids: list[int]
    hay: list[bool]  # True where the token is the novel's own text
    keys: list[Key]

    def record(self) -> dict:
        return {"source": self.source, "start": self.start, "tokens": len(self.ids),
                "keys": [asdict(k) for k in self.keys]}


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def digit_ids(tokenizer, number: str) -> list[int]:
    """The answer's tokens: one per digit (InputError-free check: the tokenizer must split digits, as SmolLM2's
    and Llama-3's do; otherwise the number's own tokens)."""
    return encode(tokenizer, number)


def plan_keys(lengths, depths, rng: random.Random) -> list[Key]:
    """One key per (length, depth), each with its own name and a random five-digit number."""
    names = list(NAMES)
    rng.shuffle(names)
    if len(lengths) * len(depths) > len(names):
        raise ValueError(f"at most {len(names)} keys a window")
    keys = []
    for L in sorted(lengths):
        for f in depths:
            keys.append(Key(names[len(keys)], str(rng.randint(10000, 99999)), int(L), float(f)))
    return keys


def _events(tokenizer, keys: list[Key], rng: random.Random) -> list[tuple[int, list[int], list]]:
    """(start position, tokens, [(key, offset of its answer in the tokens)]) of every insertion, in order: the key
    sentences at about depth x length, each length's question block ending at that length."""
    ev = []
    for L in sorted({k.length for k in keys}):
        block, answers = [], []
        group = [k for k in keys if k.length == L]
        rng.shuffle(group)
        for k in group:
            block += encode(tokenizer, question_text(k.name))
            answers.append((k, len(block)))
            block += digit_ids(tokenizer, k.number)
        ev.append((L - len(block), block, answers, None))
    blocks = [(e[0], e[0] + len(e[1])) for e in ev]
    for k in keys:
        toks = encode(tokenizer, key_text(k.name, k.number))
        pos = int(k.depth * k.length)
        for a, b in blocks:  # a key sentence that would run into a question block goes just before it
            if pos < b and a < pos + len(toks):
                pos = a - len(toks)
        ev.append((pos, toks, [], k))
    return sorted(ev, key=lambda e: e[0])


def plant(tokenizer, hay: list[int], keys: list[Key], *, source: str = "", start: int = 0,
          rng: random.Random | None = None) -> Window:
    """The window: INTRO, then the haystack tokens ``hay`` with every key sentence and question block inserted
    (:func:`_events`), ``max(length)`` tokens in all. ValueError when insertions overlap or the haystack runs
    out."""
    rng = rng or random.Random(0)
    total = max(k.length for k in keys)
    ids = encode(tokenizer, INTRO)
    flags = [False] * len(ids)
    h = 0
    for pos, toks, answers, key in _events(tokenizer, keys, rng):
        if key is not None:  # a key sentence goes where the text so far ends when an earlier one reached past pos
            pos = max(pos, len(ids))
        if pos < len(ids):
            raise ValueError(f"insertions overlap at position {pos} (the window so far has {len(ids)} tokens)")
        need = pos - len(ids)
        if h + need > len(hay):
            raise ValueError("the haystack is too short for the window")
        ids += hay[h:h + need]
        flags += [True] * need
        h += need
        if key is not None:
            key.key_pos = len(ids)
        for k, off in answers:
            k.answer_pos = list(range(len(ids) + off, len(ids) + off + len(digit_ids(tokenizer, k.number))))
        ids += toks
        flags += [False] * len(toks)
    assert len(ids) == total, (len(ids), total)
    return Window(source, start, ids, flags, keys)


def novel_windows(tokenizer, texts: dict[str, str], n: int, lengths, depths, seed: int) -> list[Window]:
    """``n`` windows, the i-th from the i-th novel of ``texts`` (cycling), its haystack from a random start (seed)
    in that novel's tokens, its keys from :func:`plan_keys`."""
    rng = random.Random(seed)
    names = list(texts)
    out = []
    for i in range(n):
        src = names[i % len(names)]
        toks = encode(tokenizer, texts[src])
        need = max(lengths)
        if len(toks) < need + 1:
            raise ValueError(f"{src} has {len(toks)} tokens, fewer than a window's {need}")
        start = rng.randint(0, len(toks) - need - 1)
        keys = plan_keys(lengths, depths, rng)
        out.append(plant(tokenizer, toks[start:start + need], keys, source=src, start=start, rng=rng))
    return out


# ---------------------------------------------------------------- reading a window
def forward_read(model, ids: list[int], chunk: int = BUCKET, device: str | None = None):
    """(per-position next-token loss, per-position argmax) of ``model`` on ``ids``: position p holds the loss of
    token p given tokens < p (p = 0: nan). The LM head runs on ``chunk`` positions at a time (a 16K x 49K logits
    tensor would take 3 GB); the input goes to ``device`` (default: the CPU), the results come back to the CPU."""
    import torch
    import torch.nn.functional as F

    x = torch.tensor([ids], device=device)
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=x).last_hidden_state[0]
        head = model.get_output_embeddings()
        nll = torch.full((len(ids),), float("nan"))
        arg = torch.full((len(ids),), -1, dtype=torch.long)
        for a in range(0, len(ids) - 1, chunk):
            b = min(a + chunk, len(ids) - 1)
            logits = head(hidden[a:b]).float()
            nll[a + 1:b + 1] = F.cross_entropy(logits, x[0, a + 1:b + 1], reduction="none").cpu()
            arg[a + 1:b + 1] = logits.argmax(-1).cpu()
    return nll, arg


def key_results(window: Window, arg, nll, length: int | None = None) -> list[dict]:
    """Per key (of ``length``, or all): retrieved (every answer digit is the argmax) and the answer's mean loss."""
    ids = window.ids
    out = []
    for k in window.keys:
        if length is not None and k.length != length:
            continue
        ok = all(int(arg[p]) == ids[p] for p in k.answer_pos)
        out.append({"name": k.name, "length": k.length, "depth": k.depth, "distance": k.distance,
                    "retrieved": bool(ok), "answer_loss": float(nll[k.answer_pos].mean())})
    return out


def bucket_losses(window: Window, nll, upto: int | None = None, bucket: int = BUCKET) -> list[float]:
    """The mean loss over the haystack tokens of each ``bucket``-position bucket (positions >= 1, < ``upto``)."""
    import torch

    n = len(nll) if upto is None else upto
    hay = torch.tensor(window.hay[:n])
    out = []
    for a in range(0, n, bucket):
        m = hay[a:a + bucket].clone()
        if a == 0:
            m[0] = False
        out.append(float(nll[a:a + bucket][m].mean()) if m.any() else float("nan"))
    return out


# ---------------------------------------------------------------- the registered probe: ``ropescale probes passkey``
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "  # the papers'
SINGLE_KEY = "The pass key is {n}. Remember it. {n} is the pass key. "
SINGLE_QUESTION = "What is the pass key? The pass key is "
UNIFORM = math.log(10)  # nats a digit of a uniform guess over 0-9
DISTANCE_BINS = (0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def copier_loss(k: int) -> float:
    """Nats a digit of a reader that copies one of the ``k`` five-digit keys in its context at random: ln k / 5
    (one of k equally likely keys, its five digits then certain; the issue's reference for a multi-key test)."""
    return math.log(k) / 5 if k > 0 else float("nan")


def distance_bin(d: int) -> str:
    """The key-distance bucket of ``d`` tokens: [a, b) of :data:`DISTANCE_BINS`."""
    for a, b in zip(DISTANCE_BINS, DISTANCE_BINS[1:]):
        if a <= d < b:
            return f"{a}-{b}"
    return f">={DISTANCE_BINS[-1]}"


def noise_ids(tokenizer, n: int) -> list[int]:
    """At least ``n`` tokens of the noise haystack (its five sentences repeated)."""
    unit = encode(tokenizer, NOISE)
    return unit * (n // len(unit) + 2)


def single_window(tokenizer, hay: list[int], length: int, depth: float, number: str, with_key: bool = True) -> dict:
    """The papers' single-key window of ``length`` tokens: INTRO, haystack, the key sentence at ``depth`` of the
    haystack, haystack, the question, the five answer digits (teacher-forced). ``with_key`` False: the same window
    with the key sentence removed (the no-key control). Returns ids, answer positions and the key's position."""
    intro, key = encode(tokenizer, INTRO), encode(tokenizer, SINGLE_KEY.format(n=number))
    q, ans = encode(tokenizer, SINGLE_QUESTION), digit_ids(tokenizer, number)
    fill = length - len(intro) - len(key) - len(q) - len(ans)
    if fill < 1:
        raise ValueError(f"length {length} is too short for the passkey window")
    at = int(round(depth * fill))
    ids = intro + hay[:at] + (key if with_key else []) + hay[at:fill] + q
    return {"ids": ids + ans, "answer_pos": list(range(len(ids), len(ids) + len(ans))), "key_pos": len(intro) + at}


@dataclass(frozen=True)
class PasskeySettings(ProbeSettings):
    lengths: list[int] | None = setting(None, "window lengths L (every token, the answer included), comma-separated; "
                                              "default: 1x, 2x, 4x, 8x the original context", check=POSITIVE,
                                        metavar="L,L,...")
    depths: list[float] = setting([0.1, 0.3, 0.5, 0.7, 0.9], "key depths (share of the window), comma-separated",
                                  check=(lambda d: 0 <= d <= 1, "in [0, 1]"), metavar="F,F,...")
    keys: str = setting("single", "single: one key a window (the YaRN / LongRoPE papers' format); multi: named keys, "
                                  "one a (length, depth), all in one window", choices=("single", "multi"))
    haystack: str = setting("noise", "noise: the papers' repeated sentences; novel: --data's text",
                            choices=("noise", "novel"))
    control: bool = setting(True, "also read each key with its key sentence removed (the no-key control)")
    control_upto: int | None = setting(None, "--keys multi: the no-key control only for the keys of lengths <= L "
                                             "(a forward a key, to its length: the costly part); default: every key",
                                       check=POSITIVE, metavar="L")
    novels: list[str] | None = setting(None, "--keys multi: .txt novels (or a directory of them, sorted), "
                                             "comma-separated: window i from novel i in order, cycling, at a random "
                                             "start (the real-model windows, novel_windows); default: --data's text",
                                       metavar="PATH,...")
    bucket: int = setting(0, "--keys multi: also the loss by bucket of B positions of the same forwards "
                             "(buckets.jsonl, to the longest length; in_window.jsonl, to --in-window); 0: none",
                          check=NOT_NEGATIVE, metavar="B")
    in_window: int | None = setting(None, "the in-window buckets end here, read from the forward at this length for "
                                          "a rope that follows the length; default: the rope's original context",
                                    check=POSITIVE, metavar="L")
    forwards: str | None = setting(None, "--keys multi: a directory of forwards runs share (one file a model, window, "
                                         "length and rope frequencies): a run reads a forward another made with the "
                                         "same frequencies on the same tokens instead of running it",
                                   metavar="DIR", resume="ignore")


def digit_record(ids, answer_pos, nll, arg) -> dict:
    """Per-digit loss, the mean, and retrieved (every digit the argmax)."""
    d = [float(nll[p]) for p in answer_pos]
    return {"digit_loss": d, "answer_loss": sum(d) / len(d), "retrieved": all(int(arg[p]) == ids[p]
                                                                               for p in answer_pos)}


def run_single(loaded, hay, s, run, lengths) -> None:
    todo = [(L, f, i) for L in sorted(lengths) for f in s.depths for i in range(s.n)]
    todo = [t for t in todo if not run.done(f"L{t[0]}:d{t[1]}:{t[2]}")]
    for L, f, i in progress(todo, "passkey"):
        rng = random.Random(f"{s.seed}|{L}|{f}|{i}")
        number = str(rng.randint(10000, 99999))
        start = rng.randrange(max(1, len(hay) - L)) if s.haystack == "novel" else 0
        w = single_window(loaded.tokenizer, hay[start:start + L], L, f, number)
        nll, arg = forward_read(loaded.model, w["ids"])
        rec = digit_record(w["ids"], w["answer_pos"], nll, arg)
        rec.update(distance=w["answer_pos"][0] - w["key_pos"], keys_in_context=1)
        if s.control:
            c = single_window(loaded.tokenizer, hay[start:start + L], L, f, number, with_key=False)
            cn, ca = forward_read(loaded.model, c["ids"])
            cr = digit_record(c["ids"], c["answer_pos"], cn, ca)
            rec.update(control_loss=cr["answer_loss"], control_digit_loss=cr["digit_loss"],
                       control_retrieved=cr["retrieved"])
        run.add({"id": f"L{L}:d{f}:{i}", "group": "", "col": L, "value": float(rec["retrieved"]), "depth": f,
                 "number": number, **rec})


def signature(state, seq_len: int | None) -> tuple:
    """What a forward computes with this rope at ``seq_len``: the frequencies and attention factor, rounded (two
    ropes with the same signature compute the same forward: ``formulas.frequencies`` decides, pair by pair)."""
    f = state.frequencies(seq_len)
    return tuple(float(f"{x:.10e}") for x in f.inv_freq) + (round(f.attention_factor, 10),)


class Forwards:
    """The forwards of one run: a rope that follows the length (``formulas.Method.by_length``) runs at each length
    asked, any other once over the whole window (its first L positions are what a reader of L tokens computes);
    a forward with the signature of one made already (on this window: a longest one first, then one of this length)
    is read, not run; ``cache``: a directory runs share, one file a forward."""

    def __init__(self, loaded, cache: str | None):
        from rope_scaling import RopeSpec
        from rope_scaling.formulas import REGISTRY
        from rope_scaling.load import load_config

        spec = RopeSpec.from_record(loaded.rope)
        self.state = load_config(loaded.path, spec).state
        self.by_length = REGISTRY[self.state.spec.method].by_length
        self.label = spec.attention_label()
        self.model, self.model_id = loaded.model, loaded.model_id or str(loaded.path)
        self.cache = None if cache is None else Path(cache)
        self.memory: dict = {}
        self.log: dict = {}

    def key(self, ids: list[int], sig: tuple, length) -> str:
        import hashlib

        text = json.dumps([self.model_id, hashlib.sha256(str(ids).encode()).hexdigest(), list(sig), self.label,
                           length])
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def read(self, k: str):
        f = None if self.cache is None else self.cache / f"{k}.pt"
        if f is not None and f.is_file():
            import torch

            d = torch.load(f, weights_only=True)
            return d["nll"], d["arg"]
        return None

    def keep(self, k: str, got) -> None:
        self.memory[k] = got
        if self.cache is not None:
            import torch

            from ropescale.common.io import atomic_open

            self.cache.mkdir(parents=True, exist_ok=True)
            with atomic_open(self.cache / f"{k}.pt", "wb", encoding=None) as f:
                torch.save({"nll": got[0], "arg": got[1]}, f)

    def at(self, w: Window, length: int):
        """(nll, arg) of a forward that serves ``length`` tokens of ``w``."""
        sig = signature(self.state, length if self.by_length else None)
        span = length if self.by_length else len(w.ids)  # the tokens of the forward that serves it
        whole = self.key(w.ids, sig, "all")
        own = self.key(w.ids[:span], sig, span) if self.by_length else whole
        if own in self.memory:  # this run's (ran or read already: logged then)
            return self.memory[own]
        for k in dict.fromkeys((whole, own)):
            got = self.read(k)
            if got is not None:
                self.log[span] = "read"
                self.memory[own] = got
                return got
        got = forward_read(self.model, w.ids[:span])
        self.log[span] = "ran"
        self.keep(own, got)
        return got


def bucket_tokens(window: Window, upto: int, bucket: int) -> list[tuple[int, int]]:
    """(first position, haystack tokens) of each ``bucket``-position bucket below ``upto`` that has some (positions
    >= 1: :func:`bucket_losses`' positions)."""
    spans = [(a, sum(window.hay[max(a, 1):min(a + bucket, upto)])) for a in range(0, upto, bucket)]
    return [(a, n) for a, n in spans if n]


def bucket_records(window: Window, nll, upto: int, bucket: int, i: int, kind: str) -> list[dict]:
    """One record a bucket with haystack tokens (:func:`bucket_losses`): window, bucket (its first position), loss,
    tokens (the haystack tokens it averages)."""
    losses = bucket_losses(window, nll, upto, bucket)
    return [{"id": f"w{i}:{kind}:b{a}", "window": i, "bucket": a, "loss": losses[a // bucket], "tokens": n}
            for a, n in bucket_tokens(window, upto, bucket)]


def read_novels(paths: list[str]) -> dict[str, str]:
    """{stem: text} of the novels in order (a directory: its .txt files, sorted; a relative path not found here: under
    the shared data directory, ``ropescale.common.paths.DATA_DIR``); InputError naming a missing one."""
    from ropescale.common.io import InputError
    from ropescale.common.paths import DATA_DIR

    files = []
    for p in map(Path, paths):
        p = p if p.exists() or p.is_absolute() else DATA_DIR / p
        if p.is_dir():
            files += sorted(p.glob("*.txt"))
        elif p.is_file():
            files.append(p)
        else:
            raise InputError("--novels: no such file or directory", p)
    if not files:
        raise InputError("--novels: no .txt novel there", paths[0])
    return {f.stem: f.read_text(encoding="utf-8") for f in files}


def multi_windows(loaded, hay, s, lengths) -> list[Window]:
    """The windows of ``--keys multi``: with ``--novels`` (``hay``: {name: text}), :func:`novel_windows` (the
    real-model table's windows for the same seed); else each from its own random start in the haystack."""
    if isinstance(hay, dict):
        return novel_windows(loaded.tokenizer, hay, s.n, lengths, s.depths, s.seed)
    out = []
    for i in range(s.n):
        rng = random.Random(f"{s.seed}|multi|{i}")
        start = rng.randrange(max(1, len(hay) - max(lengths))) if s.haystack == "novel" else 0
        out.append(plant(loaded.tokenizer, hay[start:start + 2 * max(lengths)], plan_keys(lengths, s.depths, rng),
                         source=s.haystack, start=start, rng=rng))
    return out


def key_record(loaded, s, w: Window, k: Key, i: int, read) -> dict:
    """A key's record: its digits' losses, retrieved, distance, its slot's nominal distance (``back``: length x (1 -
    depth) tokens, the same in every window: a label, as a key pushed past its depth by an earlier insertion sits
    nearer its answer), the keys in its context and a copier's loss among them (:func:`copier_loss`), the no-key
    control."""
    nll, arg = read
    rec = digit_record(w.ids, k.answer_pos, nll, arg)
    seen = sum(1 for o in w.keys if o.key_pos < k.answer_pos[0])
    rec.update(distance=k.distance, back=round(k.length * (1 - k.depth)), keys_in_context=seen,
               copier=copier_loss(seen), name=k.name, window=i)
    if s.control and (s.control_upto is None or k.length <= s.control_upto):  # the window up to this key's
        # length with its key sentence cut out
        n_key = len(encode(loaded.tokenizer, key_text(k.name, k.number)))
        ids = w.ids[:k.key_pos] + w.ids[k.key_pos + n_key:k.length]
        pos = [p - n_key for p in k.answer_pos]
        cn, ca = forward_read(loaded.model, ids)
        cr = digit_record(ids, pos, cn, ca)
        rec.update(control_loss=cr["answer_loss"], control_digit_loss=cr["digit_loss"])
    return {"id": f"w{i}:L{k.length}:d{k.depth}", "group": "", "col": k.length, "value": float(rec["retrieved"]),
            "depth": k.depth, "number": k.number, **rec}


def run_multi(loaded, hay, s, run, lengths) -> dict:
    """Every window's keys (items.jsonl) and, with ``--bucket``, its loss by bucket (buckets.jsonl, in_window.jsonl)
    from the same forwards; returns {window: its source, start, forwards and seconds}."""
    import time

    fw = Forwards(loaded, s.forwards)
    logs = {k: run.dir.log(f) for k, f in (("all", "buckets.jsonl"), ("in", "in_window.jsonl"))} if s.bucket else {}
    total, inwin = max(lengths), s.in_window
    done: dict = {}
    for i, w in enumerate(progress(multi_windows(loaded, hay, s, lengths), "passkey")):
        keys = {f"w{i}:L{k.length}:d{k.depth}": k for k in w.keys}
        spans = {kind: (upto, [f"w{i}:{kind}:b{a}" for a, _ in bucket_tokens(w, upto, s.bucket)])
                 for kind, upto in (("all", total), ("in", inwin))} if s.bucket else {}
        if all(run.done(r) for r in keys) and all(r in logs[k] for k, (_, ids) in spans.items() for r in ids):
            continue
        t, fw.log = time.monotonic(), {}
        for rid, k in keys.items():
            if not run.done(rid):
                run.add(key_record(loaded, s, w, k, i, fw.at(w, k.length)))
        for kind, (upto, ids) in spans.items():
            if not all(r in logs[kind] for r in ids):
                run.start()
                for rec in bucket_records(w, fw.at(w, upto)[0], upto, s.bucket, i, kind):
                    if rec["id"] not in logs[kind]:
                        logs[kind].append(rec)
        done[i] = {"source": w.source, "start": w.start, "forwards": dict(fw.log),
                   "seconds": round(time.monotonic() - t, 1)}
    return done


def by_distance(records: list[dict]) -> list[dict]:
    """The reading by key distance: per distance bucket, n, accuracy with its Wilson interval, the mean answer loss
    a digit, the no-key control's, and the references (uniform ln 10; ln K / 5 for K keys in context)."""
    from ropescale.common.stats.proportions import wilson

    rows: dict = {}
    for r in records:
        rows.setdefault(distance_bin(r["distance"]), []).append(r)
    out = []
    for b, rs in sorted(rows.items(), key=lambda kv: DISTANCE_BINS.index(int(kv[0].split("-")[0].lstrip(">=")))):
        w = wilson(sum(bool(r["retrieved"]) for r in rs), len(rs))
        ctl = [r["control_loss"] for r in rs if "control_loss" in r]
        k = sum(r["keys_in_context"] for r in rs) / len(rs)
        out.append({"distance": b, "n": len(rs), "accuracy": w.rate, "lo": w.lo, "hi": w.hi,
                    "answer_loss": sum(r["answer_loss"] for r in rs) / len(rs),
                    "control_loss": sum(ctl) / len(ctl) if ctl else None, "uniform": UNIFORM,
                    "copier": copier_loss(round(k)) if k > 1 else None, "keys_in_context": k})
    return out


def passkey_probe(loaded, docs, settings: PasskeySettings | None = None, **fields) -> dict:
    """Run the passkey probe into ``settings.out``; returns the summary (cells: retrieval accuracy per length;
    ``by_distance``: the reading by key distance with its references; ``windows``: each window's source, start and
    forwards, ran or read, with --keys multi)."""
    from ropescale.common.io import InputError

    from .common import probe_settings

    s = probe_settings(PasskeySettings, settings, fields)
    lengths = s.lengths or [loaded.orig_ctx * m for m in (1, 2, 4, 8)]
    s = dataclasses.replace(s, lengths=lengths, in_window=s.in_window or int(loaded.rope.get("orig_ctx")
                                                                             or loaded.orig_ctx))
    if s.bucket and s.keys != "multi":
        raise InputError("--bucket reads the forwards of --keys multi (one window a forward)")
    if s.bucket and s.in_window > max(lengths):
        raise InputError(f"--in-window {s.in_window} is past the longest length {max(lengths)}")
    need = 2 * max(lengths) + 64
    hay = read_novels(s.novels) if s.novels and s.keys == "multi" else noise_ids(loaded.tokenizer, need) \
        if s.haystack == "noise" else encode(loaded.tokenizer, "".join(d.text for d in docs)[:8 * need])
    if not isinstance(hay, dict) and len(hay) < max(lengths):
        raise InputError(f"the haystack has {len(hay)} tokens, fewer than the longest length {max(lengths)}")
    run = ProbeRun("passkey", loaded, s, lengths, metric="passkey retrieved (every digit the argmax)",
                   column="window length L", cell_kind="proportion")
    run.rec.info["bound"] = bound(loaded, max(lengths))
    extra: dict = {}
    try:
        if s.keys == "single":
            run_single(loaded, hay, s, run, lengths)
        else:
            extra["windows"] = run_multi(loaded, hay, s, run, lengths)
    except ValueError as e:  # a window that cannot be built from these settings
        raise InputError(f"--lengths {','.join(map(str, lengths))} --depths {','.join(map(str, s.depths))}: {e}")
    records = run.log.records()
    run.rec.info.update(effective_lengths(records, lengths))
    return run.finish({"by_distance": by_distance(records), "uniform": UNIFORM, **extra,
                       **{k: run.rec.info[k] for k in ("bound", "eff_passkey", "eff_answer")}})


def bound(loaded, seq_len: int) -> int | None:
    """The row's bound at ``seq_len`` (``rope describe``: the angle bound, or an attention method's reach; None:
    none)."""
    from rope_scaling import RopeSpec
    from rope_scaling.describe import describe, load_config

    d = describe(load_config(loaded.path), RopeSpec.from_record(loaded.rope), seq_len=seq_len)
    b = d["attention_extend"]["max_context"] if "attention_extend" in d else d["reach"]
    return None if b is None or not math.isfinite(b) else int(round(b))


def kilo(n: int) -> str:
    return f"{n // 1024}K" if n and n % 1024 == 0 else str(n)


def effective_lengths(records: list[dict], lengths) -> dict:
    """The run's effective lengths (``stats.lengths.effective_length``, the longest length up to which every one
    passes): by retrieval (a length's keys retrieved >= 50 %) and by answer loss (its mean a digit below a uniform
    guess, ln 10)."""
    from ropescale.common.stats.lengths import effective_length

    cols = [kilo(L) for L in sorted(lengths)]
    by = {kilo(L): [r for r in records if r["col"] == L] for L in lengths}
    acc = {c: sum(bool(r["retrieved"]) for r in by[c]) / len(by[c]) if by[c] else None for c in cols}
    ans = {c: -sum(r["answer_loss"] for r in by[c]) / len(by[c]) if by[c] else None for c in cols}
    return {"eff_passkey": effective_length(acc, 0.5, columns=cols).text(),
            "eff_answer": effective_length(ans, -UNIFORM, columns=cols).text()}


def register(sub) -> None:
    from .command import register_probe
    from .data import load_docs

    register_probe(sub, "passkey", PasskeySettings, more="docs/ruler.md", run=passkey_probe,
                   load=lambda s: load_docs(s.data),
                   description="passkey: " + (__doc__ or "").split("\n\n")[0] + "\n\nDefault: one key a window in "
                   "the noise haystack (the papers' format); --keys multi plants named keys, one a (length, depth), "
                   "in one window. Each record keeps the per-digit loss, the key's distance and the no-key "
                   "control (the same window without the key sentence); summary.json reads them by key distance "
                   "against a uniform guess (ln 10) and a copier of one of K keys (ln K / 5).",
                   help="passkey retrieval, single key (the YaRN / LongRoPE papers' format) or named keys")
