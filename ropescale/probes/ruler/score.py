"""Scoring a RULER sample both ways, from one forward of its prompt.

- RULER's metrics (NVIDIA/RULER scripts/eval/synthetic/constants.py): ``string_match_all`` = the mean over samples
  of the share of a sample's references found (case-insensitive substring) in its prediction, x 100;
  ``string_match_part`` = the mean of 1 when any reference is found, x 100; a prediction is stripped and its control
  characters turned into newlines first (scripts/eval/evaluate.py ``postprocess_pred``);
- teacher-forced: the answer's tokens after the prompt, their log-probability and whether each is the argmax; a
  reference counts as read when every one of its tokens is the argmax (greedy decoding would write it there), so
  ``tf_all`` is string_match_all's share with "found" replaced by "read";
- generated: greedy decoding of up to the sample's budget, stopped at EOS or once every reference is in the text
  (string_match_all and _part can no longer change: a longer text still contains them).

The prompt's forward is shared: its KV cache serves the teacher-forced answer and the generation (one prefill where
there were two), for a rope whose frequencies do not follow the length; a rope that follows it (dynamic NTK,
dynamic YaRN, LongRoPE) is scored on a full forward of prompt + answer and generates from its own prefill.
"""
from __future__ import annotations

import copy
import math
import re

from ropescale.common.compat import cache_kwargs, last_logits_kwargs, output_cache

from .base import Sample


def postprocess(pred: str) -> str:
    """RULER's ``postprocess_pred``: strip, control characters to newlines, strip."""
    return re.sub(r"[\x00-\x1f]", "\n", pred.strip()).strip()


def match_all(pred: str, refs: list[str]) -> float:
    """One sample's string_match_all share: the references found in the prediction / their number."""
    return sum(r.lower() in pred.lower() for r in refs) / len(refs)


def match_part(pred: str, refs: list[str]) -> float:
    """One sample's string_match_part: 1 when any reference is in the prediction."""
    return float(max(r.lower() in pred.lower() for r in refs))


def string_match_all(preds: list[str], refs: list[list[str]]) -> float:
    """RULER's string_match_all over samples, in percent, rounded to 2 places."""
    return round(sum(match_all(p, r) for p, r in zip(preds, refs)) / len(preds) * 100, 2)


def string_match_part(preds: list[str], refs: list[list[str]]) -> float:
    """RULER's string_match_part over samples, in percent, rounded to 2 places."""
    return round(sum(match_part(p, r) for p, r in zip(preds, refs)) / len(preds) * 100, 2)


def teacher_result(sample: Sample, logp, arg) -> dict:
    """The teacher-forced reading from the answer tokens' log-softmax rows ``logp`` (one per answer token) and
    argmax ``arg``."""
    import torch

    if any(b <= a for a, b in sample.spans):
        raise ValueError(f"{sample.task}: a reference with no tokens in the answer (spans {sample.spans})")
    tgt = torch.tensor(sample.answer)
    lp = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    hit = arg == tgt
    read = [bool(hit[a:b].all()) for a, b in sample.spans]
    ref_tok = [i for a, b in sample.spans for i in range(a, b)]
    return {"tf_all": sum(read) / len(read), "tf_read": read, "answer_logprob": float(lp.sum()),
            "answer_tokens": len(sample.answer), "ref_loss": float(-lp[ref_tok].mean()),
            "token_acc": float(hit.float().mean())}


def greedy(model, cache, first_logits, sample: Sample, tokenizer, eos_id) -> tuple[str, int]:
    """Greedy decoding from a prefilled ``cache`` (its last logits ``first_logits``): (text, tokens written)."""
    import torch

    out: list[int] = []
    logits = first_logits
    P = len(sample.prompt)
    steps = max(sample.budget, len(sample.answer))  # what the length reserved
    for step in range(steps):
        tok = int(logits.argmax(-1))
        if eos_id is not None and tok == eos_id:
            break
        out.append(tok)
        text = tokenizer.decode(out, skip_special_tokens=True)
        if match_all(postprocess(text), sample.refs) == 1.0 or step + 1 == steps:
            break
        pos = torch.tensor([[P + step]])
        res = model(input_ids=torch.tensor([[tok]]), position_ids=pos, use_cache=True, **cache_kwargs(cache))
        cache = output_cache(res)
        logits = res.logits[0, -1].float()
    return tokenizer.decode(out, skip_special_tokens=True), len(out)


def read_sample(model, sample: Sample, tokenizer, *, teacher: bool = True, generate: bool = True,
                shared: bool = True, eos_id: int | None = None) -> dict:
    """Score ``sample``: the teacher-forced reading and/or the generated answer with RULER's metrics. ``shared``:
    one prefill serves both (a rope that does not follow the length)."""
    import torch

    out: dict = {}
    P, A = len(sample.prompt), len(sample.answer)
    with torch.no_grad():
        if shared:
            pre = model(input_ids=torch.tensor([sample.prompt]), use_cache=True, **last_logits_kwargs(1))
            cache, last = output_cache(pre), pre.logits[0, -1].float()
            if teacher:
                kv = copy.deepcopy(cache) if generate else cache
                pos = torch.arange(P, P + A - 1).unsqueeze(0)
                rest = model(input_ids=torch.tensor([sample.answer[:-1]]), use_cache=True, position_ids=pos,
                             **cache_kwargs(kv)) if A > 1 else None
                logits = last.unsqueeze(0) if rest is None else torch.cat([last.unsqueeze(0), rest.logits[0].float()])
                out.update(teacher_result(sample, torch.log_softmax(logits, -1), logits.argmax(-1)))
        else:
            if teacher:
                full = model(input_ids=torch.tensor([sample.prompt + sample.answer]), use_cache=False,
                             **last_logits_kwargs(A + 1))
                logits = full.logits[0, :A].float()
                out.update(teacher_result(sample, torch.log_softmax(logits, -1), logits.argmax(-1)))
            if generate:
                pre = model(input_ids=torch.tensor([sample.prompt]), use_cache=True, **last_logits_kwargs(1))
                cache, last = output_cache(pre), pre.logits[0, -1].float()
        if generate:
            text, n = greedy(model, cache, last, sample, tokenizer, eos_id)
            pred = postprocess(text)
            out.update({"pred": pred, "generated": n, "match_all": match_all(pred, sample.refs),
                        "match_part": match_part(pred, sample.refs)})
    if "answer_logprob" in out and not math.isfinite(out["answer_logprob"]):
        out["answer_logprob"] = None
    return out
