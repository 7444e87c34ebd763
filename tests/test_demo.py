"""A miniature of the demo (scripts/demo.py), end to end on CPU: a tiny random model from a config (64-token
context) instead of the tiny default, two fine-tuned methods (none and NTK x8), one training-free one (NTK x8 at
load time), the base model with the F.1 baseline prompts, two eval lengths, two samples each, 2-step fine-tunes
without the DeepSpeed launcher. Every artifact is checked."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path


def test_demo_miniature(make_tiny_model, tiny_tokenizer, tmp_path, capsys):
    from ropescale.demo import run_demo

    _, model_dir = make_tiny_model("qwen2", orig_ctx=64)
    out = tmp_path / "demo"
    res = run_demo(out=str(out), model=str(model_dir), methods=("none", "ntk"), free=("ntk",), scale=8, factors=(8, 12),
                   samples=2, max_new_tokens=160, pairs=12, heldout=4, launcher="python", train_lo=4, train_hi=8,
                   finetune_args=["--max-steps", "2", "--global-batch", "1", "--save-steps", "2"])
    printed = capsys.readouterr().out
    for k in range(1, 7):
        assert f"step {k}/6" in printed
    assert "$ python eval_summ.py generate --model" in printed  # every step shows its command
    assert "data_concat recall" in printed and "python finetune.py merge" in printed
    train_length = _check_fine_tunes(res)
    _check_eval_sets(res, tiny_tokenizer)
    expect = {"base": ("none", None, ("ft-ie", "ft-ib")), "free-ntk-x8": ("ntk", None, ("ft-ie", "ft-ib")),
              "ft-none": ("none", train_length["none"], ("ft-ie", "ft-ib")),
              "ft-ntk-x8": ("ntk", train_length["ntk"], ("ft-ie", "ft-ib"))}
    means = _check_generation(res, expect, model_dir)
    _check_report(res, expect, means, printed)
    _check_demo_table(res, expect, means, printed, train_length)


def _check_fine_tunes(res) -> dict:
    """Fine-tuning data: packed recall samples of 4x-8x the 64-token context; each merged config carries its
    method, each run knows its training length (returned by method)."""
    from transformers import AutoConfig

    from data_concat import load_packed
    from rope_scaling import read_rope

    rows = load_packed(res["packed"])
    assert rows and all(256 <= r["length"] <= 512 for r in rows)
    train_length = {}
    for m, want in (("none", "none"), ("ntk", "ntk")):
        run = Path(res["merged"][m]).parent
        ft = json.loads((run / "run.json").read_text())
        assert ft["kind"] == "finetune" and ft["rope"]["method"] == want
        train_length[m] = ft["train"]["length"]  # the paper's Train Len.: the mean, with the range
        lens = [r["length"] for r in rows]
        assert train_length[m] == {"mean": round(sum(lens) / len(lens), 1), "min": min(lens), "max": max(lens)}
        # the positions the run trained (its coverage record): the longest query-key distance is inside a sample
        cov = ft["train"]["coverage"]
        assert 0 < cov["longest_distance"] < max(lens)
        merged = read_rope(AutoConfig.from_pretrained(res["merged"][m]))
        assert merged.method == want and (want == "none" or (merged.scale, merged.orig_ctx) == (8.0, 64))
    return train_length


def _check_eval_sets(res, tiny_tokenizer) -> None:
    """Eval sets: recall samples of at most T tokens whose references are copied from their inputs."""
    for t, p in res["evals"].items():
        recs = [json.loads(x) for x in Path(p).read_text(encoding="utf-8").splitlines()]
        assert len(recs) == 2
        for r in recs:
            n = len(tiny_tokenizer(r["context"], add_special_tokens=False)["input_ids"])
            assert n <= t and r["subset"] == f"T{t}"
            for line in r["summary"].split("\n"):
                assert line in r["context"]


def _check_generation(res, expect: dict, model_dir) -> dict:
    """Generation: 4 settings (base, NTK x8 at load time, two fine-tunes) x 2 F.2 prompts x 2 lengths, and the
    base model with the two F.1 prompts at the shortest length in a folder of its own; each complete, with the
    right rope and prompt. Returns each run's mean ROUGE-L by (folder, setting, length)."""
    means: dict = {}
    for gen, n_runs, names in ((Path(res["gen"]), 16, expect), (Path(res["gen_f1"]), 2, {"base": ("none", None,
                                                                                                      ("ie", "ib"))})):
        runs = sorted(p.parent for p in gen.glob("*/run.json"))
        assert len(runs) == n_runs
        for rd in runs:
            name, prompt, sub = re.fullmatch(r"(.+)_(ft-ie|ft-ib|ie|ib)_(T\d+)", rd.name).groups()
            meta = json.loads((rd / "run.json").read_text())
            method, tl, prompts = names[name]
            assert meta["status"] == "complete" and prompt in prompts
            assert meta["rope"]["method"] == method and meta["settings"]["prompt"] == prompt
            assert meta["settings"]["subset"] == sub and (meta["train"] or {}).get("length") == tl
            if name == "free-ntk-x8":  # applied at load time to the base model: no fine-tune
                assert meta["model"] == str(model_dir) and meta["rope"]["scale"] == 8.0
            preds = [json.loads(x) for x in (rd / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
            assert len(preds) == 2 and all(p["new_tokens"] <= 160 for p in preds)
            scores = json.loads((rd / "scores.json").read_text())  # scored by the report step
            assert scores["n"] == 2
            means.setdefault((gen.name, name, sub), []).append(scores["rouge_l"])
    return means


def _check_report(res, expect: dict, means: dict, printed: str) -> None:
    """The extrapolation table: one row per F.2 setting, a cell = the mean of its two prompts' run means (x100);
    the other views, the F.1 report and Fig. 3 are written."""
    table = (Path(res["report"]) / "extrapolation.md").read_text(encoding="utf-8")
    assert table.strip() in printed
    lines = [ln for ln in table.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    header, body = [c.strip() for c in lines[0].strip("|").split("|")], lines[1:]
    at = [header.index("T512"), header.index("T768")]
    assert header[at[1] + 1:] == ["effective length (85% of 1x)", "retention"] and len(body) == 4
    cells_seen = sorted(tuple(ln.strip("|").split("|")[i].strip() for i in at) for ln in body)
    want = sorted(tuple(f"{sum(means[('gen', n, s)]) / 2:.2f}" for s in ("T512", "T768")) for n in expect)
    for got, exp in zip(cells_seen, want):
        for g, e in zip(got, exp):  # a cell: "mean [lo, hi]"
            assert abs(float(g.split()[0]) - float(e)) < 0.006
    for view in ("table2", "table7", "failure_modes"):
        assert (Path(res["report"]) / f"{view}.md").is_file()
    assert (Path(res["report"]) / "baseline_prompts" / "table2.md").is_file()  # the F.1 runs: a report of their own
    png = Path(res["fig"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def _check_demo_table(res, expect: dict, means: dict, printed: str, train_length: dict) -> None:
    """The demo table: floor, then one row per setting (+ the F.1 row), with reach, losses and the same cells."""
    demo = json.loads((Path(res["report"]) / "demo.json").read_text(encoding="utf-8"))
    # the settings the run was given, recorded by their flags' keys (the chapters: the shared novels by default)
    from ropescale.common.paths import CHAPTERS_JSONL

    rec = demo["settings"]
    assert rec["methods"] == ["none", "ntk"] and rec["free"] == ["ntk"] and rec["factors"] == [8, 12]
    assert (rec["samples"], rec["pairs"], rec["heldout"], rec["launcher"], rec["seed"]) == (2, 12, 4, "python", 0)
    assert rec["finetune_args"] == ["--max-steps", "2", "--global-batch", "1", "--save-steps", "2"]
    assert rec["chapters"] == str(CHAPTERS_JSONL) and rec["baseline_prompts"] is True and rec["fresh"] is False
    assert Path(rec["out"]) == Path(res["report"]).parent
    assert (Path(res["report"]) / "demo.md").read_text(encoding="utf-8").strip().splitlines()[-1] in printed
    by_key = {r.get("key", "floor"): r for r in demo["rows"]}
    assert list(by_key) == ["floor", "base", "base-f1", "free-ntk-x8", "ft-none", "ft-ntk-x8"]
    for key in expect:
        for s in ("T512", "T768"):
            assert abs(by_key[key]["cells"][s] - sum(means[("gen", key, s)]) / 2) < 1e-6
    # the F.1 prompts run at 1x only (here, with no length inside the 64-token context, at the shortest)
    assert abs(by_key["base-f1"]["cells"]["T512"] - sum(means[("gen_f1", "base", "T512")]) / 2) < 1e-6
    assert by_key["base-f1"]["cells"]["T768"] is None
    # the bound: 64 for the unscaled model; NTK x8 on head_dim 16 / base 1e4 / 64 tokens at load time: pairs with
    # wavelength 2*pi*1e4^(i/8) > 64 are i >= 3 (i = 2: 62.8); the bound is 64 * 8^(2*3/14) (see test_rope_reach);
    # a fine-tune that trained distances up to L >= 156 tokens (samples of 256-512) lifts both fine-tuned rows'
    # bounds to L (see test_row_bound_is_fine_tune_aware)
    assert by_key["base"]["bound"] == 64 and by_key["base"]["rule"] == "reach"
    assert abs(by_key["free-ntk-x8"]["bound"] - 64 * 8 ** (6 / 14)) < 1e-6
    for key, m in (("ft-none", "none"), ("ft-ntk-x8", "ntk")):
        # the bound reads the run's longest trained distance (coverage), not the data set's longest sample
        cov = json.loads((Path(res["merged"][m]).parent / "run.json").read_text())["train"]["coverage"]
        assert abs(by_key[key]["bound"] - cov["longest_distance"]) < 1e-6
        assert by_key[key]["rule"] == "finetune_bound"
        assert by_key[key]["pretrain"] == (64 if m == "none" else by_key["free-ntk-x8"]["bound"])
    # every cell carries n (its eval samples, each under both prompts) and an interval around its mean; IE - IB
    # with its sign-flip p (2 pairs: p is 1 or 1/2 by hand), the MSE floor and permutation p, every sample's scores
    for key in expect:
        row = by_key[key]
        for s in ("T512", "T768"):
            assert row["n"][s] == 2 and row["ci"][s][0] <= row["cells"][s] + 1e-9 <= row["ci"][s][1] + 2e-9
            assert row["ie_minus_ib"][s]["n_pairs"] == 2 and row["ie_minus_ib"][s]["p"] in (0.5, 1.0)
            ie, ib = row["samples"][s]["IE"], row["samples"][s]["IB"]
            assert len(ie) == len(ib) == 2
            assert abs((sum(ie.values()) + sum(ib.values())) / 4 - row["cells"][s]) < 1e-6
        assert row["mse_floor"] is not None and set(row["effective_length"]) == {"relative", "absolute"}
        assert 0 < row["mse_p"] <= 1 and 0 <= row["mse_p_red"] <= 1
    # table C: each method at load time against the base, each fine-tune against its method at load time, the F.1
    # prompts against the F.2 ones; a difference is the mean of the per-sample differences
    comps = {c["label"]: c for c in demo["comparisons"]}
    assert [c["b"] for c in demo["comparisons"]][:4] == ["floor"] * 4  # every F.2 row against the floor first
    assert list(comps)[4:] == ["ntk x8 at load time - base", "fine-tuned ntk x8 - ntk x8 at load time",
                               "base, F.1 - F.2 prompts"]
    vs_floor = demo["comparisons"][0]["cells"]["T768"]  # the base row - the floor, on the same samples
    assert abs(vs_floor["mean"] - (by_key["base"]["cells"]["T768"] - by_key["floor"]["cells"]["T768"])) < 1e-6
    c = comps["ntk x8 at load time - base"]["cells"]["T768"]
    assert abs(c["mean"] - (by_key["free-ntk-x8"]["cells"]["T768"] - by_key["base"]["cells"]["T768"])) < 1e-6
    assert c["n"] == 2 and c["p"] in (0.5, 1.0)
    assert set(comps["base, F.1 - F.2 prompts"]["cells"]) == {"T512"}
    assert by_key["base"]["retention"] == (1.0 if by_key["base"]["cells"]["T512"] > 0 else None)  # of 0: none
    # the fine-tunes' losses come from their train logs; 2 steps of a random model: answer loss above 1 nat
    for key, m in (("ft-none", "none"), ("ft-ntk-x8", "ntk")):
        log = [json.loads(x) for x in (Path(res["merged"][m]).parent / "train_log.jsonl").read_text().splitlines()]
        assert by_key[key]["loss_step1"] == log[0]["loss"] and by_key[key]["steps"] == 2
        assert by_key[key]["loss_above"] is True
        assert by_key[key]["train_length"] == train_length[m]  # the merged model's training record: the mean
    # the floor: an answer of the four marks alone, scored against each eval set's references
    from ropescale.common.rouge import rouge_l

    for t, p in res["evals"].items():
        refs = [json.loads(x)["summary"] for x in Path(p).read_text(encoding="utf-8").splitlines()]
        want_floor = 100 * sum(rouge_l("【1】\n【2】\n【3】\n【4】", r) for r in refs) / len(refs)
        assert abs(by_key["floor"]["cells"][f"T{t}"] - want_floor) < 1e-9 and want_floor > 5


def test_row_bound_is_fine_tune_aware(make_tiny_model):
    """The demo's row bound on a hand-worked case: NTK x8 on head_dim 16, base 1e4, a 64-token context. Pair i turns
    theta_i = 1e4^(-i/8) per token, theta'_i = b'^(-i/8) under NTK (b' = 1e4 * 8^(16/14): theta_i / theta'_i =
    8^(2i/14)). Pre-training saw pair i up to the angle 64 theta_i, < 2*pi for i >= 3; a fine-tune on distances up to
    L adds L theta'_i. The bound is min over the pairs still short of a full turn of max(64 theta_i, L theta'_i) /
    theta'_i = max(64 * 8^(2i/14), L) (pairs 0-2 saw a full turn: 64 theta_2 = 6.4 > 2*pi): at L = 100 the pre-training
    term of pair 3 (64 * 8^(6/14) = 156.0) still binds; at L = 300 the fine-tune's length does."""
    from rope_scaling import RopeSpec
    from ropescale.demo import row_bound

    _, model_dir = make_tiny_model("qwen2", orig_ctx=64)
    pre = 64 * 8 ** (6 / 14)
    free = row_bound(str(model_dir), RopeSpec("ntk", scale=8))
    assert abs(free["bound"] - pre) < 1e-9 and free["rule"] == "reach"
    # Liu et al.'s closed form: d_extra = 2 ceil(8 log_1e4(64 / 2pi)) = 6, T_extra = 2 pi b'^(6/16)
    assert abs(free["liu"] - 2 * math.pi * (1e4 * 8 ** (16 / 14)) ** (6 / 16)) < 1e-6
    for rec, want in (({"length": {"max": 100}}, pre), ({"length": {"max": 300}}, 300.0),
                      ({"length": {"max": 300}, "coverage": {"longest_distance": 250}}, 250.0)):
        got = row_bound(str(model_dir), RopeSpec("ntk", scale=8), rec)
        assert abs(got["bound"] - want) < 1e-9 and got["rule"] == "finetune_bound" and got["liu"] is None
        assert abs(got["pretrain"] - pre) < 1e-9


def test_generate_once_reuses_only_a_complete_run(tmp_path, monkeypatch):
    """The scripts built on the demo regenerate a run unless its run.json says complete (a partial or missing one
    runs again, through the demo's own generate step)."""
    from ropescale.demo import steps

    ran = []
    monkeypatch.setattr(steps, "generate_run", lambda d, model, flags, pr, tg, out: ran.append(out.name) or out)
    for name, status in (("complete", "complete"), ("partial", "partial"), ("missing", None)):
        out = tmp_path / name
        if status:
            out.mkdir()
            (out / "predictions.jsonl").write_text("{}\n", encoding="utf-8")
            (out / "run.json").write_text(json.dumps({"status": status}), encoding="utf-8")
        assert steps.generate_once(None, "m", (), "ft-ie", 512, out) == out
    assert ran == ["partial", "missing"]


def test_over_seeds_times_each_seed_and_keeps_stdout_for_results(capsys):
    """Each seed's work runs with its stdout sent to stderr (the echoed commands are logs), its record gets its
    seconds before ``then`` sees it, and the seeds come in the order given."""
    from ropescale.demo import over_seeds

    seen, said = [], []

    def one(seed):
        print(f"$ step of seed {seed}")
        return {"seed": seed}

    recs = over_seeds("3,,1", one, said.append, lambda s, rec: seen.append((s, "seconds" in rec)))
    out, err = capsys.readouterr()
    assert out == "" and err == "$ step of seed 3\n$ step of seed 1\n"
    assert [r["seed"] for r in recs] == [3, 1] and all(r["seconds"] >= 0 for r in recs)
    assert seen == [(3, True), (1, True)] and said == ["seed 3: 0 s", "seed 1: 0 s"]


def test_flags_and_recipe_make_the_demo_settings(tmp_path, monkeypatch):
    """The demo's command line reads every flag into one DemoSettings (defaults < --recipe < flags), the values as
    the old argparse code split them: comma lists, the fine-tune's flags as a shell splits them."""
    import shlex

    from ropescale.common.settings import from_args
    from ropescale.demo.cli import parser
    from ropescale.demo.steps import DemoSettings

    st = from_args(parser().parse_args([]))
    assert st == DemoSettings() and (st.out, st.model, st.scale, st.samples, st.pairs) == ("runs/demo", "tiny", 8, 16,
                                                                                          256)
    assert (st.methods, st.free, st.factors) == (["ntk", "yarn"], ["pi", "ntk", "yarn"], [1, 2, 4, 8])
    assert (st.max_new_tokens, st.launcher, st.finetune_args, st.seed) == (128, "deepspeed", [], 0)
    assert st.baseline_prompts is True and st.fresh is False
    ft = "--max-steps 1 --global-batch 1 --save-steps 1 --lr '1e-3'"
    argv = ["--out", "D", "--methods", "none,pi", "--free", "", "--factors", "1,2.5", "--samples", "2",
            "--finetune-args", ft, "--launcher", "python", "--no-baseline-prompts", "--fresh", "--seed", "3"]
    st = from_args(parser().parse_args(argv))
    assert (st.out, st.methods, st.free, st.factors, st.samples, st.seed) == ("D", ["none", "pi"], [], [1, 2.5], 2, 3)
    assert st.finetune_args == shlex.split(ft) and st.launcher == "python"
    assert st.baseline_prompts is False and st.fresh is True
    recipe = tmp_path / "demo.yaml"
    recipe.write_text("samples: 4\nfinetune_args: [--max-steps, '2']\ntrain_lo: 1.5\n", encoding="utf-8")
    st = from_args(parser().parse_args(["--recipe", str(recipe), "--samples", "5"]))
    assert (st.samples, st.finetune_args, st.train_lo) == (5, ["--max-steps", "2"], 1.5)


def test_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys):
    """A value a flag refuses, an unknown method or a bad recipe line: exit code 2 before anything runs."""
    from ropescale.demo.cli import main

    recipe = tmp_path / "demo.yaml"
    recipe.write_text("out: x\nsampels: 4\n", encoding="utf-8")
    for argv, want in ((["--samples", "0"], "error: --samples must be >= 1, got 0"),
                       (["--methods", "ntk,nope", "--out", str(tmp_path / "o")], "unknown RoPE method 'nope'"),
                       (["--recipe", str(recipe)], f"{recipe}:2: unknown recipe key 'sampels'")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert want in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_the_script_is_a_thin_entry_point():
    """scripts/demo.py only calls ``python -m ropescale.demo``'s main: at most 40 lines, no sys.path change, and
    the same help (its usage naming demo.py) at most 100 lines at 80 columns."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    text = (root / "scripts" / "demo.py").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 40 and not re.search(r"sys\.path\.(insert|append)|sys\.path\s*=", text)
    env = dict(os.environ, COLUMNS="80")
    helps = [subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=True).stdout
             for cmd in ([sys.executable, "scripts/demo.py", "--help"], [sys.executable, "-m", "ropescale.demo", "-h"])]
    assert helps[0].startswith("usage: demo.py [-h] [--out OUT]") and len(helps[0].splitlines()) <= 100
    assert helps[1].startswith("usage: python -m ropescale.demo [-h]")
    for flag in ("--out", "--methods", "--free", "--factors", "--finetune-args", "--no-baseline-prompts", "--fresh",
                 "--launcher {deepspeed,python}", "--recipe FILE", "step 1"):
        assert flag in helps[0] and flag in helps[1], flag
