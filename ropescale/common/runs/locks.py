"""One writer per run directory: the writer holds an advisory ``flock`` on ``.lock`` in it (:func:`lock_run_dir`;
the kernel drops it when the process dies, however it dies); a second writer is refused naming the holder's pid;
:func:`run_dir_holder` says whether a directory is held now (what "running" means in a run record)."""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..io import InputError

# ---------------------------------------------------------------- one writer per run directory
LOCK_FILE = ".lock"  # in the run directory: flock'ed by its writer; holds "pid host" of that writer


@dataclass
class _Held:
    fd: int
    created: list[Path]  # the directories this process made to hold the lock (removed again when left empty)


_held: dict[str, _Held] = {}


def _dist_rank() -> int:
    """This process's rank under a launcher (torchrun / deepspeed set RANK), 0 alone."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def lock_run_dir(path: str | os.PathLike, *, what: str = "--out") -> None:
    """Hold ``path`` for this process: an exclusive ``fcntl.flock`` on ``path/.lock`` (the directory is made if
    need be), released by the kernel when the process ends. Another process holding it: an InputError naming its
    pid and host. Held already by this process: nothing to do. Under a launcher only rank 0 takes it (the ranks of
    one job are one writer: rank 0 writes the run record; another job's rank 0 is refused)."""
    p = Path(path)
    key = os.path.abspath(p)
    if key in _held or _dist_rank() != 0:
        return
    created = [d for d in (p, *p.parents) if not d.exists()]
    p.mkdir(parents=True, exist_ok=True)
    lock = p / LOCK_FILE
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
            os.close(fd)
            who = f"pid {holder[0]}" + (f" on {holder[1]}" if len(holder) > 1 else "") if holder else "another process"
            raise InputError(f"another process is writing this run directory ({who}): wait for it to end, stop it, "
                             f"or use another {what}", p) from None
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                break  # the file still at that name: ours (not one a leaving holder just unlinked)
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    _held[key] = _Held(fd, created)


def run_dir_holder(path: str | os.PathLike) -> tuple[bool, str | None]:
    """(whether a process holds run directory ``path`` now, the pid its lock file names: the holder's, or the last
    one's when it was killed before it could clean up). Asked with a shared lock taken and dropped at once."""
    lock = Path(path) / LOCK_FILE
    if os.path.abspath(path) in _held:
        return True, str(os.getpid())
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False, None
    try:
        words = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            held = False
        except BlockingIOError:
            held = True
    finally:
        os.close(fd)  # (drops the shared lock)
    return held, words[0] if words else None


def release_run_dirs(keys: Iterable[str] | None = None) -> None:
    """Give up the run directories this process holds (``keys``: those of :func:`lock_run_dir`, default all): the
    lock file goes, and so do the directories made only to hold it when nothing else was written into them (a run
    refused after its checks leaves nothing behind)."""
    for key in list(_held) if keys is None else [k for k in keys if k in _held]:
        h = _held.pop(key)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(key, LOCK_FILE))  # unlinked before the lock drops: a waiter re-checks the name
        os.close(h.fd)
        for d in h.created:
            with contextlib.suppress(OSError):
                d.rmdir()  # only when empty


atexit.register(release_run_dirs)


@contextlib.contextmanager
def run_dir_scope():
    """The run directories taken inside the block (or the decorated call) are given up when it ends, however it
    ends: what a library call such as ``generate(...)`` opened is free again when it returns or raises."""
    before = set(_held)
    try:
        yield
    finally:
        release_run_dirs([k for k in _held if k not in before])
