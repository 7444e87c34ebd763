"""Process environment for training, set up before torch / DeepSpeed are imported.

- On a machine without CUDA, DeepSpeed must use its CPU accelerator (``DS_ACCELERATOR=cpu``) and the gloo
  backend; otherwise it probes for GPUs and fails.
- ``python finetune.py`` without a launcher still goes through ``torch.distributed`` (DeepSpeed and the HF
  Trainer expect a process group), so the rendezvous variables get single-process defaults.
- DeepSpeed's CPU communication op (``deepspeed_shm_comm``) is compiled just-in-time on first use (minutes on a
  small machine); gloo does the same job for the tiny CPU runs, so the op is turned off unless
  ``ROPESCALE_DS_SHM=1``.
- On CUDA the caching allocator uses expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``)
  unless the user set ``PYTORCH_CUDA_ALLOC_CONF`` (or its newer name ``PYTORCH_ALLOC_CONF``): long samples of
  varying length fragment fixed segments (a 7B model at 128K tokens ran out of memory at step 3 without it and
  trained in 68 GiB with it, on an 80 GB H100). The variable is read when CUDA's allocator starts, so it is set
  before torch is imported; when torch already started CUDA, the allocator is switched at run time instead.
"""
from __future__ import annotations

import os
import socket

DIST_DEFAULTS = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1"}


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch / broken driver: treat as CPU
        return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # the first is the one set
ALLOC_CONF = "expandable_segments:True"


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
    user_alloc = any(k in env for k in ALLOC_CONF_VARS)
    if not user_alloc:  # before the torch import below: the allocator reads it when CUDA starts
        env[ALLOC_CONF_VARS[0]] = ALLOC_CONF
    has_cuda = cuda_available() if cuda is None else cuda
    if not user_alloc:
        if has_cuda:
            set_[ALLOC_CONF_VARS[0]] = ALLOC_CONF
            if environ is None:
                _apply_alloc_conf_if_started()
        else:
            del env[ALLOC_CONF_VARS[0]]
    if not has_cuda:
        default("DS_ACCELERATOR", "cpu")
    for k, v in DIST_DEFAULTS.items():
        default(k, v)
    default("MASTER_PORT", str(free_port()))
    return set_


def _apply_alloc_conf_if_started() -> None:
    """torch imported and CUDA started before setup_env (e.g. by a caller): switch the running allocator."""
    import sys

    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.memory._set_allocator_settings(ALLOC_CONF)  # noqa: SLF001 - no public setter
    except Exception:  # noqa: BLE001 - an older torch without the setter: keep the default allocator
        pass


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
