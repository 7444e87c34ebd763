"""The README and docs/usage.md as a newcomer reads them: two commands first, short, and every command block that runs
on the tiny default runs as written.

A block is run unless the line before its opening fence is an HTML comment ``<!-- not run by tests/test_readme.py:
WHY -->`` (a real model, a GPU, the demo itself): skipped by selection, never by pytest.skip. The blocks of a page run
in order, each command from a sandbox folder that mirrors the checkout (a symlink to each of its top-level entries
but ``runs``, and ``../shared`` beside it), so the commands run exactly as written and their outputs (``runs/...``)
land in a temporary folder, not in the checkout."""

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
USAGE = ROOT / "docs" / "usage.md"
PAGES = (README, USAGE)
NOT_RUN = "<!-- not run by tests/test_readme.py:"
BUILD_HISTORY = re.compile(r"this session|device tool|\bissue \d+|the coordinator|a helper\b", re.IGNORECASE)
FENCE = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def _text(page: Path = README) -> str:
    return page.read_text(encoding="utf-8")


def blocks(text: str) -> list[tuple[str, str | None]]:
    """Every ```bash block of a page: (its text, why it is not run -- None for a block that runs)."""
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        why = before[len(NOT_RUN):].rstrip("->").strip() if before.startswith(NOT_RUN) else None
        out.append((m.group(1), why))
    return out


def commands(block: str) -> list[str]:
    """A block's commands: comment lines dropped, backslash continuations joined (a trailing comment stays: bash
    drops it)."""
    cmds, cur = [], ""
    for line in block.splitlines():
        s = line.strip()
        if not s or (s.startswith("#") and not cur):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cmds.append(cur + s)
        cur = ""
    assert not cur, "a block ends inside a continued line"
    return cmds


def runnable(page: Path) -> list[str]:
    return [c for b, why in blocks(_text(page)) if why is None for c in commands(b)]


def quickstart_commands(text: str) -> list[str]:
    """The quick-start block's commands (the first block after its marker)."""
    i = text.index("<!-- quickstart")
    return commands(FENCE.search(text, i).group(1))


def sandbox(tmp: Path) -> Path:
    """A folder that mirrors the checkout: each top-level entry linked (but runs/), ../shared beside it."""
    from ropescale.common.paths import SHARED_DIR

    work = tmp / "work"
    work.mkdir()
    for p in ROOT.iterdir():
        if p.name not in ("runs", ".git"):
            (work / p.name).symlink_to(p)
    (tmp / "shared").symlink_to(SHARED_DIR.resolve())
    return work


def run_as_written(cmds: list[str], tmp: Path) -> Path:
    venv = ROOT / ".venv" / "bin"
    assert venv.is_dir(), "the commands use .venv/ (make setup)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    work = sandbox(tmp)
    for cmd in cmds:
        r = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{cmd}\nrc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return work


# ---------------------------------------------------------------- what the pages say
def test_readme_starts_with_the_two_commands_and_is_short():
    text = _text()
    first, why = blocks(text)[0]
    lines = [ln.split("#")[0].strip() for ln in first.splitlines() if ln.strip()]
    assert lines == ["make demo", "make test"] and why
    head = text[:text.index("```bash")].splitlines()
    assert head[0] == "# ropescale" and all(not ln.strip() or ln.startswith(NOT_RUN) for ln in head[1:]), \
        "the two commands come first"
    n = len(text.splitlines())
    assert n <= 200, f"README.md has {n} lines (at most 200: the rest belongs in docs/)"


def test_readme_and_docs_speak_to_users_not_about_how_they_were_built():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    hits = [f"{p.relative_to(ROOT)}:{i}: {ln.strip()[:80]}" for p in pages
            for i, ln in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if BUILD_HISTORY.search(ln)]
    assert not hits, "\n".join(hits)


def test_no_issue_numbers_in_code_or_help():
    """The code, its help and its docs speak to users: no ``issue 42`` outside the tests."""
    pat = re.compile(r"issue [0-9]+", re.IGNORECASE)
    files = [p for d in ("ropescale", "rope_scaling", "data_concat", "scripts", "bench")
             for p in (ROOT / d).rglob("*.py")]
    files += [ROOT / "finetune.py", ROOT / "eval_summ.py", ROOT / "pyproject.toml", ROOT / "Makefile"]
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files
            for i, ln in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pat.search(ln)]
    assert hits == []


def test_readme_links_resolve():
    text = _text()
    missing = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
               if not t.startswith("http") and not (ROOT / t).exists()]
    assert not missing, missing


def test_every_block_is_run_or_says_why_not():
    for page in PAGES:
        bs = blocks(_text(page))
        assert bs, page
        assert all(why is None or len(why) > 5 for _, why in bs), page
        assert runnable(page), f"{page.name}: no block runs"
    assert [why is None for _, why in blocks(_text())] == [False, True, False]  # make demo/test, quick start, 7B


def test_quickstart_block_parses():
    cmds = quickstart_commands(_text())
    assert cmds[0].split("#")[0].strip() == "make setup", "a newcomer's first command makes the venv"
    assert len(cmds) >= 7
    assert all(c.startswith(".venv/bin/") for c in cmds[1:]), cmds
    assert all("runs/quick" in c for c in cmds[2:])


def _flag(cmd: str, flag: str) -> str | None:
    words = shlex.split(cmd.split(" #")[0])
    return words[words.index(flag) + 1] if flag in words else None


def test_quickstart_says_what_it_does():
    """Its comment says prompt + context + answer fit in 1,024 tokens: the eval set reserves the answer budget the
    generation then uses, so no answer is cut at the budget and no input is past the total."""
    text = _text()
    cmds = quickstart_commands(text)
    recall = next(c for c in cmds if "data_concat recall" in c)
    gen = next(c for c in cmds if "eval_summ.py generate" in c)
    budget = _flag(recall, "--max-answer-tokens")
    assert budget is not None and budget == _flag(gen, "--max-new-tokens")
    block = FENCE.search(text, text.index("<!-- quickstart")).group(1)
    m = re.search(r"prompt \+ context \+ an? ([\d,]+)-token answer <= ([\d,]+) tokens", block)
    assert m and m.group(1) == budget and m.group(2).replace(",", "") == _flag(recall, "--eval-tokens")


# ---------------------------------------------------------------- the pages run as written
def test_quickstart_runs_as_written(tmp_path):
    """Each command of the quick start, in order, as written, from a sandbox that mirrors the checkout."""
    import json

    work = run_as_written(quickstart_commands(_text()), tmp_path)
    quick = work / "runs" / "quick"
    assert (quick / "ntk-x8-merged" / "config.json").is_file()
    assert (quick / "ntk-x8" / "train_curves.png").read_bytes()[:4] == b"\x89PNG"
    recs = [json.loads(x) for x in (quick / "gen" / "ntk-x8" / "predictions.jsonl").read_text().splitlines()]
    budget = 128
    assert len(recs) == 2 and all(r["input_tokens"] + budget <= 1024 for r in recs)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ROOT / "assets" / "tiny"))
    assert all(len(tok(r["reference"], add_special_tokens=False)["input_ids"]) < budget for r in recs)


def test_usage_runs_as_written(tmp_path):
    """docs/usage.md's blocks that run on the tiny default, in order, as written."""
    work = run_as_written(runnable(USAGE), tmp_path)
    out = work / "runs" / "usage"
    for f in ("fig3.png", "probes.png", "train/tiny-yarn-x8/train_curves.png", "report/table2.md"):
        assert (out / f).is_file(), f


@pytest.mark.parametrize("script", ["demo.py"])
def test_the_scripts_the_readme_names_parse_as_written(script, monkeypatch):
    """Each ``scripts/X.py ...`` command of the README parses (its argparse call returns) as written; nothing runs."""
    import argparse
    import runpy
    import sys

    named = [c for c in re.findall(r"`(?:\.venv/bin/python )?(scripts/[a-z_]+\.py[^`]*)`", _text())
             if c.split()[0] == f"scripts/{script}"]
    assert named, f"the README names no scripts/{script} command"

    class Parsed(Exception):
        pass

    real = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        real(self, args, namespace)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "scripts" / script)])
    main = runpy.run_path(str(ROOT / "scripts" / script))["main"]
    for cmd in named:
        with pytest.raises(Parsed):
            main(shlex.split(cmd)[1:])
