"""Children that die with their parent: Linux's PR_SET_PDEATHSIG, set between fork and exec.

Without it, a `counter up` (or a test run) killed with SIGKILL leaves its broker, memcached, worker and API
running, holding ports and, for the in-memory broker, data nobody can reach any more.

The kernel sends the signal when the *thread* that forked the child exits, not the process: spawn children
from the main thread, or from a thread that lives as long as the children should.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
# The orphan's exit status is never read by us (the parent is gone); this just marks a deliberate exit.
EXIT_PARENT_GONE = 128 + signal.SIGKILL


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# Resolved once in the parent, so the forked child only makes the call (no library loading after fork).
_PRCTL = _load_prctl()


def supported() -> bool:
    """Whether children can be tied to their parent's life on this platform."""
    return _PRCTL is not None


def die_with_this_process(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen: the child gets `sig` when the calling thread's process dies.

    After prctl the child checks that its parent is still the process that forked it: if that parent died
    between fork and prctl, the signal will never come, so the child exits at once instead of running orphaned.
    None where the platform has no PR_SET_PDEATHSIG (the child then simply outlives a killed parent).
    """
    prctl = _PRCTL
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(EXIT_PARENT_GONE)

    return preexec
