"""Build the compiled parts before the service's processes start, so `counter up` runs what the benchmarks measure.

Two parts run in C when built: the persist path's Avro readers (`python -m schemas.compile`, mypyc) and the API's
plain AddCount (`python -m query_api.plain_add`, the C compiler). Each process loads its build only while the
build's stamp matches the source, and otherwise runs the Python code, correctly but slower (three times the API's
Python per plain AddCount, twice the worker's decoding per mutation: bench/RESULTS.md). Only `make run` used to
build them: a user who ran `counter up` from a plain install got the slow paths without knowing. Each build command
does nothing when its build is current, so this costs a process start per part after the first time.

The commands run as child processes: the CLI never imports `query_api` (the layering of pyproject.toml), and a
build's failure (no compiler, no mypy, a read-only install) is reported, not raised: the service still runs.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

BUILD_TIMEOUT_S = 300.0  # mypyc takes about 5 s here; a stuck compiler must not hold start-up for ever


@dataclass(frozen=True)
class NativePart:
    module: str  # `python -m <module> --quiet` builds it when stale
    what: str  # for the report


PARTS = (NativePart("schemas.compile", "the worker's Avro readers (mypyc)"),
         NativePart("query_api.plain_add", "the API's plain AddCount (C)"))


@dataclass(frozen=True)
class BuildOutcome:
    part: NativePart
    ok: bool
    message: str  # what the build command printed ("" when its build was already current)

    @property
    def summary(self) -> str:
        """One line: for a failed build the command's first (what runs without it) and last (the compiler's
        complaint); else what it built, or that it was current."""
        lines = [line for line in self.message.splitlines() if line.strip()] or [""]
        if not self.ok:
            return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1].strip()}"
        return f"{self.part.what}: {lines[0] or 'current'}"


def ensure_native_builds(report: Callable[[BuildOutcome], None] | None = None,
                         parts: tuple[NativePart, ...] = PARTS) -> list[BuildOutcome]:
    """Build every stale part, in this interpreter's environment; the outcomes, each also given to `report`."""
    outcomes = []
    for part in parts:
        try:
            done = subprocess.run([sys.executable, "-m", part.module, "--quiet"], capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S)
            ok, message = done.returncode == 0, (done.stdout + done.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            ok, message = False, str(exc)
        outcome = BuildOutcome(part, ok, message)
        outcomes.append(outcome)
        if report is not None:
            report(outcome)
    return outcomes
