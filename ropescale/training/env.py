"""Process environment for training, set up before torch / DeepSpeed are imported.

- On a machine without CUDA, DeepSpeed must use its CPU accelerator (``DS_ACCELERATOR=cpu``) and the gloo
  backend; otherwise it probes for GPUs and fails.
- ``python finetune.py`` without a launcher still goes through ``torch.distributed`` (DeepSpeed and the HF
  Trainer expect a process group), so the rendezvous variables get single-process defaults.
- DeepSpeed's CPU communication op (``deepspeed_shm_comm``) is compiled just-in-time on first use (minutes on a
  small machine); gloo does the same job for the tiny CPU runs, so the op is turned off unless
  ``ROPESCALE_DS_SHM=1``.
- The CUDA allocator setting every entry point makes (``ropescale.common.cli.set_cuda_allocator``).
"""
from __future__ import annotations

import os
import socket

from ropescale.common.cli import set_cuda_allocator

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
