"""A training process keeps the memory it frees, to reuse it next step.

glibc hands big blocks (from 128 KiB, adaptively up to 32 MiB) to the kernel with munmap
when they are freed and trims the top of its heap; a training step's numpy temporaries
are such blocks, so every step faults its memory back in and the kernel zeroes each
page again. On an MLP of 8 Linears of 1024 x 1024 trained by 2 CPU ranks that was a fifth
of the step (``benchmarks/memory.py``). Like PyTorch's caching allocators, ``unity run``
and ``unity profile`` therefore raise both thresholds so freed blocks stay in the heap:
the process holds on to its peak memory. ``UNITY_KEEP_FREED_MEMORY=0`` leaves glibc's
defaults. Elsewhere than Linux with glibc it does nothing.
"""
from __future__ import annotations

import ctypes
import gc
import os
import resource
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_LARGE = 1 << 30          # no block a step allocates is this big
_GLIBC_MMAP_MAX = 32 << 20  # the largest mmap threshold older glibc accepts


def keep_freed_memory(environ: dict[str, str] | None = None) -> bool:
    """Keep freed blocks for reuse (see the module docstring); True if it took effect."""
    env = os.environ if environ is None else environ
    if env.get("UNITY_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mapped = mallopt(_M_MMAP_THRESHOLD, _LARGE) or mallopt(_M_MMAP_THRESHOLD, _GLIBC_MMAP_MAX)
    return bool(mapped and mallopt(_M_TRIM_THRESHOLD, _LARGE))


def resident() -> tuple[int, int]:
    """This process's resident memory now and at its peak (since :func:`reset_peak`), in bytes:
    Linux's ``VmRSS`` and ``VmHWM``; elsewhere the peak ``getrusage`` reports, for both."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = int(peak if sys.platform == "darwin" else peak * 1024)
        return peak, peak


def reset_peak() -> None:
    """Return freed memory to the system and start the peak over from what is resident now
    (Linux: ``malloc_trim``, then ``clear_refs``), so that the peak measured next is of what
    follows (a training step's), not of loading the model. Elsewhere it does nothing."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
