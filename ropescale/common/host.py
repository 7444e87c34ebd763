"""The host machine, without importing torch (a process that only starts and watches others, such as
bench/bench_train_path.py's, should not pay seconds for it)."""
from __future__ import annotations


def available_host_bytes() -> int:
    """Memory the system can still give (psutil's ``available``, else MemAvailable of /proc/meminfo)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("cannot tell the available host memory (no psutil, no MemAvailable in /proc/meminfo)")
