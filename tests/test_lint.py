"""The linter the project is held to (pyproject.toml [tool.ruff]: line length 120, import order, pyflakes): ruff, at
the version of the lock, over every tracked Python file. A line it names is a failure with its FILE:LINE."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ruff() -> str:
    exe = Path(sys.executable).parent / "ruff"  # the venv's, installed from the lock
    found = str(exe) if exe.is_file() else shutil.which("ruff")
    assert found, "ruff is not installed: it is in the lock and pyproject's test extra (make setup installs it)"
    return found


def test_ruff_check_passes():
    res = subprocess.run([ruff(), "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 0, f"ruff check (make lint):\n{res.stdout}{res.stderr}"


def test_ruff_sees_the_config_and_fails_on_a_bad_file(tmp_path):
    """The check can fail: a file with a long line and unsorted imports, checked with the project's settings."""
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\n\nX = '" + "x" * 130 + "'\nprint(os, sys)\n", encoding="utf-8")
    res = subprocess.run([ruff(), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
                          "--output-format", "concise", str(bad)], capture_output=True, text=True)
    assert res.returncode == 1
    assert "E501" in res.stdout and "I001" in res.stdout
