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

import random
from dataclasses import asdict, dataclass, field

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
def forward_read(model, ids: list[int], chunk: int = BUCKET):
    """(per-position next-token loss, per-position argmax) of ``model`` on ``ids``: position p holds the loss of
    token p given tokens < p (p = 0: nan). The LM head runs on ``chunk`` positions at a time (a 16K x 49K logits
    tensor would take 3 GB)."""
    import torch
    import torch.nn.functional as F

    x = torch.tensor([ids])
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=x).last_hidden_state[0]
        head = model.get_output_embeddings()
        nll = torch.full((len(ids),), float("nan"))
        arg = torch.full((len(ids),), -1, dtype=torch.long)
        for a in range(0, len(ids) - 1, chunk):
            b = min(a + chunk, len(ids) - 1)
            logits = head(hidden[a:b]).float()
            nll[a + 1:b + 1] = F.cross_entropy(logits, x[0, a + 1:b + 1], reduction="none")
            arg[a + 1:b + 1] = logits.argmax(-1)
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
