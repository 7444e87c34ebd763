"""A researcher's first hour (issue 34): outputs that cannot be written are one line before any work, one writer
per run directory, score refuses duplicate ids."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ropescale.common.io import InputError
from ropescale.common.paths import CHAPTERS_JSONL

ROOT = Path(__file__).resolve().parent.parent


def _one_line(capsys, rc, *what) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err[-30:]
    assert len(err) == 1 and err[0].startswith("error: "), err[-30:]
    for w in what:
        assert w in err[0], err
    return err[0]


@pytest.fixture
def freeze():
    """``freeze(dir)``: make a directory unwritable for this process -- root ignores modes, so as root the
    directory is made immutable (chattr +i); otherwise mode 0555. Undone after the test."""
    frozen = []

    def f(d: Path) -> Path:
        d.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            r = subprocess.run(["chattr", "+i", str(d)], capture_output=True, text=True)
            assert r.returncode == 0, f"chattr +i failed here ({r.stderr.strip()}): no read-only directory"
        else:
            os.chmod(d, 0o555)
        frozen.append(d)
        with pytest.raises(OSError):  # it really is read-only for this process
            (d / "probe").write_text("x")
        return d

    yield f
    for d in frozen:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(d)], check=True)
        else:
            os.chmod(d, 0o755)


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a model or a tokenizer fails the test: the output check must come before them."""
    import transformers

    def boom(*a, **k):
        raise AssertionError("a model or tokenizer was loaded before the output was checked")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(boom))
    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "from_pretrained", classmethod(boom))


@pytest.fixture(scope="module")
def model_dir(make_tiny_model):
    return make_tiny_model("qwen2", orig_ctx=64, seed=3)[1]


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("evaldata") / "eval.jsonl"
    p.write_text("".join(json.dumps({"id": f"s{i}", "context": "一段很短的文字。" * 3, "summary": "摘要"},
                                    ensure_ascii=False) + "\n" for i in range(2)), encoding="utf-8")
    return p


def _generate(model_dir, eval_file, out):
    return ["generate", "--model", str(model_dir), "--data", str(eval_file), "--prompt", "ie", "--max-new-tokens",
            "2", "--out", str(out)]


def _run_dir(d: Path, preds: list[dict]) -> Path:
    from ropescale.common.runs.record import RunDir

    RunDir(d).write_meta({"kind": "generate", "model": "m", "prompt": "ie"})
    (d / "predictions.jsonl").write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in preds),
                                         encoding="utf-8")
    return d


# ---------------------------------------------------------------- 2. an output that cannot be written
READ_ONLY = "cannot be written here"


@pytest.mark.parametrize("writer", ["generate", "probes", "finetune", "merge", "pack", "pairs", "sample", "recall",
                                    "report-plot", "report-out", "probes-report"])
def test_an_unwritable_output_is_one_line_before_any_work(writer, freeze, no_model_load, model_dir, eval_file,
                                                          tmp_path, capsys):
    ro = freeze(tmp_path / "ro")
    tok = str(model_dir)
    if writer == "generate":
        from ropescale.evaluation.cli import main

        rc = main(_generate(model_dir, eval_file, ro / "run"))
    elif writer in ("probes", "probes-report"):
        from ropescale.probes.cli import main

        argv = (["ppl", "--model", str(model_dir), "--n", "1", "--out", str(ro / "run")] if writer == "probes"
                else ["report", str(tmp_path), "--plot", str(ro / "p.png")])
        rc = main(argv)
    elif writer in ("finetune", "merge"):
        from ropescale.training.cli import main

        exp = tmp_path / "export"
        exp.mkdir()
        (exp / "export.json").write_text("{}")
        rc = main(["--model", str(model_dir), "--rope", "pi", "--scale", "2", "--out", str(ro / "run")]
                  if writer == "finetune" else ["merge", "--run", str(exp), "--out", str(ro / "merged")])
    elif writer in ("report-plot", "report-out"):
        from ropescale.evaluation.cli import main

        rc = main(["report", str(_run_dir(tmp_path / "run", [])),
                   *(["--plot", str(ro / "sub" / "fig3.png")] if writer == "report-plot" else ["--out", str(ro)])])
    else:
        from data_concat.cli import main

        rc = main({"pack": ["pack", "--pairs", str(eval_file), "--tokenizer", tok, "--sample-length", "16k", "--out",
                            str(ro / "packed")],
                   "pairs": ["pairs", "--chapters", str(CHAPTERS_JSONL), "--tokenizer", tok, "--min-tokens", "100",
                             "--max-tokens", "200", "--out",
                             str(ro / "pairs.jsonl")],
                   "sample": ["sample", "--chapters", str(CHAPTERS_JSONL), "--tokenizer", tok, "--subset-tokens",
                              "512", "--out", str(ro / "s.jsonl")],
                   "recall": ["recall", "--tokenizer", tok, "--eval-tokens", "256", "--out", str(ro / "r.jsonl")],
                   }[writer])
    line = _one_line(capsys, rc, READ_ONLY, str(ro))
    assert "Traceback" not in line and list(ro.iterdir()) == []


def test_a_resumed_generate_and_scores_into_a_read_only_run(freeze, model_dir, eval_file, tmp_path, capsys,
                                                             monkeypatch):
    from ropescale.evaluation.cli import main

    out = tmp_path / "run"
    assert main(_generate(model_dir, eval_file, out)) == 0
    (out / "predictions.jsonl").write_text((out / "predictions.jsonl").read_text().splitlines()[0] + "\n")
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    freeze(out)
    import transformers

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained",
                        classmethod(lambda *a, **k: pytest.fail("the model loaded before the output check")))
    _one_line(capsys, main(_generate(model_dir, eval_file, out)), READ_ONLY, str(out))
    # score only reads the run: a read-only one is scored all the same, its scores printed and not saved
    assert main(["score", "--pred", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["n"] == 1 and "cannot be written here" in cap.err and "scores.json" in cap.err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# ---------------------------------------------------------------- 3. one writer per run directory
HOLD = """
import sys, time
from ropescale.common.runs.resume import open_run_dir
open_run_dir(sys.argv[1], "generate")
print("held", flush=True)
time.sleep(120)
"""


def _holder(d: Path, env=None) -> subprocess.Popen:
    """Another process that opens run directory ``d`` and keeps it (until killed)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], stdout=subprocess.PIPE, text=True,
                         env=env or dict(os.environ))
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_writer_is_refused_naming_the_holder_and_the_lock_dies_with_it(model_dir, eval_file, tmp_path,
                                                                                 capsys):
    from ropescale.common.runs.locks import LOCK_FILE, release_run_dirs
    from ropescale.common.runs.resume import open_run_dir
    from ropescale.evaluation.cli import main

    out = tmp_path / "run"
    p = _holder(out)
    try:
        line = _one_line(capsys, main(_generate(model_dir, eval_file, out)), f"pid {p.pid}", str(out))
        assert "another process is writing" in line
        assert not (out / "predictions.jsonl").exists()
        with pytest.raises(InputError, match=f"pid {p.pid}"):
            open_run_dir(out, "generate")
    finally:
        p.kill()  # as kill -9: no clean-up of its own
        p.wait()
    assert (out / LOCK_FILE).exists()  # left behind by the killed holder, but its lock died with it
    open_run_dir(out, "generate")
    release_run_dirs()
    assert main(_generate(model_dir, eval_file, out)) == 0
    assert sorted(json.loads(x)["id"] for x in (out / "predictions.jsonl").read_text().splitlines()) == ["s0", "s1"]
    assert not (out / LOCK_FILE).exists()  # released when the command ended


def test_ranks_of_one_job_share_it_and_a_refused_run_leaves_nothing(tmp_path, monkeypatch):
    from ropescale.common.runs.locks import release_run_dirs
    from ropescale.common.runs.resume import open_run_dir

    out = tmp_path / "a" / "run"
    p = _holder(out, env={**os.environ, "RANK": "0"})
    try:
        monkeypatch.setenv("RANK", "1")  # rank 1 of the holder's job: rank 0 holds the directory for the job
        open_run_dir(out, "generate")
        monkeypatch.setenv("RANK", "0")  # another job's rank 0
        with pytest.raises(InputError, match=f"pid {p.pid}"):
            open_run_dir(out, "generate")
    finally:
        p.kill()
        p.wait()
    fresh = tmp_path / "b" / "c" / "run"
    open_run_dir(fresh, "generate")
    assert fresh.is_dir()
    release_run_dirs()  # nothing written: the directories made to hold the lock go again
    assert not (tmp_path / "b").exists()


def test_score_refuses_duplicate_ids(tmp_path, capsys):
    from ropescale.evaluation.cli import main

    rows = [{"id": i, "prediction": "甲乙", "reference": "甲乙丙"} for i in ("a", "b", "a", "c", "b")]
    f = tmp_path / "preds.jsonl"
    f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    _one_line(capsys, main(["score", "--pred", str(f)]), str(f), "2 id(s) occur more than once (a, b)")
    run = _run_dir(tmp_path / "run", rows)
    _one_line(capsys, main(["score", "--pred", str(run)]), "predictions.jsonl", "(a, b)")
    assert not (run / "scores.json").exists()
    t0 = time.time()
    f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[:2]), encoding="utf-8")
    assert main(["score", "--pred", str(f), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 2 and time.time() - t0 < 30


# ---------------------------------------------------------------- 4. deepspeed's launcher on CPU keeps stdout clean
def test_the_launcher_prints_nothing_on_stdout_without_ds_accelerator(tmp_path):
    """The launcher imports DeepSpeed's accelerator before finetune.py runs; on a machine without a GPU it said
    "Setting accelerator to CPU" on stdout. Set-up's .pth sets DS_ACCELERATOR=cpu at start-up there (the
    launcher run end to end: tests/test_edges.py, also without the variable)."""
    import sysconfig

    from ropescale.common.process import ACCELERATOR_PTH, GPU_DEVICE_NODES, accelerator_pth_text

    pth = Path(sysconfig.get_paths()["purelib"]) / ACCELERATOR_PTH
    assert pth.read_text() == accelerator_pth_text(), "run make setup (scripts/setup.sh writes it)"
    env = {k: v for k, v in os.environ.items() if k not in ("DS_ACCELERATOR", "CUDA_VISIBLE_DEVICES")}
    r = subprocess.run([sys.executable, "-c", "import os, deepspeed.launcher.runner; "
                        "print(os.environ.get('DS_ACCELERATOR'))"], env=env, capture_output=True, text=True,
                       timeout=120)
    gpu = any(os.path.exists(d) for d in GPU_DEVICE_NODES)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == ("None\n" if gpu else "cpu\n")  # nothing of DeepSpeed's on stdout
    # the line itself, in a bare interpreter with this folder as its site directory: set, kept, hidden GPUs
    (tmp_path / ACCELERATOR_PTH).write_text(accelerator_pth_text())
    code = f"import site, os; site.addsitedir({str(tmp_path)!r}); print(os.environ.get('DS_ACCELERATOR'))"
    for extra, want in (({}, None if gpu else "cpu"), ({"DS_ACCELERATOR": "cuda"}, "cuda"),
                        ({"CUDA_VISIBLE_DEVICES": "-1"}, "cpu")):
        r = subprocess.run([sys.executable, "-S", "-c", code], env={**env, **extra}, capture_output=True, text=True)
        assert r.stdout.strip() == str(want), (extra, r.stdout, r.stderr)


# ---------------------------------------------------------------- 5. a rendezvous port another job holds
@pytest.fixture
def held_port():
    """A port this test listens on, as another job's rendezvous would."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_busy_port_alone_is_swapped_for_a_free_one(held_port):
    from ropescale.common.process import check_master_port

    notes = []
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(held_port)}
    check_master_port(notes.append, env)
    assert env["MASTER_PORT"] != str(held_port) and notes == [
        f"[finetune] rendezvous port {held_port} is in use (another job?): using {env['MASTER_PORT']}"]
    import socket

    with socket.socket() as s:  # the new one is free
        s.bind(("", int(env["MASTER_PORT"])))
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": str(held_port)}  # rank 1 connects, never listens
    check_master_port(None, env)
    assert env["MASTER_PORT"] == str(held_port)


def test_a_busy_port_in_a_job_of_ranks_is_one_line(held_port, tmp_path):
    """Rank 0 of two ranks (as the launcher starts it) on a port another job holds (before: a 52-line traceback
    from the rendezvous)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DS_ACCELERATOR",)}
    env.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(held_port), "OMP_NUM_THREADS": "1"})
    r = subprocess.run([sys.executable, str(ROOT / "finetune.py"), "--rope", "pi", "--scale", "2", "--max-steps",
                        "1", "--out", str(tmp_path / "run")], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=180)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert last.startswith(f"error: the rendezvous port MASTER_PORT={held_port} is in use") and "--master_port" in last


# ---------------------------------------------------------------- 6. rough edges
WRITE_RUNNING = """
import sys, time
from ropescale.common.runs.record import RunDir, RunRecord
from ropescale.common.runs.resume import open_run_dir
open_run_dir(sys.argv[1], "finetune")
RunDir(sys.argv[1]).write_record(RunRecord("finetune", settings={}, train={}))  # status: running
print("held", flush=True)
time.sleep(120)
"""


def test_a_killed_finetune_reads_stopped_not_running(tmp_path, capsys):
    from ropescale.common.runs.record import RunMeta
    from ropescale.training.cli import main

    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", WRITE_RUNNING, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        assert RunMeta.read(out).status == "running"
    finally:
        p.kill()
        p.wait()
    assert RunMeta.read(out).status == f"stopped (pid {p.pid} not running)"
    assert main(["--rope", "pi", "--scale", "2", "--out", str(out)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"error: {out}: already holds a finetune run (stopped (pid {p.pid} not running)): pass "
                           "--resume auto"), line


def test_ctrl_c_says_how_to_continue(model_dir, eval_file, tmp_path, capsys, monkeypatch):
    from ropescale.evaluation import generate as gen
    from ropescale.evaluation.cli import main

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    argv = _generate(model_dir, eval_file, tmp_path / "run")
    monkeypatch.setattr(sys, "argv", [str(ROOT / "eval_summ.py"), *argv])
    monkeypatch.setattr(gen, "decode", interrupted)
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("interrupted: the predictions so far are kept; to continue, run the same command again: "
                       f"python {os.path.relpath(ROOT / 'eval_summ.py')} {' '.join(argv)}")
    from ropescale.training import run as ft_run
    from ropescale.training.cli import main as ft_main

    argv = ["--rope", "pi", "--scale", "2", "--out", str(tmp_path / "ft"), "--overwrite"]
    monkeypatch.setattr(sys, "argv", ["finetune.py", *argv])
    monkeypatch.setattr(ft_run, "prepare_data", interrupted)
    assert ft_main(argv) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "interrupted: to continue from the last checkpoint (every --save-steps), run the same command with --resume "
        f"auto: python finetune.py --rope pi --scale 2 --out {tmp_path / 'ft'} --resume auto")


def test_generate_warns_before_the_model_loads_when_inputs_exceed_its_context(model_dir, chapters, tmp_path, capsys,
                                                                              monkeypatch):
    """The README's eval example fed 14-16K-token inputs to a 512-token model for 8 minutes of ROUGE 0.00."""
    import transformers

    from ropescale.evaluation.cli import main

    def boom(*a, **k):
        raise AssertionError("the model loaded before the warning")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(boom))

    data = tmp_path / "long.jsonl"
    rows = [{"id": "long", "context": chapters[0]["text"][:3000], "summary": "摘要"},
            {"id": "short", "context": "短", "summary": "摘要"}]
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(AssertionError, match="loaded before the warning"):
        main(_generate(model_dir, data, tmp_path / "run") + ["--rope", "pi", "--scale", "8"])  # 64 -> 512
    err = capsys.readouterr().err
    want = ("[generate] warning: 1 of 2 samples are longer than the model's 512-token context less 2 new tokens: they "
            "will be run beyond the model's positions (extrapolation; scores near 0 are likely). An eval set that "
            "fits: python -m data_concat sample --chapters ")
    (line,) = [ln for ln in err.splitlines() if ln.startswith(want)]  # (that the command works: test_second_hour)
    assert f" --tokenizer {model_dir} " in line and line.endswith("--max-new-tokens 2"), line


def test_chinese_labels_are_drawn_with_glyphs_or_named_once(tmp_path, capsys):
    """Fig. 3 with a Chinese series label: no box per glyph and no warning per character. matplotlib ships no
    font with Chinese glyphs (DejaVu has none; its 'Last Resort' font draws every character as a box): with one
    installed the label is drawn in it, without one the characters become '?' and one note says so."""
    import warnings

    import matplotlib
    from matplotlib.text import Text

    matplotlib.use("Agg")
    from ropescale.common.plot import font_with
    from ropescale.evaluation.report import plot

    drawn = {}
    real = plot.save_png

    def keep(fig, path, dpi=None):
        drawn["texts"] = [t.get_text() for t in fig.findobj(Text) if t.get_text()]
        return real(fig, path, dpi)

    series = [{"label": "千问 pi x8", "kind": "IE", "points": [(100 * i, float(i)) for i in range(20)]}]
    font = font_with(set("千问"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a "Glyph ... missing from font" warning fails the test
        try:
            plot.save_png = keep
            plot.plot_fig3(series, tmp_path / "fig3.png", window=3)
        finally:
            plot.save_png = real
    assert (tmp_path / "fig3.png").read_bytes()[:4] == b"\x89PNG"
    err = capsys.readouterr().err
    if font is None:
        assert any(t.startswith("?? pi x8 (") for t in drawn["texts"])
        assert err.count("no installed font has the glyphs") == 1
    else:
        assert any(t.startswith("千问 pi x8 (") for t in drawn["texts"]) and "no installed font" not in err


def test_data_concat_shows_its_progress_on_stderr(chapters, capsys):
    """pairs / sample tokenize the novels (26-55 s on the shared novels, silent before): a bar on stderr, moved
    per batch of chapters (pack's bar: per batch of pairs), nothing on stdout."""
    from data_concat.cuts import tokenize_with_offsets
    from data_concat.pairs import build_pairs
    from data_concat.sampler import sample
    from data_concat.tokenizer import load_tokenizer
    from ropescale.common import subsets
    from ropescale.common.chapters import Chapter

    tiny_tokenizer = load_tokenizer("tiny")  # the committed tiny default's
    chs = [Chapter(c["book"], c["chapter"], c["title"], c["text"]) for c in chapters[:12]]
    seen = []
    tokenize_with_offsets(tiny_tokenizer, [c.text for c in chs[:5]], batch_size=2, on_batch=seen.append)
    assert seen == [2, 2, 1]
    build_pairs(chs, tiny_tokenizer, 100, 400, progress=True)
    sample(chs, tiny_tokenizer, subsets.scaled(2048), progress=True)
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("tokenizing chapters") >= 2, cap.err[-500:]
