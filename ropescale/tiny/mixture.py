"""The windows the tiny default is pretrained on, and the pretraining loop."""
from __future__ import annotations

import math
import random
import sys
import time
from typing import Sequence

from ropescale.common.io import InputError


class Mixture:
    """The windows the tiny default is pretrained on, drawn with one seeded RNG.

    Phase 1 (the first ``short_steps`` steps): ``short_batch`` windows of ``short_len`` tokens: half are random
    token sequences of 4 to a quarter of the window (at most 64) tokens, each repeated 2-4 times (nothing but looking
    back predicts them), a quarter are novel passages repeated after a short gap, a quarter plain text. On short
    windows the induction heads (attend to the token after an earlier occurrence of the current one, copy it) form
    within a few hundred steps; on 512-token windows of text they did not form in 1,500 (measured while designing this
    build).

    Phase 2: ``batch_size`` windows of ``orig_ctx`` tokens:
    - **recall** (``p_task``): a recall sample (ropescale.common.recall: sentences marked 【k】, the marked sentences
      as the answer) of random length, rendered with an Appendix F.2 prompt (ft-ie or ft-ib) + answer + EOS, the rest
      of the window novel text: the task the demo measures, learned inside the original context;
    - **copy** (``p_copy``): novel passages of 20-150 tokens each repeated exactly after a gap of up to 120 tokens;
    - **synthetic** (``p_synth``): repeated random-token sequences, as in phase 1;
    - otherwise plain novel text.
    """

    def __init__(self, spec, tok, train_ids: Sequence[int], sources, seed: int):
        self.spec, self.tok, self.ids, self.sources = spec, tok, train_ids, sources
        self.rng = random.Random(seed)
        self.eos = tok.eos_token_id
        self.vocab = len(tok)

    def text(self, n: int) -> list[int]:
        if n <= 0:
            return []
        s = self.rng.randrange(len(self.ids) - n - 1)
        return list(self.ids[s:s + n])

    def synthetic(self, n: int) -> list[int]:
        w: list[int] = []
        while len(w) < n:
            r = [self.rng.randrange(1, self.vocab) for _ in range(self.rng.randint(4, max(4, min(64, n // 4))))]
            w += r * self.rng.randint(2, 4)
        return w[:n]

    def copy(self, n: int, longest: int = 150, gap: int = 120) -> list[int]:
        w: list[int] = []
        while len(w) < n:
            a = self.text(self.rng.randint(min(20, longest), longest))
            w += a + self.text(self.rng.randint(0, gap)) + a
        return w[:n]

    def recall(self, n: int) -> list[int]:
        from ropescale.common import prompts
        from ropescale.common.recall import build

        rng = self.rng
        hi = n - 150  # room for the prompt (~40 tokens) and the answer; shrunk when a sample does not fit
        for _ in range(200):
            src = self.sources[rng.randrange(len(self.sources))]
            ex = build(src, rng.randrange(len(src)), rng.randint(min(n // 4, hi), hi), rng)
            if ex is None:
                continue
            prompt = prompts.render(ex["context"], rng.choice(("ft-ie", "ft-ib")))
            ids = self.tok(prompt + ex["summary"], add_special_tokens=False)["input_ids"] + [self.eos]
            if len(ids) <= n:
                return ids + self.text(n - len(ids))
            hi = max(32, int(hi * 0.8))
        raise InputError(f"recall samples do not fit in {n}-token windows with this tokenizer")

    def short(self, n: int) -> list[int]:
        r = self.rng.random()
        if r < 0.5:
            return self.synthetic(n)
        if r < 0.75:
            return self.copy(n, longest=n // 3, gap=n // 4)
        return self.text(n)

    def window(self, n: int) -> list[int]:
        sp, r = self.spec, self.rng.random()
        if r < sp.p_synth:
            return self.synthetic(n)
        r = self.rng.random()
        if r < sp.p_task:
            return self.recall(n)
        if r < sp.p_task + sp.p_copy:
            return self.copy(n)
        return self.text(n)

    def batch(self, step: int) -> list[list[int]]:
        sp = self.spec
        if step < sp.short_steps:
            return [self.short(sp.short_len) for _ in range(sp.short_batch)]
        return [self.window(sp.orig_ctx) for _ in range(sp.batch_size)]


def pretrain(model, mixture: Mixture, *, lr: float, steps: int, warmup: int, seed: int, on_eval=None,
             eval_every: int = 0) -> list[dict]:
    """Next-token pretraining on ``mixture`` windows for a fixed number of steps (AdamW, linear warm-up, cosine
    decay to 10%). Deterministic for a seed and thread count on a given machine. Returns the log."""
    import torch
    from tqdm import tqdm

    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    hist: list[dict] = []
    t0 = time.time()
    ema = None
    for step in tqdm(range(steps), desc="pretrain tiny", unit="step", file=sys.stderr, leave=False):
        cur_lr = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = cur_lr
        x = torch.tensor(mixture.batch(step))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        cur = loss.item()
        ema = cur if ema is None else 0.95 * ema + 0.05 * cur
        if step % 50 == 0 or step == steps - 1:
            hist.append({"step": step, "loss": round(cur, 4), "loss_ema": round(ema, 4),
                         "seconds": round(time.time() - t0, 1)})
        if on_eval and eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            model.eval()
            hist.append({"step": step + 1, **on_eval(model)})
            model.train()
    model.eval()
    return hist
