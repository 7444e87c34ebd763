"""The README as a newcomer reads it: two commands first, short, and its quick start runs as written."""

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICK_OUT = "runs/quick"
BUILD_HISTORY = re.compile(r"this session|device tool|\bissue \d+|the coordinator|a helper\b", re.IGNORECASE)


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _fenced_after(text: str, marker: str) -> str:
    """The first ```bash block after ``marker``."""
    i = text.index(marker)
    m = re.compile(r"```bash\n(.*?)```", re.S).search(text, i)
    assert m, f"no ```bash block after {marker!r}"
    return m.group(1)


def quickstart_commands(text: str) -> list[str]:
    """The quick-start block's commands: comments dropped, backslash continuations joined."""
    block = _fenced_after(text, "<!-- quickstart")
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
    assert not cur, "the quick-start block ends inside a continued line"
    return cmds


def test_readme_starts_with_the_two_commands_and_is_short():
    text = _text()
    first = _fenced_after(text, "# ropescale")
    lines = [ln.split("#")[0].strip() for ln in first.splitlines() if ln.strip()]
    assert lines == ["make demo", "make test"]
    assert text.index("```bash") < 40, "the two commands come first"
    n = len(text.splitlines())
    assert n <= 200, f"README.md has {n} lines (at most 200: the rest belongs in docs/)"


def test_readme_and_docs_speak_to_users_not_about_how_they_were_built():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    hits = [f"{p.relative_to(ROOT)}:{i}: {ln.strip()[:80]}" for p in pages
            for i, ln in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if BUILD_HISTORY.search(ln)]
    assert not hits, "\n".join(hits)


def test_readme_links_resolve():
    text = _text()
    missing = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
               if not t.startswith("http") and not (ROOT / t).exists()]
    assert not missing, missing


def test_quickstart_block_parses():
    cmds = quickstart_commands(_text())
    assert len(cmds) >= 6
    assert all(c.startswith(".venv/bin/") for c in cmds), cmds
    assert all(QUICK_OUT in c for c in cmds[1:]), "every output goes under runs/quick (the test redirects it)"


def test_quickstart_runs_as_written(tmp_path):
    """Each command of the quick start, in order, from the project root; outputs under a temporary dir."""
    venv = ROOT / ".venv" / "bin"
    assert venv.is_dir(), "the README's commands use .venv/ (make setup)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    out = str(tmp_path / "quick")
    for cmd in quickstart_commands(_text()):
        cmd = cmd.replace(QUICK_OUT, out)
        r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{cmd}\nrc {r.returncode}\n{r.stderr[-3000:]}"
    assert (tmp_path / "quick" / "ntk-x8-merged" / "config.json").is_file()
    assert list((tmp_path / "quick" / "gen" / "ntk-x8").glob("*.jsonl"))
