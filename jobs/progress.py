"""What a job tells its caller while it runs: a small protocol the CLI implements with a rich progress bar.

    progress.start("replaying", total=120_000, unit="records")
    progress.advance(250, note="12 new events")
    progress.update(total=130_000)          # the estimate grew
    progress.log("recounted ns:c ...")      # a line for the user (level: info | warning)
    progress.finish()                       # this phase is over (a job may have several phases)

A job also takes a stop signal: any `() -> bool` (the CLI's SIGINT flag, `threading.Event().is_set`, ...),
checked between units of work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

Level = Literal["info", "warning"]
Stop = Callable[[], bool]


def never() -> bool:
    """A stop signal that never fires."""
    return False


class Progress(Protocol):
    def start(self, description: str, *, total: int | None = None, unit: str = "records",
              completed: int = 0) -> None:
        """A phase begins: `total` units (None: unknown), `completed` of them done already (a resumed run)."""

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        """`n` more units done; `note` is a short status shown beside the bar."""

    def update(self, *, total: int | None = None, note: str | None = None) -> None:
        """A new estimate of the total, or a new note."""

    def log(self, message: str, *, level: Level = "info") -> None:
        """A line for the user (plain text, no markup)."""

    def finish(self) -> None:
        """The current phase is over."""


class NullProgress:
    """Reports nothing (library use, tests)."""

    def start(self, description: str, *, total: int | None = None, unit: str = "records",
              completed: int = 0) -> None:
        pass

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        pass

    def update(self, *, total: int | None = None, note: str | None = None) -> None:
        pass

    def log(self, message: str, *, level: Level = "info") -> None:
        pass

    def finish(self) -> None:
        pass
