"""A miniature of the demo (scripts/demo.py), end to end on CPU: a tiny random model from a config (64-token
context) instead of the tiny default, two methods (none and NTK x8), two eval lengths, two samples each, 2-step
fine-tunes without the DeepSpeed launcher. Every artifact is checked."""
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

    _, model_dir = make_tiny_model("qwen2", orig_ctx=64)
    out = tmp_path / "demo"
    res = run_demo(str(out), model=str(model_dir), methods=("none", "ntk"), scale=8, factors=(2, 4), samples=2,
                   max_new_tokens=12, pairs=12, heldout=4, launcher="python", train_lo=4, train_hi=8,
                   finetune_args=["--max-steps", "2", "--global-batch", "1", "--save-steps", "2"])
    printed = capsys.readouterr().out
    for k in range(1, 6):
        assert f"step {k}/5" in printed
    assert "$ python eval_summ.py generate --model" in printed  # every step shows its command
    assert "data_concat recall" in printed

    # fine-tuning data: packed recall samples of 4x-8x the 64-token context
    rows = load_packed(res["packed"])
    assert rows and all(256 <= r["length"] <= 512 for r in rows)
    # fine-tune + merge: each merged config carries its method, each run knows its training length
    train_length = {}
    for m, want in (("none", "none"), ("ntk", "ntk")):
        run = Path(res["merged"][m]).parent
        ft = json.loads((run / "run.json").read_text())
        assert ft["kind"] == "finetune" and ft["rope"]["method"] == want
        train_length[m] = ft["train"]["length"]  # the paper's Train Len.: the mean, with the range
        lens = [r["length"] for r in rows]
        assert train_length[m] == {"mean": round(sum(lens) / len(lens), 1), "min": min(lens), "max": max(lens)}
        merged = read_rope(AutoConfig.from_pretrained(res["merged"][m]))
        assert merged.method == want and (want == "none" or (merged.scale, merged.orig_ctx) == (8.0, 64))

    # eval sets: recall samples of at most T tokens whose references are copied from their inputs
    for t, p in res["evals"].items():
        recs = [json.loads(x) for x in Path(p).read_text(encoding="utf-8").splitlines()]
        assert len(recs) == 2
        for r in recs:
            n = len(tiny_tokenizer(r["context"], add_special_tokens=False)["input_ids"])
            assert n <= t and r["subset"] == f"T{t}"
            for line in r["summary"].split("\n"):
                assert line in r["context"]

    # generation: 3 models x 2 prompts x 2 lengths, each complete, with the right rope and prompt
    gen = Path(res["gen"])
    runs = sorted(p.parent for p in gen.glob("*/run.json"))
    assert len(runs) == 12
    expect = {"base": ("none", None), "ft-none": ("none", train_length["none"]),
              "ft-ntk-x8": ("ntk", train_length["ntk"])}
    means: dict = {}
    for rd in runs:
        name, prompt, sub = re.fullmatch(r"(.+)_(ft-ie|ft-ib)_(T\d+)", rd.name).groups()
        meta = json.loads((rd / "run.json").read_text())
        method, tl = expect[name]
        assert meta["status"] == "complete"
        assert meta["rope"]["method"] == method and meta["settings"]["prompt"] == prompt
        assert meta["settings"]["subset"] == sub and (meta["train"] or {}).get("length") == tl
        preds = [json.loads(x) for x in (rd / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
        assert len(preds) == 2 and all(p["new_tokens"] <= 12 for p in preds)
        scores = json.loads((rd / "scores.json").read_text())  # scored by the report step
        assert scores["n"] == 2
        means.setdefault((name, sub), []).append(scores["rouge_l"])

    # the extrapolation table: one row per model, a cell = the mean of its two prompts' run means (x100)
    table = (Path(res["report"]) / "extrapolation.md").read_text(encoding="utf-8")
    assert table.strip() in printed
    lines = [ln for ln in table.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    header, body = [c.strip() for c in lines[0].strip("|").split("|")], lines[1:]
    assert header[-2:] == ["T128", "T256"] and len(body) == 3
    cells_seen = sorted(tuple(c.strip() for c in ln.strip("|").split("|"))[-2:] for ln in body)
    want = sorted(tuple(f"{sum(means[(n, s)]) / 2:.2f}" for s in ("T128", "T256")) for n in expect)
    assert len(cells_seen) == len(want)
    for got, exp in zip(cells_seen, want):
        for g, e in zip(got, exp):
            assert abs(float(g) - float(e)) < 0.006
    for view in ("table2", "table7", "failure_modes"):
        assert (Path(res["report"]) / f"{view}.md").is_file()
    png = Path(res["fig"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
