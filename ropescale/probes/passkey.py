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
YaRN, LongRoPE's factor switch) is run once per length (:func:`read_window`).
"""
from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import asdict, dataclass, field

from ropescale.common.settings import setting

from .common import POSITIVE, ProbeRun, ProbeSettings, progress

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


def run_multi(loaded, hay, s, run, lengths, by_length: bool) -> None:
    for i in progress(range(s.n), "passkey"):
        if all(run.done(f"w{i}:L{L}:d{f}") for L in lengths for f in s.depths):
            continue
        rng = random.Random(f"{s.seed}|multi|{i}")
        start = rng.randrange(max(1, len(hay) - max(lengths))) if s.haystack == "novel" else 0
        w = plant(loaded.tokenizer, hay[start:start + 2 * max(lengths)], plan_keys(lengths, s.depths, rng),
                  source=s.haystack, start=start, rng=rng)
        reads = {L: forward_read(loaded.model, w.ids[:L]) for L in sorted(lengths)} if by_length else None
        full = None if by_length else forward_read(loaded.model, w.ids)  # one forward serves every length
        for k in w.keys:
            nll, arg = reads[k.length] if by_length else full
            rec = digit_record(w.ids, k.answer_pos, nll, arg)
            seen = sum(1 for o in w.keys if o.key_pos < k.answer_pos[0])
            rec.update(distance=k.distance, keys_in_context=seen, name=k.name)
            if s.control:  # the window up to this key's length with its key sentence cut out
                n_key = len(encode(loaded.tokenizer, key_text(k.name, k.number)))
                ids = w.ids[:k.key_pos] + w.ids[k.key_pos + n_key:k.length]
                pos = [p - n_key for p in k.answer_pos]
                cn, ca = forward_read(loaded.model, ids)
                cr = digit_record(ids, pos, cn, ca)
                rec.update(control_loss=cr["answer_loss"], control_digit_loss=cr["digit_loss"])
            run.add({"id": f"w{i}:L{k.length}:d{k.depth}", "group": "", "col": k.length,
                     "value": float(rec["retrieved"]), "depth": k.depth, "number": k.number, **rec})


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
    ``by_distance``: the reading by key distance with its references)."""
    from rope_scaling import RopeSpec
    from rope_scaling.formulas import REGISTRY

    from .common import probe_settings

    s = probe_settings(PasskeySettings, settings, fields)
    lengths = s.lengths or [loaded.orig_ctx * m for m in (1, 2, 4, 8)]
    s = dataclasses.replace(s, lengths=lengths)
    need = 2 * max(lengths) + 64
    hay = noise_ids(loaded.tokenizer, need) if s.haystack == "noise" else \
        encode(loaded.tokenizer, "".join(d.text for d in docs)[:8 * need])
    if len(hay) < max(lengths):
        from ropescale.common.io import InputError

        raise InputError(f"the haystack has {len(hay)} tokens, fewer than the longest length {max(lengths)}")
    run = ProbeRun("passkey", loaded, s, lengths, metric="passkey retrieved (every digit the argmax)",
                   column="window length L", cell_kind="proportion")
    from ropescale.common.io import InputError

    try:
        if s.keys == "single":
            run_single(loaded, hay, s, run, lengths)
        else:
            run_multi(loaded, hay, s, run, lengths, REGISTRY[RopeSpec.from_record(loaded.rope).method].by_length)
    except ValueError as e:  # a window that cannot be built from these settings
        raise InputError(f"--lengths {','.join(map(str, lengths))} --depths {','.join(map(str, s.depths))}: {e}")
    return run.finish({"by_distance": by_distance(run.log.records()), "uniform": UNIFORM})


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
