"""What a tiny build can do, measured on the chapters it held out: perplexity, the copy effect, recall ROUGE-L."""
from __future__ import annotations

import math
import random
from typing import Sequence

from ropescale.common.io import InputError


def windows(ids: Sequence[int], length: int, n: int, seed: int) -> list[list[int]]:
    """``n`` evenly spaced windows of ``length`` tokens (deterministic; ``seed`` shifts the grid)."""
    span = len(ids) - length - 1
    if span <= 0:
        raise InputError(f"text too short for {length}-token windows ({len(ids)} tokens)")
    off = random.Random(seed).randrange(max(1, span // max(n, 1)))
    step = max(1, span // max(n, 1))
    return [list(ids[s:s + length]) for s in range(off, span, step)][:n]


def perplexity(model, batches: Sequence[Sequence[int]], batch_size: int = 8) -> float:
    """exp(mean next-token NLL) of ``model`` over token windows."""
    import torch

    model.eval()
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(batches), batch_size):
            x = torch.tensor(batches[i:i + batch_size])
            logits = model(input_ids=x).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                     x[:, 1:].reshape(-1), reduction="sum")
            tot += float(loss)
            cnt += x[:, 1:].numel()
    return math.exp(tot / max(cnt, 1))


def copy_effect(model, held_ids: Sequence[int], *, seq_len: int, span: int = 64, n: int = 16,
                seed: int = 0) -> dict:
    """Loss (nats/token) on a ``span``-token passage at the end of a held-out window, with the passage pasted
    earlier in the window (at least 128 tokens before it) vs the intact window: copying shows as a lower loss."""
    import torch

    rng = random.Random(seed)
    span, gap = min(span, seq_len // 4), min(128, seq_len // 4)
    with_copy, without = 0.0, 0.0
    with torch.no_grad():
        for w in windows(held_ids, seq_len, n, seed):
            dst = seq_len - span
            src = rng.randrange(0, dst - span - gap + 1)
            pasted = list(w)
            pasted[src:src + span] = w[dst:dst + span]
            for seq, acc in ((w, 0), (pasted, 1)):
                x = torch.tensor([seq])
                lg = model(input_ids=x).logits[0, dst - 1:seq_len - 1].float()
                loss = float(torch.nn.functional.cross_entropy(lg, x[0, dst:]))
                if acc:
                    with_copy += loss / n
                else:
                    without += loss / n
    return {"copy_loss": round(with_copy, 4), "nocopy_loss": round(without, 4)}


def recall_score(model, tok, samples: Sequence[dict], prompt: str = "ft-ie", max_new_tokens: int = 160) -> float:
    """Mean CNNSum ROUGE-L (x100) of greedy answers to recall samples (ropescale.common.recall) with an F.2 prompt."""
    import torch

    from ropescale.common import prompts
    from ropescale.common.rouge import cnnsum_rouge_l

    scores = []
    with torch.no_grad():
        for ex in samples:
            ids = tok(prompts.render(ex["context"], prompt), add_special_tokens=False)["input_ids"]
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
            pred = tok.decode(out[0, len(ids):], skip_special_tokens=True)
            scores.append(100 * cnnsum_rouge_l(pred, ex["summary"]))
    return round(sum(scores) / max(len(scores), 1), 2)
