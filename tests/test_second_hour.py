"""A researcher's second hour: what the README promises works as written, plots never contradict their tables,
training shows its curves. (The README's and docs' commands themselves run in tests/test_readme.py.)"""
from __future__ import annotations

import json
import shlex
import statistics
from pathlib import Path

import pytest

from ropescale.common.io import InputError

ROOT = Path(__file__).resolve().parent.parent


def _one_line(capsys, rc, *what) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err[-30:]
    assert len(err) == 1 and err[0].startswith("error: "), err[-30:]
    for w in what:
        assert w in err[0], err
    return err[0]


@pytest.fixture(scope="module")
def model_dir(make_tiny_model):
    return make_tiny_model("qwen2", orig_ctx=64, seed=5)[1]


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("evaldata") / "eval.jsonl"
    p.write_text("".join(json.dumps({"id": f"s{i}", "context": "一段很短的文字。" * 3, "summary": "摘要"},
                                    ensure_ascii=False) + "\n" for i in range(2)), encoding="utf-8")
    return p


def _generate(model_dir, eval_file, out, *extra):
    return ["generate", "--model", str(model_dir), "--data", str(eval_file), "--prompt", "ie", "--max-new-tokens",
            "2", "--out", str(out), *extra]


@pytest.fixture
def no_model_load(monkeypatch):
    import transformers

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the --out check")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(boom))


# ---------------------------------------------------------------- 1. --resume auto|never, the same everywhere
def _parsers():
    """(name, the parser of each stage that writes a run directory)."""
    from rope_scaling.__main__ import TOOL as rope
    from ropescale.evaluation.cli import TOOL as evaluation
    from ropescale.probes.cli import TOOL as probes
    from ropescale.training.cli import TOOL as finetune

    def sub(tool, name):
        import argparse

        return next(a for a in tool.parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[name]

    return {"finetune": sub(finetune, "train"), "generate": sub(evaluation, "generate"), "run": sub(evaluation, "run"),
            "search": sub(rope, "search"), **{f"probes {p}": sub(probes, p) for p in
                                             ("ppl", "suffix-id", "perturb", "copy", "shuffle")}}


def test_every_stage_that_writes_a_run_takes_resume_auto_and_never_in_the_same_words():
    from ropescale.common.runs.resume import RESUME_HELP

    defaults = {}
    for name, p in _parsers().items():
        (act,) = [a for a in p._actions if "--resume" in a.option_strings]
        assert RESUME_HELP in act.help, name
        defaults[name] = act.default
        assert {v: act.type(v) for v in ("auto", "never")} == {"auto": "auto", "never": "never"}, name
    assert {k for k, v in defaults.items() if v == "never"} == {"finetune", "search"}
    assert all(v == "auto" for k, v in defaults.items() if k not in ("finetune", "search"))


def test_generate_and_run_resume_auto_continue_and_never_refuses(model_dir, eval_file, tmp_path, capsys):
    """The README's "resumable (--resume auto)" was refused by generate, run and the probes (unrecognized
    arguments)."""
    from ropescale.evaluation.cli import main

    out = tmp_path / "gen"
    assert main(_generate(model_dir, eval_file, out, "--resume", "never", "--json")) == 0  # nothing there yet
    assert json.loads(capsys.readouterr().out)["generated"] == 2
    assert main(_generate(model_dir, eval_file, out, "--resume", "auto", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["generated"] == 0  # continued: every id done already
    before = (out / "predictions.jsonl").read_bytes()
    _one_line(capsys, main(_generate(model_dir, eval_file, out, "--resume", "never")), str(out),
              "already holds a generate run", "--resume auto continues it")
    _one_line(capsys, main(["run", "--model", str(model_dir), "--data", str(eval_file), "--prompt", "ie",
                            "--max-new-tokens", "2", "--out", str(out), "--resume", "never"]), "--resume auto")
    assert (out / "predictions.jsonl").read_bytes() == before


def test_probes_resume_never_refuses_before_the_model_loads(tmp_path, capsys, no_model_load):
    from ropescale.common.runs.record import RunDir
    from ropescale.probes.cli import main

    out = tmp_path / "ppl"
    RunDir(out).path.mkdir()
    RunDir(out).write_meta({"kind": "probe", "probe": "ppl", "status": "complete"})
    assert main(["ppl", "--out", str(out), "--resume", "never"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"error: {out}: already holds a probe run (complete): --resume auto continues it (the same settings "
                   "only), or use another --out")


def test_finetune_resume_auto_starts_a_run_where_there_is_none_and_never_refuses_one(model_dir, tmp_path):
    from rope_scaling import RopeSpec
    from ropescale.common.runs.locks import release_run_dirs
    from ropescale.common.runs.record import RunDir
    from ropescale.common.settings import make
    from ropescale.training.config import TrainSettings
    from ropescale.training.run import plan_run

    s = make(TrainSettings, model=str(model_dir), out=str(tmp_path / "new"), rope=RopeSpec("ntk", 2.0))
    try:
        run = plan_run(s, recipe=None, resume="auto", overwrite=False)
        assert run.resume is None and run.old is None and run.resume_from is None  # a new run
        RunDir(tmp_path / "old").path.mkdir()
        RunDir(tmp_path / "old").write_meta({"kind": "finetune", "status": "done"})
        with pytest.raises(InputError, match="already holds a finetune run.*--resume auto"):
            plan_run(make(TrainSettings, s, out=str(tmp_path / "old")), recipe=None, resume="never", overwrite=False)
    finally:
        release_run_dirs()


# ---------------------------------------------------------------- 3. Fig. 3 plots what its table says
def _hand_report(values: dict[str, list[float]], start: int = 500):
    """A report of one row (one setting, Prompt-IE) whose samples are ``values`` per column (T512...)."""
    from ropescale.common.tables import Setting
    from ropescale.evaluation.report.model import RunResult, assemble

    samples = [{"id": f"{c}-{i}", "subset": c, "input_tokens": start * 2 ** k + i, "rouge_l": v}
               for k, (c, vs) in enumerate(values.items()) for i, v in enumerate(vs)]
    return assemble([], [RunResult(Path("run"), Setting("tiny", None), "IE", {"subset": None}, samples)])


def _drawn(fig):
    """Every line of the figure: (x, y) data, label."""
    return [(list(ln.get_xdata()), list(ln.get_ydata()), ln.get_marker()) for ax in fig.axes for ln in ax.get_lines()]


def test_fig3_plots_each_columns_mean_and_interval_as_the_table_has_them():
    """12 samples, 3 a length: the old moving median (window 15, wider than the line) drew the median of all 12 --
    near 4 -- at every length, although the T512 column averages 77.3. Each column's mean is drawn now."""
    from ropescale.evaluation.report.plot import fig3_figure, series_from_runs
    from ropescale.evaluation.report.render import render

    values = {"T512": [90.0, 80.0, 62.0], "T1024": [5.0, 7.0, 3.0], "T2048": [4.0, 6.0, 5.0], "T4096": [2.0, 1.0, 3.0]}
    rep = _hand_report(values)
    fig = fig3_figure(series_from_runs(rep.runs, rep), window=15)
    means = [statistics.mean(v) for v in values.values()]
    lines = _drawn(fig)
    (points,) = [ln for ln in lines if ln[2] == "o"]  # the means' markers (the error bars' caps are other lines)
    assert points[1] == pytest.approx(means)  # 77.33, 5, 5, 2: the table's cells
    assert points[0] == pytest.approx([501, 1001, 2001, 4001])  # at each column's mean input length
    assert [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()] == ["tiny (n=3 per point)"]
    assert all(len(ln[1]) <= 4 or len(set(ln[1])) > 1 for ln in lines)  # no flat median over the whole line
    t7 = json.loads(render(rep, "json", "table7"))[0]
    assert [t7["values"][c] for c in values] == pytest.approx(means, abs=1e-4)
    # the error bars are the table's intervals: with 3 samples, the 2.5 / 97.5 % bootstrap quantiles
    from matplotlib.collections import LineCollection

    segs = [c for ax in fig.axes for c in ax.collections if isinstance(c, LineCollection)]
    bars = [y for s in segs[0].get_segments() for y in (s[0][1], s[1][1])]
    assert bars == pytest.approx([y for c in values for y in t7["ci"][c]], abs=1e-3)
    caption = [t.get_text() for t in fig.texts]
    assert any("No moving median where a column has fewer than 15 samples" in t for t in caption)


def test_fig3_smooths_only_where_every_column_has_the_window():
    from ropescale.evaluation.report.plot import fig3_figure, series_from_runs

    values = {"T512": [float(v) for v in range(20)], "T1024": [float(v) for v in range(20, 40)]}
    rep = _hand_report(values)
    fig = fig3_figure(series_from_runs(rep.runs, rep), window=15)
    medians = [ln for ln in _drawn(fig) if len(ln[1]) == 40]
    assert len(medians) == 1  # 20 samples a column >= 15: the moving median is drawn through the 40 dots
    assert medians[0][1][0] == statistics.median(range(8)) and medians[0][1][-1] == statistics.median(range(32, 40))


def test_probe_tables_carry_n_and_intervals_in_every_format(tmp_path):
    from ropescale.evaluation.report.intake import load_probe_runs
    from ropescale.evaluation.report.probes import render_probes

    d = tmp_path / "p"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"kind": "probe", "probe": "ppl", "model": "tiny",
                                            "rope": {"method": "none", "scale": 1.0}, "lengths": [512],
                                            "metric": "loss", "column": "N"}))
    vals = [1.0, 2.0, 3.0, 6.0]
    (d / "items.jsonl").write_text("".join(json.dumps({"id": f"i{k}", "group": "", "col": 512, "value": v}) + "\n"
                                           for k, v in enumerate(vals)))
    runs = load_probe_runs([tmp_path])
    md, js = render_probes(runs, "md"), json.loads(render_probes(runs, "json"))[0]
    lo, hi = js["ci"][0][-1]
    # 4 items: the t interval of the mean (no percentile bootstrap below 8), as scipy's one-sample t test gives it
    from scipy.stats import ttest_1samp

    ci = ttest_1samp(vals, 0.0).confidence_interval()
    assert lo == pytest.approx(ci.low, abs=1e-9) and hi == pytest.approx(ci.high, abs=1e-9)
    assert f"| tiny | none | 4 | 3.000 [{lo:.3f}, {hi:.3f}] |" in md and js["n"][0][-1] == 4
    assert f"ppl,tiny,none,3.0,4,{lo},{hi}" in render_probes(runs, "csv")


# ---------------------------------------------------------------- 4. the beyond-context warning's command works
def test_the_suggested_eval_set_command_makes_an_eval_set_that_fits(model_dir, chapters, tmp_path, capsys,
                                                                     monkeypatch):
    """It lacked --chapters; with it, it wrote an empty file and exited 0. Now: run as suggested, it writes samples
    whose prompt + context + the new tokens fit the model, and generating them warns no more."""
    from data_concat.cli import main as data_main
    from ropescale.common import paths
    from ropescale.evaluation.cli import main

    few = tmp_path / "chapters.jsonl"  # a small book stands in for the shared novels (their tokenizing takes ~25 s)
    few.write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in chapters[:6]), encoding="utf-8")
    monkeypatch.setattr(paths, "CHAPTERS_JSONL", few)
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"id": "long", "context": chapters[0]["text"][:3000], "summary": "摘要"},
                               ensure_ascii=False) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    pi8 = ["--rope", "pi", "--scale", "8"]  # the 64-token model at 512
    assert main(_generate(model_dir, long, tmp_path / "g1", "--max-new-tokens", "8", *pi8)) == 0
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if "An eval set that fits" in ln]
    cmd = line.split("An eval set that fits: ")[1].split(", then this command")[0]
    words = shlex.split(cmd)
    assert words[:4] == ["python", "-m", "data_concat", "sample"]
    assert data_main(words[3:]) == 0
    fit = tmp_path / "eval_fit.jsonl"
    assert fit.is_file() and fit.read_text(encoding="utf-8").strip()
    assert line.endswith("then this command with --data eval_fit.jsonl --max-new-tokens 8")
    capsys.readouterr()
    assert main(_generate(model_dir, fit, tmp_path / "g2", "--max-new-tokens", "8", "--limit", "4", "--json",
                          *pi8)) == 0
    cap = capsys.readouterr()
    assert "warning" not in cap.err and json.loads(cap.out)["over_context"] == 0


# ---------------------------------------------------------------- the notes
def test_a_misspelt_flag_or_command_says_did_you_mean_with_the_commands_own_usage(capsys):
    from ropescale.evaluation.cli import main

    with pytest.raises(SystemExit) as e:
        main(["generate", "--limt", "4"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: eval_summ.py generate ")
    assert err.strip().endswith("error: unrecognized arguments: --limt 4 (did you mean --limit?)")
    with pytest.raises(SystemExit):
        main(["genrate"])
    assert "(did you mean 'generate'?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "ft-ei"])
    assert "(did you mean 'ft-ie'?)" in capsys.readouterr().err


def test_every_help_fits_on_100_lines(capsys, monkeypatch):
    """--help of every command (the advanced groups by name; --help-all explains them)."""
    from test_help import every_help

    from data_concat.cli import main as data
    from rope_scaling.__main__ import main as rope
    from ropescale.cli import main as front
    from ropescale.evaluation.cli import main as evaluation
    from ropescale.probes.cli import main as probes
    from ropescale.training.cli import main as finetune

    monkeypatch.setenv("COLUMNS", "80")
    mains = {"finetune.py": finetune, "eval_summ.py": evaluation, "data_concat": data, "rope_scaling": rope,
             "ropescale.probes": probes}
    long = {}
    for _, target, argv in every_help():
        try:
            rc = mains[target](argv, prog=target) if target in mains else front(argv)
        except SystemExit as e:
            rc = e.code
        out = capsys.readouterr().out
        assert rc in (0, None) and out, (target, argv)
        n = len(out.splitlines())
        if n > 100:
            long[f"{target} {' '.join(argv)}"] = n
    assert long == {}
    with pytest.raises(SystemExit):
        finetune(["--help-all"], prog="finetune.py")
    assert "--lora-r LORA_R" in capsys.readouterr().out  # explained there


def test_one_pair_a_sample_makes_reset_and_document_a_no_op_and_says_so():
    from ropescale.training.data import one_pair_note
    from ropescale.training.positions import Policy

    one = [{"pair_starts": [0]}, {"pair_starts": [0]}]
    two = [{"pair_starts": [0]}, {"pair_starts": [0, 40]}]
    note = one_pair_note(one, Policy("reset", "document"), "DATA")
    assert note and "every sample of DATA holds one pair" in note and "continuous + causal" in note
    assert one_pair_note(two, Policy("reset", "document"), "DATA") is None
    assert one_pair_note(one, Policy(), "DATA") is None


def test_errors_name_the_file_they_are_about(tmp_path, make_tiny_model):
    from rope_scaling import RopeSpec
    from rope_scaling.load import load_config
    from rope_scaling.spec import read_longrope_factors
    from ropescale.training.saving import find_export

    with pytest.raises(InputError) as e:
        find_export(tmp_path / "nope")
    assert str(e.value) == f"{tmp_path / 'nope'}: no such finetune run directory"  # not "no final export"
    factors = tmp_path / "factors.json"
    factors.write_text(json.dumps({"short_factor": [1.0, 1.0], "long_factor": [1.0, 1.0]}))
    _, d = make_tiny_model("qwen2", orig_ctx=64)
    spec = RopeSpec("longrope", 8.0, longrope_factors=read_longrope_factors(factors))
    with pytest.raises(InputError) as e:
        load_config(d, spec)
    assert e.value.path == str(factors) and "config.json" not in str(e.value)  # the factors file, not the config


def test_training_curves_and_a_warmup_that_starts_above_zero(tmp_path):
    """The warm-up's first optimizer step ran at learning rate 0 (transformers' schedules); the shifted schedule runs
    step s < W at lr (s + 1) / W, hand-derived, and the later steps as before."""
    import torch
    from transformers import get_scheduler

    from ropescale.common.compat import warmup_from_first_step

    w, lr = 4, 1e-3
    for kind, after in (("constant_with_warmup", lambda s: 1.0), ("linear", lambda s: (10 - s) / (10 - w))):
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
        sched = warmup_from_first_step(get_scheduler(kind, opt, num_warmup_steps=w, num_training_steps=10), w)
        seen = []
        for _ in range(8):
            seen.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        want = [lr * (s + 1) / w for s in range(w)] + [lr * after(s) for s in range(w, 8)]
        assert seen == pytest.approx(want), kind
        assert isinstance(sched.state_dict(), dict) and sched.state_dict()["lr_lambdas"] == [None]


def test_the_curves_png_of_a_run_log(tmp_path, capsys):
    from ropescale.training.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "train_log.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0 / s, "lr": 1e-3 * min(s, 2) / 2})
                                                 + "\n" for s in (1, 2, 3, 2, 3, 4)) + '{"step": 5, "lo')
    assert main(["plot", "--run", str(run), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res == {"png": str(run / "train_curves.png"), "steps": 4}  # a resumed step counted once, a torn line not
    assert (run / "train_curves.png").read_bytes()[:4] == b"\x89PNG"
    _one_line(capsys, main(["plot", "--run", str(tmp_path / "none")]), "no train_log.jsonl")


def test_report_to_a_missing_integration_is_one_line_before_any_work(monkeypatch):
    import importlib.util

    from ropescale.training import curves

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in ("wandb", "tensorboard",
                                                                                   "tensorboardX") else real(n, *a))
    for name in ("wandb", "tensorboard"):
        with pytest.raises(InputError, match=f"--report-to {name}: .* is installed"):
            curves.check_report_to(name)
    curves.check_report_to("none")
