"""A miniature of the demo (scripts/demo.py), end to end on CPU: a tiny random model from a config (64-token
context) instead of the cached tiny default, NTK x8, two eval lengths, two samples each, a 2-step fine-tune
without the DeepSpeed launcher. Every artifact is checked."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_miniature(make_tiny_model, tiny_tokenizer, tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    from demo import run_demo
    from transformers import AutoConfig

    from data_concat import load_packed
    from rope_scaling import read_rope
    from common import subsets

    _, model_dir = make_tiny_model("qwen2", orig_ctx=64)
    out, train = tmp_path / "demo", tmp_path / "train"
    res = run_demo(str(out), model=str(model_dir), rope="ntk", scale=8, factors=(1, 4), samples=2, max_new_tokens=12,
                   max_pairs=40, launcher="python", train_dir=str(train),
                   finetune_args=["--max-steps", "2", "--global-batch", "1", "--save-steps", "2"])
    printed = capsys.readouterr().out
    for k in range(1, 7):
        assert f"step {k}/6" in printed
    assert "$ python eval_summ.py generate --model" in printed  # every step shows its command

    # fine-tuning data: packed samples of 2x-8x the 64-token context
    rows = load_packed(res["packed"])
    assert rows and all(128 <= r["length"] <= 512 for r in rows)
    # fine-tune + merge: the merged config carries NTK x8, the run knows its training length
    ft = json.loads((train / "run.json").read_text())
    assert ft["kind"] == "finetune" and ft["rope"]["method"] == "ntk" and ft["rope"]["scale"] == 8
    merged = read_rope(AutoConfig.from_pretrained(res["merged"]))
    assert (merged.method, merged.scale, merged.orig_ctx) == ("ntk", 8.0, 64)
    assert ft["train_length"] == max(r["length"] for r in rows)

    # eval sets: CNNSum-style samples in each target's range (L's relative range scaled down)
    for t, p in res["evals"].items():
        lo, hi = subsets.scaled(t).range
        recs = [json.loads(x) for x in Path(p).read_text(encoding="utf-8").splitlines()]
        assert len(recs) == 2
        for r in recs:
            n = len(tiny_tokenizer(r["context"], add_special_tokens=False)["input_ids"])
            assert lo <= n <= hi and r["summary"]

    # generation: 3 models x 2 prompts x 2 lengths, each complete, with the right rope and prompt
    gen = Path(res["gen"])
    runs = sorted(p.parent for p in gen.glob("*/run.json"))
    assert len(runs) == 12
    expect = {"base": ("none", {"ie", "ib"}, None), "base-ntk-x8": ("ntk", {"ie", "ib"}, None),
              "ft-ntk-x8": ("ntk", {"ft-ie", "ft-ib"}, ft["train_length"])}
    means: dict = {}
    for rd in runs:
        name, prompt, sub = re.fullmatch(r"(.+)_(ie|ib|ft-ie|ft-ib)_(T\d+)", rd.name).groups()
        meta = json.loads((rd / "run.json").read_text())
        method, prompts_, tl = expect[name]
        assert meta["status"] == "complete" and meta["counts"]["done"] == 2
        assert meta["rope"]["method"] == method and prompt in prompts_ and meta["prompt"] == prompt
        assert meta["subset"] == sub and meta["train_length"] == tl
        preds = [json.loads(x) for x in (rd / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
        assert len(preds) == 2 and all(10 <= p["new_tokens"] <= 12 for p in preds)
        scores = json.loads((rd / "scores.json").read_text())  # scored by the report step
        assert scores["n"] == 2
        means.setdefault((name, sub), []).append(scores["rouge_l"])

    # the extrapolation table: one row per model setting, a cell = the mean of its two prompts' run means
    table = (Path(res["report"]) / "extrapolation.md").read_text(encoding="utf-8")
    assert table.strip() in printed
    lines = [ln for ln in table.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    header, body = [c.strip() for c in lines[0].strip("|").split("|")], lines[1:]
    assert header[-2:] == ["T64", "T256"] and len(body) == 3
    row_of = {"none": "base", "ntk": None}
    for ln in body:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        name = row_of[cells[1]] or ("ft-ntk-x8" if cells[3] not in ("-", "") else "base-ntk-x8")
        for sub, cell in zip(("T64", "T256"), cells[-2:]):
            vals = means[(name, sub)]
            assert abs(float(cell) - sum(vals) / len(vals)) < 0.006
    for view in ("table2", "table7", "failure_modes"):
        assert (Path(res["report"]) / f"{view}.md").is_file()
    png = Path(res["fig"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
