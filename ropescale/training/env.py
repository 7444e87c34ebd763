"""Process environment for training, set up before torch / DeepSpeed are imported.

- On a machine without CUDA, DeepSpeed must use its CPU accelerator (``DS_ACCELERATOR=cpu``) and the gloo
  backend; otherwise it probes for GPUs and fails.
- ``python finetune.py`` without a launcher still goes through ``torch.distributed`` (DeepSpeed and the HF
  Trainer expect a process group), so the rendezvous variables get single-process defaults.
- DeepSpeed's CPU communication op (``deepspeed_shm_comm``) is compiled just-in-time on first use (minutes on a
  small machine); gloo does the same job for the tiny CPU runs, so the op is turned off unless
  ``ROPESCALE_DS_SHM=1``.
- The CUDA allocator setting every entry point makes (``ropescale.common.cli.set_cuda_allocator``).
- A rendezvous port another job holds (the launchers' default 29500): :func:`check_master_port`, before the
  process group starts.
- DeepSpeed's own launcher (``deepspeed finetune.py ...``) picks its accelerator before finetune.py runs and, on a
  machine without a GPU, says so on stdout ("Setting accelerator to CPU"), which breaks ``--json | python -m
  json.tool``; nothing in DeepSpeed turns that line off but ``DS_ACCELERATOR``. Set-up (scripts/setup.sh) therefore
  writes a ``.pth`` file into the virtual environment (:func:`write_accelerator_pth`) that sets
  ``DS_ACCELERATOR=cpu`` when Python starts there on a machine without a GPU device node (the check
  ``cuda_available`` makes; no import) and the variable is not set already.
- Ctrl-C under the launcher reaches every process of the terminal's group: DeepSpeed's runner (``.venv/bin/deepspeed``)
  raises KeyboardInterrupt in its ``wait()`` (a 15-line traceback), and ``deepspeed.launcher.launch`` sends the
  training process SIGTERM at once (``terminate_process_tree``), killing it before it can print its "interrupted: ...
  --resume auto" line. The training process therefore takes SIGINT once and ignores the SIGTERM that follows it
  (:func:`quiet_launcher_interrupt`), and the same ``.pth`` file gives the runner a SIGINT handler that waits for its
  child instead of a traceback (a second Ctrl-C ends it at once, exit 130).
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from pathlib import Path

from ropescale.common.cli import GPU_DEVICE_NODES, set_cuda_allocator

DIST_DEFAULTS = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_env(environ: dict | None = None, cuda: bool | None = None) -> dict:
    """Fill in what a CPU / launcher-less run needs and the CUDA allocator setting (never overriding what the
    caller or a launcher set). ``cuda``: whether this machine has CUDA (default: ask torch). Returns the variables
    it set."""
    env = os.environ if environ is None else environ
    set_: dict[str, str] = {}

    def default(k, v):
        if k not in env:
            env[k] = v
            set_[k] = v

    if environ is None:
        quiet_launcher_interrupt()
    default("TOKENIZERS_PARALLELISM", "false")
    default("HF_HUB_OFFLINE", "1")
    alloc, has_cuda = set_cuda_allocator(environ, cuda)
    set_.update(alloc)
    if not has_cuda:
        default("DS_ACCELERATOR", "cpu")
    for k, v in DIST_DEFAULTS.items():
        default(k, v)
    default("MASTER_PORT", str(free_port()))
    return set_


def under_launcher(argv: list[str] | None = None, environ=None) -> bool:
    """Whether a launcher started this process: DeepSpeed's passes ``--local_rank=N`` to the script, torchrun sets
    ``TORCHELASTIC_RUN_ID`` (not ``LOCAL_RANK`` alone: :func:`setup_env` sets that one for a plain run)."""
    argv = sys.argv[1:] if argv is None else argv
    env = os.environ if environ is None else environ
    return any(a.startswith(("--local_rank", "--local-rank")) for a in argv) or "TORCHELASTIC_RUN_ID" in env


def quiet_launcher_interrupt() -> bool:
    """Under a launcher (:func:`under_launcher`), in the main thread: SIGINT raises KeyboardInterrupt as always (the
    run ends with its "interrupted: ..." line) and a SIGTERM after it is ignored (the launcher's, sent at once: see
    the module doc); a SIGTERM alone ends the process as before. Returns whether the handlers were installed."""
    if not under_launcher() or threading.current_thread() is not threading.main_thread():
        return False
    interrupted: list[int] = []

    def on_sigint(signum, frame):
        interrupted.append(signum)
        raise KeyboardInterrupt

    def on_sigterm(signum, frame):
        if interrupted:
            return  # the launcher's SIGTERM right after Ctrl-C: the interrupt is already ending the run
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGINT, on_sigint)
    signal.signal(signal.SIGTERM, on_sigterm)
    return True


ACCELERATOR_PTH = "ropescale_ds_accelerator.pth"  # in the venv's site-packages (written by scripts/setup.sh)
# the launcher's own process (.venv/bin/deepspeed): Ctrl-C waits for the job (which prints how to resume) instead of
# a KeyboardInterrupt traceback in its wait(); a second Ctrl-C exits at once (130). Nothing in any other process.
LAUNCHER_SIGINT = ("import os, sys; os.path.basename(sys.argv[0] if sys.argv else '') == 'deepspeed' and "
                   "__import__('signal').signal(2, (lambda seen: lambda s, f: seen.append(s) if not seen else "
                   "sys.exit(130))([]))")


def accelerator_pth_text() -> str:
    """The ``.pth`` lines (run by ``site`` when Python starts): ``DS_ACCELERATOR=cpu`` unless it is set or the
    machine has a GPU device node that ``CUDA_VISIBLE_DEVICES`` does not hide (as ``cuda_available``); in
    DeepSpeed's runner, a quiet Ctrl-C (:data:`LAUNCHER_SIGINT`)."""
    return ("import os; os.environ.get('DS_ACCELERATOR') or (os.environ.get('CUDA_VISIBLE_DEVICES', 'x').strip() "
            f"not in ('', '-1') and any(map(os.path.exists, {GPU_DEVICE_NODES!r}))) or "
            "os.environ.__setitem__('DS_ACCELERATOR', 'cpu')\n" + LAUNCHER_SIGINT + "\n")


def write_accelerator_pth(site_dir: str | os.PathLike | None = None) -> Path:
    """Write :data:`ACCELERATOR_PTH` into ``site_dir`` (default: this Python's site-packages); returns its path."""
    import sysconfig

    p = Path(site_dir or sysconfig.get_paths()["purelib"]) / ACCELERATOR_PTH
    from ropescale.common.io import write_text_atomic

    write_text_atomic(p, accelerator_pth_text())
    return p


def port_in_use(port: int) -> bool:
    """Whether ``port`` cannot be listened on here (another job's rendezvous holds it): bound as torch's TCPStore
    binds it (every interface, SO_REUSEADDR: a port left in TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


def check_master_port(log=None, environ: dict | None = None) -> None:
    """Before the process group starts, on rank 0 (the one that listens on ``MASTER_PORT``): a port another job
    holds is, alone (world size 1: no other rank to tell), replaced by a free one (noted through ``log``); in a
    job of several ranks, an InputError in one line saying which flag picks another."""
    env = os.environ if environ is None else environ
    if env.get("RANK", "0") != "0" or not env.get("MASTER_PORT", "").isdigit():
        return
    port = int(env["MASTER_PORT"])
    if not port_in_use(port):
        return
    if env.get("WORLD_SIZE", "1") == "1":
        env["MASTER_PORT"] = str(free_port())
        if log is not None:
            log(f"[finetune] rendezvous port {port} is in use (another job?): using {env['MASTER_PORT']}")
        return
    from ropescale.common.io import InputError

    raise InputError(f"the rendezvous port MASTER_PORT={port} is in use (another job?): run the launcher with "
                     f"--master_port N, a free port (e.g. deepspeed --master_port {free_port()} finetune.py ...)")


def disable_shm_comm() -> None:
    """Keep DeepSpeed from JIT-compiling its CPU shared-memory comm op (gloo is used instead)."""
    if os.environ.get("ROPESCALE_DS_SHM") == "1":
        return
    from ropescale.common.compat import disable_deepspeed_shm_op

    disable_deepspeed_shm_op()


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0
