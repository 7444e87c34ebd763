"""Ctrl-C under the README's launcher (``.venv/bin/deepspeed -q finetune.py ...``): SIGINT to the whole process group
ends with the run's one "interrupted: ... --resume auto" line, naming the launcher's command, and no traceback
(ropescale.common.process: quiet_launcher_interrupt in the training process, LAUNCHER_SIGINT in the runner's .pth)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from ropescale.common.paths import REPO_ROOT

DEEPSPEED = REPO_ROOT / ".venv" / "bin" / "deepspeed"


def test_the_venv_runs_the_launcher_hook():
    from ropescale.common.process import ACCELERATOR_PTH, LAUNCHER_SIGINT

    pth = Path(sysconfig.get_paths()["purelib"]) / ACCELERATOR_PTH
    assert LAUNCHER_SIGINT in pth.read_text().splitlines(), "run make setup (scripts/setup.sh writes the .pth)"


def test_sigterm_after_sigint_is_ignored_and_alone_still_ends(tmp_path):
    """The launcher's SIGTERM right after Ctrl-C does not cut the interrupt short; a SIGTERM alone ends the process
    (exit -15, as without the handlers)."""
    code = ("import os, signal, sys, time; from ropescale.common.process import quiet_launcher_interrupt as q\n"
            "assert q()\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
            "except KeyboardInterrupt:\n"
            "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2); print('unwound', flush=True)\n"
            "    if sys.argv[-1] == 'again':\n"
            "        os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n")
    env = dict(os.environ, LOCAL_RANK="0")

    def run(*args):
        return subprocess.run([sys.executable, "-c", *args], env=env, capture_output=True, text=True, timeout=60,
                              cwd=REPO_ROOT)

    r = run(code, "--local_rank=0", "once")
    assert r.returncode == 0 and r.stdout == "unwound\n", (r.returncode, r.stdout, r.stderr)
    r = run(code, "--local_rank=0", "again")
    assert r.returncode == 0 and r.stdout == "unwound\n", (r.returncode, r.stdout, r.stderr)  # still interrupted
    lone = "import os, signal, time; from ropescale.common.process import quiet_launcher_interrupt as q\n" \
           "q(); os.kill(os.getpid(), signal.SIGTERM); time.sleep(5); print('survived')"
    r = run(lone, "--local_rank=0")
    assert r.returncode == -signal.SIGTERM and "survived" not in r.stdout


def test_a_plain_run_is_not_taken_for_a_launched_one():
    """setup_env sets LOCAL_RANK for a plain ``python finetune.py``: that alone installs nothing."""
    from ropescale.common.process import under_launcher

    assert not under_launcher(["--max-steps", "2"], {"LOCAL_RANK": "0"})
    assert under_launcher(["--local_rank=0", "--max-steps", "2"], {})
    assert under_launcher([], {"TORCHELASTIC_RUN_ID": "x"})


def test_ctrl_c_under_the_launcher_says_how_to_resume(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    cmd = [os.path.relpath(DEEPSPEED, REPO_ROOT), "-q", "finetune.py", "--max-steps", "2", "--out", str(out)]
    p = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)  # its own process group: the terminal's Ctrl-C reaches all of it
    try:
        t0 = time.time()
        while not (out / "run.json").exists() and p.poll() is None and time.time() - t0 < 50:
            time.sleep(0.1)  # run.json: the run has started and knows how it would continue
        assert p.poll() is None, p.communicate()
        time.sleep(0.3)
        os.killpg(p.pid, signal.SIGINT)
        stdout, stderr = p.communicate(timeout=40)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert not (out / "final").exists(), "the run ended before the interrupt: nothing was tested"
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted: ") and last.endswith(f"{' '.join(cmd)} --resume auto"), stderr[-2000:]
    assert p.returncode != 0 and stdout == ""
