"""Which positions a training sample gets, and which tokens it attends to: the packing policy, PoSE, the coverage.

A packed sample (``data_concat.packed``) is several pairs (prompt + summary + EOS) laid end to end; the pack records
where each pair starts (``pair_starts``). From those boundaries alone, a sample gets

- **position ids**: ``continuous`` (0 .. n-1 over the whole sample: CNNSum Sec 5, the default) or ``reset`` (each
  pair counts from 0 again, as LLaMA-Factory's ``neat_packing`` and HF's ``position_ids`` packing do); either of them
  optionally replaced by **PoSE** ids (``pose_target`` L: see below) on each span that counts from 0 -- the whole
  sample (continuous) or each pair (reset);
- **segment ids** for the attention: ``causal`` (one segment per sample: every token attends to all earlier tokens of
  the sample, the default) or ``document`` (segment k = pair k: a token attends only to the earlier tokens of its own
  pair, a block-diagonal causal mask; ``ropescale.training.doc_mask`` turns segment ids into the mask SDPA / eager
  attention take, or FlashAttention-2's varlen arguments). Padding added by a collator gets segment :data:`PAD_SEGMENT`.

``reset`` needs ``document``: under causal attention a pair would also attend to the earlier pairs, whose position ids
are larger than its own (negative relative distances, which pre-training never showed). So three policies run:
continuous + causal (the paper's), continuous + document (no attention across pairs; under RoPE the attention logits
depend on position differences only, so this trains the same relative distances as reset + document -- what differs
is the absolute ids a length-dependent rule such as dynamic NTK reads, and the angles' rounding), and reset + document.

PoSE (Zhu et al., "PoSE: Efficient Context Window Extension of LLMs via Positional Skip-wise Training", ICLR 2024,
arXiv 2309.10400, Sec 3.2). Followed exactly:

- a span of n tokens (the paper's training window L_c) is divided at random into N chunks of lengths l_0 .. l_{N-1}
  (>= 1 each, summing to n), starting at st_i = l_0 + .. + l_{i-1} (Eq. 3); N = 2 by default, as in the paper;
- a skipping bias u_i ~ U{u_{i-1}, .., L_t - L_c} is drawn for each chunk, with u_0 = 0 ("we set the initial bias
  terms u_0 and v_0 to 0"), and chunk i gets the position ids u_i + st_i, .., u_i + st_i + l_i - 1 (Eq. 4); so the
  ids increase strictly, the chunks never overlap, and the last id u_{N-1} + n - 1 is at most L_t - 1 < L_t;
- the chunk lengths are drawn as the paper's own sampling code draws them (Appendix B, Fig. 6): l_0 ~ U{1, .., n-N+1},
  then each next l_i uniform from 1 to what leaves at least one token for each remaining chunk, the last chunk taking
  the rest. For N = 2 this is l_0 ~ U{1, .., n-1}: every cut equally likely;
- lengths and skips are drawn afresh for every sample (and every epoch).

Where this differs from the paper:

- the content is not skipped: the paper also draws each chunk's *text* from a longer document with a second bias
  v_i ~ U{v_{i-1}, .., L_x - L_c} (Eq. 5); here a sample keeps its own tokens in order (v_i = 0, the paper's Appendix A
  variant "genuinely continuous content", which Table 4 shows changes little). A packed sample is already the text to
  train on, and its summaries must follow their own prompts;
- L_c is the span's own length (packed samples vary in length; a span shorter than N tokens gets one chunk per
  token), not a fixed window, and the RoPE rule is whichever the run uses (the paper defaults to linear
  interpolation, and reports PoSE works with NTK and YaRN too, Sec 4);
- the draws come from a generator seeded by (run seed, sample index, span, epoch) (:func:`pose_rng`), not from a
  global stream: the same sample gets the same ids whatever the batch order, the rank that draws it, or a resume.
  The paper's released code (``train_pose.py``) instead caps the first chunk at half the window; the paper's text and
  figure code do not, and neither does this module.

Coverage (:class:`Coverage`): what a run trained, as counts per token of the position ids it saw -- per 1/16 of the
extended context by default, plus the tokens at or beyond it -- and the longest position id and the longest
query-key distance attended (what RoPE's angles depend on). Counts add: a run accumulates batches, ranks merge their
counts, a resume continues from a checkpoint's; :meth:`Coverage.to_json` is plain JSON.

Pure numpy and the standard library: no torch, no tokenizer; the dataset converts (``ropescale.training.data``).
What training asks of a policy -- the boundaries it needs, whether samples carry position and segment ids, whether
the varlen kernel applies -- :class:`Policy` answers: no other module compares its strings.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np

from data_concat.packed import IGNORE_INDEX
from ropescale.common.io import InputError

POSITIONS = ("continuous", "reset")
ATTENTIONS = ("causal", "document")
DEFAULT_POSITIONS = "continuous"
DEFAULT_ATTENTION = "causal"
DEFAULT_POSE_CHUNKS = 2  # PoSE Sec 3.2: "in this paper we set N to 2"
COVERAGE_BINS = 16  # the coverage histogram's default: one bin per 1/16 of the extended context
PAD_SEGMENT = -1  # the segment id of padding tokens (a collator's, never a pack's)


# ---------------------------------------------------------------- the policy
@dataclass(frozen=True)
class Policy:
    """How a sample's positions and attention are laid out (see module doc). ``pose_target`` None: no PoSE."""

    positions: str = DEFAULT_POSITIONS
    attention: str = DEFAULT_ATTENTION
    pose_target: int | None = None
    pose_chunks: int = DEFAULT_POSE_CHUNKS

    def check(self) -> "Policy":
        """This policy, or an InputError (one line, naming the flag) for an unknown value or a bad combination."""
        if self.positions not in POSITIONS:
            raise InputError(f"--positions must be one of {', '.join(POSITIONS)}, not {self.positions!r}")
        if self.attention not in ATTENTIONS:
            raise InputError(f"--attention must be one of {', '.join(ATTENTIONS)}, not {self.attention!r}")
        if self.positions == "reset" and self.attention != "document":
            raise InputError("--positions reset needs --attention document: under causal attention a pair would also "
                             "attend to the earlier pairs, whose position ids are larger than its own")
        if self.pose_target is not None and (isinstance(self.pose_target, bool) or int(self.pose_target) < 1):
            raise InputError(f"--pose-target must be a positive number of tokens, not {self.pose_target!r}")
        if isinstance(self.pose_chunks, bool) or int(self.pose_chunks) < 1:
            raise InputError(f"--pose-chunks must be >= 1, not {self.pose_chunks!r}")
        return self

    # What training asks the policy (``ropescale.training``: the dataset, the collator, the model set-up, sequence
    # parallelism); nothing outside this module compares its strings.
    @property
    def needs_boundaries(self) -> bool:
        """Whether the samples' pair boundaries are needed (reset positions or document attention)."""
        return self.positions == "reset" or self.attention == "document"

    @property
    def segments(self) -> bool:
        """Whether a sample carries segment ids (document attention: a token attends only to its own pair, a
        block-diagonal mask); under causal attention a row is one segment and needs none."""
        return self.attention == "document"

    def carries(self) -> tuple[str, ...]:
        """The keys a sample (and a sequence-parallel shard) carries besides input_ids and labels: position_ids
        unless the policy is the default one (continuous + causal, no PoSE), segment_ids under document attention
        (a shard turns them into the varlen arguments of the whole gathered sequence)."""
        return (() if self.is_default else ("position_ids",)) + (("segment_ids",) if self.segments else ())

    def varlen_kernel(self, sequence_parallel: int) -> bool:
        """Whether the core attention must be the varlen SDPA kernel (``doc_mask.VARLEN_SDPA``): document attention
        under sequence parallelism, where each segment's attention runs over the gathered sequence without a mask."""
        return self.segments and sequence_parallel > 1

    @property
    def is_default(self) -> bool:
        """Continuous + causal, no PoSE: the paper's packing, positions 0 .. n-1 and one causal mask."""
        return (self.positions, self.attention, self.pose_target) == (DEFAULT_POSITIONS, DEFAULT_ATTENTION, None)

    def label(self) -> str:
        """``continuous+causal``, ``reset+document, PoSE 4096 (2 chunks)``."""
        s = f"{self.positions}+{self.attention}"
        if self.pose_target is not None:
            s += f", PoSE {self.pose_target} ({self.pose_chunks} chunk{'s' if self.pose_chunks != 1 else ''})"
        return s

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- boundaries -> segments and spans
def check_starts(pair_starts: Sequence[int], length: int, where=None) -> np.ndarray:
    """``pair_starts`` as an int64 array, or an InputError: the first start must be 0, the starts must increase
    strictly and lie inside the sample (every pair has at least one token)."""
    s = np.asarray(list(pair_starts), dtype=np.int64)
    if length == 0 and s.size == 0:
        return s
    if s.size == 0 or s[0] != 0:
        raise InputError(f"pair boundaries {s.tolist()[:8]} must start at 0", where)
    if np.any(np.diff(s) <= 0) or s[-1] >= length:
        raise InputError(f"pair boundaries {s.tolist()[:8]}{'...' if s.size > 8 else ''} must increase strictly and "
                         f"lie inside the {length}-token sample", where)
    return s


def segment_ids(pair_starts: Sequence[int], length: int) -> np.ndarray:
    """Segment id of each token (int32): k on the tokens of pair k (pair k = ``pair_starts[k]`` ..
    ``pair_starts[k+1] - 1``)."""
    s = check_starts(pair_starts, length)
    seg = np.zeros(length, dtype=np.int32)
    if s.size > 1:
        seg[s[1:]] = 1
    return np.cumsum(seg, dtype=np.int32)


def spans(policy: Policy, length: int, pair_starts: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """The [start, end) token ranges whose position ids count from 0: the whole sample (continuous) or each pair
    (reset)."""
    if policy.positions == "continuous" or length == 0:
        return [(0, length)] if length else []
    s = check_starts(pair_starts if pair_starts is not None else [0], length).tolist()
    return list(zip(s, s[1:] + [length]))


# ---------------------------------------------------------------- PoSE
def pose_rng(seed: int, index: int, span: int = 0, epoch: int = 0) -> random.Random:
    """The generator of one span's PoSE draw: seeded by (run seed, sample index, span in the sample, epoch) through
    SHA-256, so it depends on nothing else (not the batch order, the rank, or how many draws came before) and is the
    same in every Python version (``random.Random(int)`` and ``randint`` are stable)."""
    key = json.dumps(["ropescale-pose", int(seed), int(index), int(span), int(epoch)]).encode()
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:16], "big"))


def draw_pose(length: int, target: int, chunks: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """(chunk lengths l_i, skipping biases u_i) of one span of ``length`` tokens for a target context ``target``:
    PoSE Sec 3.2 with the chunk lengths of its Appendix B code (see module doc). min(chunks, length) chunks."""
    n, big_l = int(length), int(target)
    if n > big_l:
        raise InputError(f"a {n}-token span is longer than --pose-target {big_l}: PoSE trains spans shorter than the "
                         f"target (raise --pose-target, or use shorter samples)")
    if n == 0:
        return [], []
    k = max(1, min(int(chunks), n))
    lengths, left = [], n
    for i in range(k - 1):
        li = rng.randint(1, left - (k - 1 - i))  # leave >= 1 token for each chunk still to come
        lengths.append(li)
        left -= li
    lengths.append(left)
    room = big_l - n  # L_t - L_c
    skips = [0]  # u_0 = 0
    for _ in range(1, k):
        skips.append(rng.randint(skips[-1], room))  # u_i ~ U{u_{i-1}, .., L_t - L_c}
    return lengths, skips


def pose_ids(lengths: Sequence[int], skips: Sequence[int]) -> np.ndarray:
    """Position ids of chunks with these lengths and skipping biases: u_i + st_i + (0 .. l_i - 1), st_i the chunk's
    start -- PoSE arXiv 2309.10400 Sec 3.2, Eq. 3-4."""
    if len(lengths) != len(skips):
        raise ValueError("one skip per chunk")
    parts, st = [], 0
    for li, ui in zip(lengths, skips):
        parts.append(np.arange(st, st + int(li), dtype=np.int64) + int(ui))
        st += int(li)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def pose_span(length: int, target: int, chunks: int, rng: random.Random) -> np.ndarray:
    """One span's PoSE position ids (:func:`draw_pose`, then :func:`pose_ids`)."""
    return pose_ids(*draw_pose(length, target, chunks, rng))


# ---------------------------------------------------------------- one sample
def sample_positions(policy: Policy, length: int, pair_starts: Sequence[int] | None = None, *, seed: int = 0,
                     index: int = 0, epoch: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(position ids int64, segment ids int32) of sample ``index`` (its row in the packed set) of ``length`` tokens
    under ``policy``. ``pair_starts`` is needed for reset positions and document attention; PoSE draws come from
    :func:`pose_rng` (``seed``, ``index``, span, ``epoch``)."""
    n = int(length)
    if policy.needs_boundaries and pair_starts is None:
        raise InputError(f"--positions {policy.positions} --attention {policy.attention} needs the pair boundaries "
                         f"of each sample (the pair_starts column that data_concat pack writes)")
    pos = np.empty(n, dtype=np.int64)
    for k, (a, b) in enumerate(spans(policy, n, pair_starts)):
        if policy.pose_target is None:
            pos[a:b] = np.arange(b - a)
        else:
            pos[a:b] = pose_span(b - a, policy.pose_target, policy.pose_chunks, pose_rng(seed, index, k, epoch))
    seg = segment_ids(pair_starts, n) if policy.segments else np.zeros(n, dtype=np.int32)
    return pos, seg


def check_samples(policy: Policy, lengths: Sequence[int], pair_starts: Sequence[Sequence[int]] | None,
                  where=None) -> int:
    """Before training, every sample against ``policy`` (InputError naming ``where``): boundaries present and valid
    where needed, every PoSE span no longer than the target. Returns the longest span (the longest pair under reset,
    else the longest sample)."""
    policy.check()
    if policy.needs_boundaries and pair_starts is None:
        raise InputError(f"--positions {policy.positions} --attention {policy.attention} needs the pair boundaries of "
                         f"each sample, and this set has none (no pair_starts column: pack it with python -m "
                         f"data_concat pack)", where)
    longest = 0
    for i, n in enumerate(lengths):
        starts = pair_starts[i] if pair_starts is not None else None
        if starts is not None:
            try:
                check_starts(starts, int(n))
            except InputError as e:
                raise InputError(f"sample {i}: {e.message}", where) from None
        for a, b in spans(policy, int(n), starts):
            longest = max(longest, b - a)
    if policy.pose_target is not None and longest > policy.pose_target:
        raise InputError(f"a {longest}-token {'pair' if policy.positions == 'reset' else 'sample'} is longer than "
                         f"--pose-target {policy.pose_target}: PoSE trains spans shorter than the target", where)
    return longest


# ---------------------------------------------------------------- coverage
def _rows(x, dtype) -> np.ndarray:
    a = np.asarray(x, dtype=dtype)
    return a.reshape(1, -1) if a.ndim == 1 else a


def longest_distance(position_ids, segments) -> int:
    """The largest query-key distance attended, pos[q] - pos[k] over the pairs k <= q of one segment (contiguous
    tokens with the same segment id in a row; padding excluded); -1 when there are no tokens. What RoPE's angles
    depend on: with increasing ids it is each segment's last id minus its first."""
    pos, seg = _rows(position_ids, np.int64), _rows(segments, np.int64)
    best = -1
    for p, s in zip(pos, seg):
        cut = np.flatnonzero(np.diff(s)) + 1
        for a, b in zip(np.r_[0, cut], np.r_[cut, len(s)]):
            if b > a and s[a] != PAD_SEGMENT:
                run = p[a:b]
                best = max(best, int((run - np.minimum.accumulate(run)).max()))
    return best


class Coverage:
    """Counts per token of the position ids a run trained on: ``tokens`` in each of ``bins`` bins over [0, context)
    (bin k = ``edges[k]`` .. ``edges[k+1] - 1``, ``edges[k] = k * context // bins``) and ``tokens_beyond`` at or past
    ``context``; the same for ``labelled`` (the positions whose next-token prediction has a label: the query that
    predicts a summary token); ``samples`` (rows seen), ``longest`` (the largest position id, -1 when empty) and
    ``longest_distance`` (the largest query-key distance attended, :func:`longest_distance`); ``from_step``: 0 when
    the counts cover the whole run, else the step they start at (a resume from a checkpoint that holds no coverage:
    the steps before it are not counted). Additive (:meth:`merge`) and plain JSON (:meth:`to_json` /
    :meth:`from_json`)."""

    FIELDS = ("context", "bins", "edges", "tokens", "tokens_beyond", "labelled", "labelled_beyond", "samples",
              "longest", "longest_distance", "from_step")

    def __init__(self, context: int, bins: int = COVERAGE_BINS):
        if int(context) < 1 or int(bins) < 1 or int(bins) > int(context):
            raise ValueError(f"coverage needs 1 <= bins <= context, got {bins} bins over {context}")
        self.context, self.bins = int(context), int(bins)
        self.edges = [k * self.context // self.bins for k in range(self.bins + 1)]
        self.tokens = [0] * self.bins
        self.labelled = [0] * self.bins
        self.tokens_beyond = self.labelled_beyond = self.samples = self.from_step = 0
        self.longest = self.longest_distance = -1

    def _count(self, pos: np.ndarray) -> tuple[list[int], int]:
        inside = pos[pos < self.context]
        k = np.searchsorted(np.asarray(self.edges), inside, side="right") - 1
        return np.bincount(k, minlength=self.bins).tolist(), int(pos.size - inside.size)

    def add(self, position_ids, segments=None, labels=None, attention_mask=None) -> "Coverage":
        """Count one batch (arrays of shape (B, T) or (T,); CPU torch tensors work): ``segments`` None = one
        causal segment per row; pads are left out (``attention_mask`` 0, or segment :data:`PAD_SEGMENT`);
        ``labels`` (unshifted, -100 = none) for the labelled counts. Returns self."""
        pos = _rows(position_ids, np.int64)
        seg = np.zeros_like(pos) if segments is None else _rows(segments, np.int64)
        real = seg != PAD_SEGMENT
        if attention_mask is not None:
            real &= _rows(attention_mask, np.int64) != 0
            seg = np.where(real, seg, PAD_SEGMENT)
        counts, beyond = self._count(pos[real])
        self.tokens = [a + b for a, b in zip(self.tokens, counts)]
        self.tokens_beyond += beyond
        if labels is not None:
            lab = _rows(labels, np.int64)
            scored = np.zeros_like(real)
            scored[:, :-1] = (lab[:, 1:] != IGNORE_INDEX) & real[:, 1:] & real[:, :-1]
            counts, beyond = self._count(pos[scored])
            self.labelled = [a + b for a, b in zip(self.labelled, counts)]
            self.labelled_beyond += beyond
        self.samples += int(real.any(axis=1).sum())
        if real.any():
            self.longest = max(self.longest, int(pos[real].max()))
        self.longest_distance = max(self.longest_distance, longest_distance(pos, seg))
        return self

    def merge(self, other: "Coverage") -> "Coverage":
        """Add ``other``'s counts to this one's (the same context and bins); returns self."""
        if (other.context, other.bins) != (self.context, self.bins):
            raise ValueError(f"cannot add a coverage of {other.bins} bins over {other.context} to one of {self.bins} "
                             f"bins over {self.context}")
        self.tokens = [a + b for a, b in zip(self.tokens, other.tokens)]
        self.labelled = [a + b for a, b in zip(self.labelled, other.labelled)]
        self.tokens_beyond += other.tokens_beyond
        self.labelled_beyond += other.labelled_beyond
        self.samples += other.samples
        self.longest = max(self.longest, other.longest)
        self.longest_distance = max(self.longest_distance, other.longest_distance)
        self.from_step = max(self.from_step, other.from_step)
        return self

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens) + self.tokens_beyond

    def to_json(self) -> dict:
        """A plain dict (ints and lists of ints)."""
        return {k: (list(v) if isinstance(v, list) else v) for k, v in ((f, getattr(self, f)) for f in self.FIELDS)}

    @classmethod
    def from_json(cls, d: dict, where=None) -> "Coverage":
        """The coverage :meth:`to_json` wrote, checked (InputError naming ``where`` when it is not one)."""
        try:
            cov = cls(int(d["context"]), int(d["bins"]))
            for f in ("tokens", "labelled"):
                v = [int(x) for x in d[f]]
                if len(v) != cov.bins or min(v, default=0) < 0:
                    raise ValueError(f"{f} must be {cov.bins} counts >= 0")
                setattr(cov, f, v)
            for f in ("tokens_beyond", "labelled_beyond", "samples", "longest", "longest_distance"):
                setattr(cov, f, int(d[f]))
            cov.from_step = int(d.get("from_step", 0))  # absent in records written before it existed: whole runs
            if [int(x) for x in d.get("edges", cov.edges)] != cov.edges:
                raise ValueError("edges do not match context and bins")
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"not a position coverage record ({e})", where) from None
        return cov

    @classmethod
    def total(cls, parts: Iterable["Coverage"], context: int, bins: int = COVERAGE_BINS) -> "Coverage":
        """The sum of ``parts`` (e.g. every rank's)."""
        out = cls(context, bins)
        for p in parts:
            out.merge(p)
        return out

    def __eq__(self, other) -> bool:
        return isinstance(other, Coverage) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return f"Coverage({self.to_json()})"
