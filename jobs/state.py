"""State files of the jobs (how an interrupted job resumes) and the lock that keeps two runs apart.

A state file is JSON written atomically (a temporary file renamed over the old one), so an interruption at any
moment leaves either the previous state or the new one, never half of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from schemas.validation import micros_iso


class Busy(RuntimeError):
    """Another run holds the lock."""


def write_json_atomic(path: Path, data: object) -> None:
    """Replace `path` with `data`, durably: the new content reaches the disk before the rename, and the rename before
    this returns (a power loss could otherwise leave an empty file, or the old one, after the job went on: a replay's
    list of counters still to recount lost, their restored events never counted)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read_json(path: Path) -> dict:
    """The state saved at `path`, or {} when there is none (or it cannot be read)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def fmt_time(us: int | None) -> str:
    """Epoch µs as ISO-8601 UTC with microseconds; '-' for none."""
    if us is None or us <= 0:
        return "-"
    return micros_iso(us)


def safe_name(name: str) -> str:
    """A user-given name as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:120]


def lock_beside(state: Path) -> Path:
    """The lock file of a job's state file (`exclusive`): one run at a time on that state."""
    return state.with_name(state.name + ".lock")


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an advisory lock on `path` (created if missing) for the block; Busy when another process has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(str(path)) from None
        yield
