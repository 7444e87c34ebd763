"""The shared log-likelihood scorer: batched teacher-forced scoring, no generation.

Every probe reduces to "sum of token log-probabilities of a continuation given a prefix" (Sun et al. 2021 Sec 2.1,
ChapterBreak Sec 2: P(s|c); Laban et al. 2021 Sec 3.1, Eq. 1: log P(S) = sum_i log P(W_i | W_<i)).
Sequences in one batch are right-padded and masked; the model runs in fp32 under ``torch.no_grad``. The LM head runs
on the hidden states of the scored positions only (:func:`scored_logprobs`, as training's label-only head), and
each forward is first checked against the memory available (:func:`check_batch`,
``ropescale.common.forward_memory``): what cannot fit is one line naming the longest length that would.
"""
from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass
from typing import Sequence

from ropescale.common.compat import cache_kwargs, last_logits_kwargs, output_cache
from ropescale.common.forward_memory import HEAD_CHUNK, check_forward


@dataclass
class Score:
    """Log-likelihood of one continuation: ``logprob`` = sum of its token log-probs, ``n`` = its token count."""

    logprob: float
    n: int
    token_logprobs: list[float] | None = None

    @property
    def loss(self) -> float:
        """Mean negative log-likelihood per continuation token (nats)."""
        return -self.logprob / self.n if self.n else float("nan")

    @property
    def ppl(self) -> float:
        return math.exp(self.loss) if self.n else float("nan")


# logit transforms a model applies after its LM head (Gemma 2's soft-capping, Cohere's scale, Granite's divisor): a
# model with one of them is scored through its own forward (logits of the kept positions), not head(hidden) here
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def model_memory(model) -> tuple[int, str]:
    """(bytes of the model's parameter dtype, its device) for the forward estimate."""
    p = next(model.parameters(), None)
    return (p.element_size(), str(p.device)) if p is not None else (4, "cpu")


def is_hf_lm(model) -> bool:
    """A transformers causal LM (a config with a shape, a decoder, an LM head), not a stand-in that only returns
    logits (the tests' oracles): only it is checked for memory and scored through its head."""
    return hasattr(model, "get_decoder") and hasattr(getattr(model, "config", None), "num_hidden_layers")


def check_batch(model, lengths: Sequence[int], scored: int, *, what: str = "", kv: bool = False,
                kv_copies: int = 1, padded: bool | None = None):
    """The forward of a right-padded batch of rows of ``lengths`` tokens, ``scored`` of them a row through the
    head, fits this machine's memory now (``ropescale.common.forward_memory.check_forward``), or a one-line
    InputError saying the longest length that would. ``padded``: whether rows differ in length (default: whether
    ``lengths`` do). A stand-in model without a transformers config is not checked (None)."""
    if not is_hf_lm(model):
        return None
    b, device = model_memory(model)
    T = max(lengths)
    return check_forward(model.config, T, what=what or f"a forward of {T:,} tokens", batch=len(lengths),
                         scored=scored, dtype_bytes=b, kv_tokens=T if kv else 0, kv_copies=kv_copies,
                         padded=len(set(lengths)) > 1 if padded is None else padded, device=device,
                         hint="or a smaller --batch-size" if len(lengths) > 1 else "")


def _padded(batch: list[list[int]], pad_id: int):
    """(ids, mask) of a right-padded batch: (B, T) each."""
    import torch

    T = max(len(x) for x in batch)
    ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), T), dtype=torch.long)
    for i, x in enumerate(batch):
        ids[i, :len(x)] = torch.tensor(x, dtype=torch.long)
        mask[i, :len(x)] = 1
    return ids, mask


def scored_logprobs(model, batch: list[list[int]], starts: list[int], pad_id: int, *, chunk: int = HEAD_CHUNK):
    """For each row of ``batch``, the log-probabilities of its tokens from position ``starts[i]`` on (tensors of
    length ``len(row) - starts[i]``). The LM head runs on the hidden states of those positions only (as training's
    label-only head, ``ropescale.training.loss.head_loss_sum``), ``chunk`` positions at a time: the logits of the
    prefix positions nobody scores are never made. Same values as log_softmax(model(ids).logits) at the positions
    that predict those tokens (position t - 1 predicts the token at t)."""
    import torch

    ids, mask = _padded(batch, pad_id)
    first = next(model.parameters(), None)
    if first is not None:  # the model's device (a stand-in without parameters: the CPU)
        ids, mask = ids.to(first.device), mask.to(first.device)
    if not is_hf_lm(model) or any(getattr(model.config, k, None) for k in LOGIT_TRANSFORMS):  # its own head
        off = min(starts) - 1
        keep = ids.shape[1] - off
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False,
                       **(last_logits_kwargs(keep) if off > 0 else {})).logits[:, -keep:]
        return [torch.log_softmax(logits[i, s - 1 - off:len(x) - 1 - off].float(), -1)
                .gather(-1, ids[i, s:len(x)].unsqueeze(-1)).squeeze(-1) for i, (x, s) in enumerate(zip(batch, starts))]
    out = model.get_decoder()(input_ids=ids, attention_mask=mask, use_cache=False)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    rows = torch.cat([torch.full((len(x) - s,), i, dtype=torch.long) for i, (x, s) in enumerate(zip(batch, starts))])
    pos = torch.cat([torch.arange(s - 1, len(x) - 1) for x, s in zip(batch, starts)])
    rows, pos = rows.to(ids.device), pos.to(ids.device)
    h = hidden[rows, pos]  # (N, H): the positions that predict a scored token
    del hidden, out
    tgt = ids[rows, pos + 1]
    head = model.get_output_embeddings()
    lp = torch.cat([torch.log_softmax(head(h[a:a + chunk]).float(), -1).gather(-1, tgt[a:a + chunk, None])[:, 0]
                    for a in range(0, len(tgt), chunk)])
    return list(lp.split([len(x) - s for x, s in zip(batch, starts)]))


def score_continuations(model, prefixes: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], *,
                        batch_size: int = 4, pad_id: int = 0, keep_tokens: bool = False,
                        progress: str | None = None) -> list[Score]:
    """For each pair, sum_t log P(cont_t | prefix, cont_<t): the continuation's log-likelihood given its prefix.

    An empty prefix is allowed: the continuation's first token is then unscored (it has no context), as in a
    plain LM evaluation. Pairs are sorted by total length so batches hold similar lengths; results come back
    in input order. Each batch's forward is checked against the memory available first (:func:`check_batch`);
    the head runs on the scored positions only (:func:`scored_logprobs`).
    """
    import torch
    from tqdm import tqdm

    if len(prefixes) != len(continuations):
        raise ValueError("prefixes and continuations differ in number")
    seqs, starts = [], []
    for p, c in zip(prefixes, continuations):
        p, c = list(p), list(c)
        if not c:
            raise ValueError("empty continuation")
        seqs.append(p + c)
        starts.append(max(len(p), 1))  # first scored position
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    results: list[Score | None] = [None] * len(seqs)
    was_training = model.training
    model.eval()
    bar = tqdm(total=len(seqs), desc=progress, unit="seq", file=sys.stderr, leave=False, disable=progress is None)
    with torch.no_grad():
        for b in range(0, len(order), batch_size):
            idx = order[b:b + batch_size]
            batch = [seqs[i] for i in idx]
            check_batch(model, [len(x) for x in batch], max(len(seqs[i]) - starts[i] for i in idx))
            for i, lp in zip(idx, scored_logprobs(model, batch, [starts[i] for i in idx], pad_id)):
                results[i] = Score(float(lp.sum()), int(lp.numel()), lp.tolist() if keep_tokens else None)
            bar.update(len(idx))
    bar.close()
    if was_training:
        model.train()
    return results  # type: ignore[return-value]


def window_starts(n_tokens: int, window: int, overlap: float = 0.5) -> list[int]:
    """Start offsets of successive windows of ``window`` tokens overlapping by ``overlap`` (Laban et al. 2021
    Sec 3.1: "split into successive windows with 50% overlap"); the last window ends at the document's end."""
    if window < 2:
        raise ValueError("window must be at least 2 tokens")
    if n_tokens <= window:
        return [0]
    stride = max(1, int(round(window * (1 - overlap))))
    starts = list(range(0, n_tokens - window, stride))
    last = n_tokens - window
    if not starts or starts[-1] != last:
        if starts and last - starts[-1] < 1:
            starts[-1] = last
        else:
            starts.append(last)
    return starts


def score_document(model, docs: Sequence[Sequence[int]], window: int, *, overlap: float = 0.5,
                   batch_size: int = 4, pad_id: int = 0, progress: str | None = None) -> list[float]:
    """Document log-likelihood: the mean over 50%-overlapping windows of each window's log-likelihood
    (Laban et al. 2021 Sec 3.1: "Window log-likelihoods are averaged into a document log-likelihood").
    A document that fits in one window is scored whole (its first token has no context and is unscored)."""
    pieces, owner = [], []
    for d, ids in enumerate(docs):
        ids = list(ids)
        for s in window_starts(len(ids), window, overlap):
            pieces.append(ids[s:s + window])
            owner.append(d)
    scores = score_continuations(model, [[]] * len(pieces), pieces, batch_size=batch_size, pad_id=pad_id,
                                 progress=progress)
    tot = [0.0] * len(docs)
    cnt = [0] * len(docs)
    for d, sc in zip(owner, scores):
        tot[d] += sc.logprob
        cnt[d] += 1
    return [t / c for t, c in zip(tot, cnt)]


def score_candidates(model, prefix: Sequence[int], candidates: Sequence[Sequence[int]], *, batch_size: int = 6,
                     pad_id: int = 0, reuse_prefix: bool = True) -> list[Score]:
    """log P(cand | prefix) for candidates that share one prefix: the same numbers as
    :func:`score_continuations` on (prefix, cand) pairs, but the prefix is encoded once and its key/value cache
    reused for every batch of candidates (6x less work for suffix identification). ``reuse_prefix=False`` (or an
    empty prefix) scores the pairs in full; do so for dynamic NTK, whose frequencies depend on the total length."""
    import torch

    prefix = list(prefix)
    if not reuse_prefix or not prefix:
        return score_continuations(model, [prefix] * len(candidates), candidates, batch_size=batch_size,
                                   pad_id=pad_id)
    was_training = model.training
    model.eval()
    out: list[Score] = []
    with torch.no_grad():
        check_batch(model, [len(prefix)], 1, kv=True, kv_copies=min(batch_size, len(candidates)) + 1,
                    what=f"a prefix of {len(prefix):,} tokens")
        first = model(input_ids=torch.tensor([prefix]), use_cache=True, **last_logits_kwargs(1))
        last = torch.log_softmax(first.logits[0, -1].float(), dim=-1)  # predicts each candidate's first token
        cache = output_cache(first)
        P = len(prefix)
        for b in range(0, len(candidates), batch_size):
            chunk = [list(c) for c in candidates[b:b + batch_size]]
            if any(not c for c in chunk):
                raise ValueError("empty continuation")
            B, T = len(chunk), max(len(c) for c in chunk)
            ids = torch.full((B, T), pad_id, dtype=torch.long)
            mask = torch.zeros((B, P + T), dtype=torch.long)
            mask[:, :P] = 1
            for i, c in enumerate(chunk):
                ids[i, :len(c)] = torch.tensor(c)
                mask[i, P:P + len(c)] = 1
            kv = copy.deepcopy(cache)
            kv.batch_repeat_interleave(B)
            res = model(input_ids=ids, attention_mask=mask, **cache_kwargs(kv), use_cache=True)
            logp = torch.log_softmax(res.logits.float(), dim=-1)
            for i, c in enumerate(chunk):
                n = len(c)
                lp0 = last[c[0]]
                rest = logp[i, :n - 1].gather(-1, ids[i, 1:n].unsqueeze(-1)).squeeze(-1)
                out.append(Score(float(lp0 + rest.sum()), n))
    if was_training:
        model.train()
    return out
