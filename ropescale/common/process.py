"""What a process sets up before torch / DeepSpeed are imported: the CUDA allocator, quiet libraries, and for
training DeepSpeed's accelerator, the rendezvous and the launcher's interrupt.

- Every entry point runs :func:`prepare_process` first: the CUDA allocator setting (before torch starts CUDA),
  library warnings nobody here can act on filtered, DeepSpeed's and transformers' loggers sent to stderr.
- finetune's entry (``finetune.py``, ``ropescale finetune``) runs :func:`setup_env` before it, for what training
  needs:

  - On a machine without CUDA, DeepSpeed must use its CPU accelerator (``DS_ACCELERATOR=cpu``) and the gloo
    backend; otherwise it probes for GPUs and fails.
  - ``python finetune.py`` without a launcher still goes through ``torch.distributed`` (DeepSpeed and the HF
    Trainer expect a process group), so the rendezvous variables get single-process defaults.
  - DeepSpeed's CPU communication op (``deepspeed_shm_comm``) is compiled just-in-time on first use (minutes on a
    small machine); gloo does the same job for the tiny CPU runs, so the op is turned off unless
    ``ROPESCALE_DS_SHM=1``.
  - The CUDA allocator setting every entry point makes (:func:`set_cuda_allocator`).
  - A rendezvous port another job holds (the launchers' default 29500): :func:`check_master_port`, before the
    process group starts.
  - DeepSpeed's own launcher (``deepspeed finetune.py ...``) picks its accelerator before finetune.py runs and, on a
    machine without a GPU, says so on stdout ("Setting accelerator to CPU"), which breaks ``--json | python -m
    json.tool``; nothing in DeepSpeed turns that line off but ``DS_ACCELERATOR``. Set-up (scripts/setup.sh) therefore
    writes a ``.pth`` file into the virtual environment (:func:`write_accelerator_pth`) that sets
    ``DS_ACCELERATOR=cpu`` when Python starts there on a machine without a GPU device node (the check
    ``cuda_available`` makes; no import) and the variable is not set already.
  - Ctrl-C under the launcher reaches every process of the terminal's group: DeepSpeed's runner
    (``.venv/bin/deepspeed``) raises KeyboardInterrupt in its ``wait()`` (a 15-line traceback), and
    ``deepspeed.launcher.launch`` sends the training process SIGTERM at once (``terminate_process_tree``), killing it
    before it can print its "interrupted: ... --resume auto" line. The training process therefore takes SIGINT once
    and ignores the SIGTERM that follows it (:func:`quiet_launcher_interrupt`), and the same ``.pth`` file gives the
    runner a SIGINT handler that waits for its child instead of a traceback (a second Ctrl-C ends it at once, exit
    130).
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import warnings
from pathlib import Path

from . import compat


def quiet_libraries() -> None:
    """Filter library warnings we cannot act on; send library loggers that default to stdout to stderr."""
    for category, message, module in compat.QUIET_WARNINGS:  # library warnings about themselves
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    logs_to_stderr()


def logs_to_stderr() -> None:
    """DeepSpeed's logger writes to stdout; under the launcher that mixes logs into results. Point every stream
    handler of the loggers we know at stderr (call again after importing deepspeed)."""
    for name in compat.STDOUT_LOGGERS:
        log = logging.getLogger(name)
        for h in log.handlers:
            if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is sys.stdout:
                h.setStream(sys.stderr)


# The CUDA caching allocator uses expandable segments unless the user chose (PYTORCH_CUDA_ALLOC_CONF, or its newer
# name PYTORCH_ALLOC_CONF): long samples and prompts of varying length fragment fixed segments (a 7B model at 128K
# tokens ran out of memory at step 3 without it and trained in 68 GiB with it, on an 80 GB H100). The variable is
# read when CUDA's allocator starts, so it is set before torch is imported; when torch already started CUDA, the
# allocator is switched at run time instead.
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # the first is the one set
ALLOC_CONF = "expandable_segments:True"


GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")  # NVIDIA, ROCm (HIP), WSL's GPU


def cuda_available() -> bool:
    """Whether this machine has a CUDA (or ROCm) GPU, answered without importing torch (seconds, which every
    ``--help`` would pay): a driver's device node is there (:data:`GPU_DEVICE_NODES`) and ``CUDA_VISIBLE_DEVICES``
    does not hide every device. Once torch is imported, torch's own answer."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return bool(torch.cuda.is_available())
        except Exception:  # a broken driver: treat as CPU
            return False
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return any(os.path.exists(d) for d in GPU_DEVICE_NODES)


def set_cuda_allocator(environ: dict | None = None, cuda: bool | None = None) -> tuple[dict, bool]:
    """(the variables set, whether this machine has CUDA): expandable segments on CUDA unless the user set an
    allocator configuration; nothing on a machine without CUDA. ``cuda`` None: :func:`cuda_available` (no torch
    import)."""
    env = os.environ if environ is None else environ
    user = any(k in env for k in ALLOC_CONF_VARS)
    if not user:
        env[ALLOC_CONF_VARS[0]] = ALLOC_CONF
    has_cuda = cuda_available() if cuda is None else cuda
    if user:
        return {}, has_cuda
    if not has_cuda:
        del env[ALLOC_CONF_VARS[0]]
        return {}, has_cuda
    if environ is None:
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                torch.cuda.memory._set_allocator_settings(ALLOC_CONF)  # no public setter
        except Exception:  # an older torch without the setter: keep the default allocator
            pass
    return {ALLOC_CONF_VARS[0]: ALLOC_CONF}, has_cuda


def prepare_process() -> None:
    """What every entry point runs first: the CUDA allocator setting (before torch starts CUDA) and quiet
    libraries. finetune's entry runs :func:`setup_env` before it."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no fork warnings from the tokenizers' threads
    set_cuda_allocator()
    quiet_libraries()


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
    from .io import write_text_atomic

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
    from .io import InputError

    raise InputError(f"the rendezvous port MASTER_PORT={port} is in use (another job?): run the launcher with "
                     f"--master_port N, a free port (e.g. deepspeed --master_port {free_port()} finetune.py ...)")


def disable_shm_comm() -> None:
    """Keep DeepSpeed from JIT-compiling its CPU shared-memory comm op (gloo is used instead)."""
    if os.environ.get("ROPESCALE_DS_SHM") == "1":
        return
    compat.disable_deepspeed_shm_op()


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0
