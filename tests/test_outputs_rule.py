"""The one output rule (ropescale.common.io.claim_output_file / claim_output_dir, runs.claim_run_dir), driven through
every command of the CLI registry (ropescale.cli.TOOLS): a command that writes refuses, in one line with exit code 2,
(a) an existing file it did not write and (b) a non-empty directory of someone else's files, and leaves both
byte-identical. A command the registry gains is classified here (WRITES or READS_ONLY) or this test fails."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from ropescale.common.paths import CHAPTERS_JSONL, REPO_ROOT

TINY_TOK = str(REPO_ROOT / "assets" / "tiny")
CHAPTERS = str(CHAPTERS_JSONL)

# each writes a probe run directory
PROBES = ("suffix-id", "ppl", "perturb", "copy", "shuffle", "ruler", "passkey", "position-loss", "continuation")
# (tool, command) -> {output flag: (kind, the other arguments)}; "{in}" is a folder of small valid inputs (inputs()).
# kind: "file" (a file output), "png" (a plot: must end in .png), "dir" (a directory written whole or a folder of
# tables), "run" (a run directory).
WRITES = {
    ("rope", "search"): {"--out": ("run", ["--model", "tiny", "--evals", "1"])},
    ("data", "pack"): {"--out": ("dir", ["--pairs", "{in}/pairs.jsonl", "--tokenizer", TINY_TOK])},
    ("data", "pairs"): {"--out": ("file", ["--chapters", CHAPTERS, "--tokenizer", TINY_TOK, "--min-tokens", "100",
                                           "--max-tokens", "200", "--max-pairs", "1"])},
    ("data", "sample"): {"--out": ("file", ["--chapters", CHAPTERS, "--tokenizer", TINY_TOK, "--subset", "T512",
                                            "--max-samples", "1"])},
    ("data", "recall"): {"--out": ("file", ["--chapters", CHAPTERS, "--tokenizer", TINY_TOK, "--eval-tokens", "1024",
                                            "--n", "1"])},
    ("data", "text"): {"--out": ("dir", ["{in}/a.txt", "--tokenizer", TINY_TOK, "--length", "16"])},
    ("data", "unique-marks"): {"--out": ("dir", ["--data", "{in}/packed"])},
    ("finetune", "train"): {"--out": ("run", ["--max-steps", "1"])},
    ("finetune", "merge"): {"--out": ("dir", ["--run", "{in}/export"])},
    ("finetune", "plot"): {"--out": ("png", ["{in}/ftrun"])},
    ("eval", "generate"): {"--out": ("run", ["--model", "tiny", "--data", "{in}/eval.jsonl", "--prompt", "ie"])},
    ("eval", "score"): {"--pred": ("run", [])},  # writes scores.json into the run it scores
    ("eval", "report"): {"--out": ("dir", ["{in}/gen"]), "--plot": ("png", ["{in}/gen"])},
    ("eval", "run"): {"--out": ("run", ["--model", "tiny", "--data", "{in}/eval.jsonl", "--prompt", "ie"]),
                      "--plot": ("png", ["--model", "tiny", "--data", "{in}/eval.jsonl", "--prompt", "ie", "--out",
                                         "{in}/newrun"]),
                      "--report-out": ("dir", ["--model", "tiny", "--data", "{in}/eval.jsonl", "--prompt", "ie",
                                               "--out", "{in}/newrun"])},
    ("probes", "report"): {"--out": ("dir", ["{in}/probe"]), "--plot": ("png", ["{in}/probe"])},
    ("real-model", ""): {"--out": ("dir", [])},
    ("make-tiny", ""): {"--out": ("dir", ["--build"])},  # refused before the hour of pretraining starts
    **{("probes", p): {"--out": ("run", ["--model", "tiny"])} for p in PROBES},
    **{("experiment", c): {"--out": ("run", ["experiments/table2.yaml", "--quick"]),
                           "--page": ("file", ["experiments/table2.yaml", "--quick", "--out", "{in}/exp"])}
       for c in ("run", "report")},
}
READS_ONLY = {("rope", "describe"), ("data", "stats")}
NOT_DRIVEN: dict = {}
OUTPUT_DESTS = {"out", "plot", "report_out", "pred", "page"}
PROGRESS = re.compile(r"^\[[\w-]+\] |\d+%\|")  # "[stage] ..." progress lines and tqdm bars, aside from the error


def registry() -> dict[tuple[str, str], argparse.ArgumentParser]:
    from ropescale.cli import TOOLS, tool
    from ropescale.common.cli import _commands

    out = {}
    for name in TOOLS:
        t = tool(name)
        ap = t.parser(f"ropescale {name}")
        for cmd, p in ({"": ap} if t.single else _commands(ap)).items():
            out[(name, cmd)] = p
    return out


def test_every_command_is_classified_and_every_output_flag_driven():
    reg = registry()
    assert set(reg) == set(WRITES) | READS_ONLY | set(NOT_DRIVEN), \
        "a command is neither in WRITES nor READS_ONLY: add its output flags and tiny arguments to WRITES"
    for key, p in reg.items():
        flags = {o for a in p._actions if a.dest in OUTPUT_DESTS and a.help != argparse.SUPPRESS
                 for o in a.option_strings[:1]}
        if key in READS_ONLY:
            assert not flags - {"--pred"}, (key, flags)
        elif key in WRITES:
            assert flags == set(WRITES[key]), (key, flags, "an output flag not driven here")


def inputs(d: Path) -> Path:
    """Small valid inputs: an eval set, pairs, a text file, a finetune run's log, an export, a generate run, a probe
    run (records only: every command is refused before it reads them)."""
    d.mkdir()
    row = {"id": "s0", "context": "天色已晚。" * 20, "summary": "天黑了。"}
    (d / "eval.jsonl").write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    (d / "pairs.jsonl").write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    (d / "a.txt").write_text("It was a dark night. " * 40, encoding="utf-8")
    (d / "export").mkdir()
    (d / "export" / "export.json").write_text("{}", encoding="utf-8")
    (d / "ftrun").mkdir()
    (d / "ftrun" / "train_log.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0, "learning_rate": 1e-5}) + "\n")
    for name, kind in (("gen", "generate"), ("probe", "probe")):
        (d / name).mkdir()
        (d / name / "run.json").write_text(json.dumps({"kind": kind}), encoding="utf-8")
    return d


def digest(p: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
        h.update(str(f.relative_to(p.parent)).encode())
        if f.is_file():
            h.update(f.read_bytes())
    return h.hexdigest()


def drive(argv: list[str], capsys) -> tuple[int, list[str]]:
    from ropescale.cli import main

    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    return rc, err


CASES = [(key, flag) for key, flags in WRITES.items() for flag in flags]


@pytest.mark.parametrize("key,flag", CASES, ids=[f"{t}-{c or t}-{f}" for (t, c), f in CASES])
def test_a_writer_refuses_what_it_did_not_write(key, flag, tmp_path, capsys, one_thread):
    kind, rest = WRITES[key][flag]
    inp = inputs(tmp_path / "in")
    args = [a.replace("{in}", str(inp)) for a in rest]
    unrelated = tmp_path / ("notes.png" if kind == "png" else "notes.txt")
    unrelated.write_bytes(b"my notes\n")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_bytes(b"keep me\n")
    (foreign / "sub").mkdir()
    (foreign / "sub" / "data.bin").write_bytes(os.urandom(64))
    head = [key[0]] + ([key[1]] if key[1] else [])
    for target in (unrelated, foreign):
        before = digest(target)
        rc, err = drive(head + args + [flag, str(target)], capsys)
        errors = [ln for ln in err if not PROGRESS.search(ln)]
        assert rc == 2 and len(errors) == 1 and errors == err[-1:], (target, rc, err)
        assert str(target) in errors[0] and errors[0].startswith("error: "), err
        assert digest(target) == before, f"{target} changed"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in", unrelated.name, "mine"])


def test_a_plot_path_must_end_in_png(tmp_path, capsys):
    inp = inputs(tmp_path / "in")
    for argv in (["finetune", "plot", str(inp / "ftrun"), "--out", str(tmp_path / "curves.jpg")],
                 ["eval", "report", str(inp / "gen"), "--plot", str(tmp_path / "fig3.pdf")],
                 ["probes", "report", str(inp / "probe"), "--plot", str(tmp_path / "probes")]):
        rc, err = drive(argv, capsys)
        assert rc == 2 and len(err) == 1 and "must end in .png" in err[0], (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_own_output_is_replaced_and_overwrite_replaces_a_foreign_file(tmp_path, capsys):
    """The record beside an output names it: a second run replaces it; a file changed since is the user's again;
    --overwrite replaces a foreign file."""
    out = tmp_path / "eval.jsonl"
    argv = ["data", "recall", "--chapters", CHAPTERS, "--tokenizer", TINY_TOK, "--eval-tokens", "1024", "--n", "1",
            "--out", str(out)]
    assert drive(argv, capsys)[0] == 0
    rec = json.loads((tmp_path / ".ropescale-outputs.json").read_text())
    assert rec["eval.jsonl"]["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert rec["eval.jsonl"]["by"] == "ropescale data recall"
    assert drive(argv, capsys)[0] == 0  # its own output: replaced
    out.write_text(out.read_text() + "\n", encoding="utf-8")  # edited by hand: no longer what the tool wrote
    edited = out.read_bytes()
    rc, err = drive(argv, capsys)
    assert rc == 2 and "--overwrite" in err[0] and out.read_bytes() == edited
    assert drive(argv + ["--overwrite"], capsys)[0] == 0 and out.read_bytes() != edited


def test_run_dir_rules(tmp_path):
    """A run directory: a new path, an empty directory and one of only scaffolding are fine; a non-empty directory
    holding no run is refused; another kind's run is refused (as before)."""
    from ropescale.common.io import InputError
    from ropescale.common.runs.resume import claim_run_dir

    assert claim_run_dir(tmp_path / "new", "generate") is None
    (tmp_path / "empty").mkdir()
    assert claim_run_dir(tmp_path / "empty", "generate") is None
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / ".lock").write_text("1 host\n")
    (tmp_path / "started" / ".run.json.abc.tmp").write_text("{")
    assert claim_run_dir(tmp_path / "started", "generate") is None
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "a.txt").write_text("x")
    with pytest.raises(InputError, match="holds no run"):
        claim_run_dir(tmp_path / "foreign", "generate")
