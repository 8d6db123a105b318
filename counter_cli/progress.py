"""The one progress bar every long-running verb shows: what, how far, how fast, and how long still.

`RichProgress` is the CLI's implementation of the jobs' `jobs.progress.Progress`: each phase a job starts
is one `ProgressBar`, and the job's log lines go to the same console. `Interrupt` is the jobs' stop signal.

    with ProgressBar("replaying", total=120_000, unit="records") as bar:
        for batch in batches:
            ...
            bar.advance(len(batch), note=f"{new:,} new")

It renders description, bar, done/total, rate (units/s) and ETA; with an unknown total (None) the bar pulses
and the ETA column shows the elapsed time instead, so rate and count are always visible. Output goes to
stderr (the shared console), so a verb's stdout stays clean for data (JSONL, CSV). On a non-terminal
stderr rich draws no live bar, only the final state when the bar closes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.text import Text

from counter_cli.common import console as default_console
from jobs.progress import Level


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}"


class _CountColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit", "")
        done = f"{int(task.completed):,}"
        text = done if task.total is None else f"{done}/{int(task.total):,}"
        return Text(f"{text} {unit}".rstrip(), style="progress.download")


class _RateColumn(ProgressColumn):
    """Recent speed (rich's sliding window), or this run's average before there is a window: without the units a
    resumed job had done before (the task's `initial` field), which would inflate it."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        if speed is None and task.elapsed:
            done = task.completed - task.fields.get("initial", 0)
            speed = done / task.elapsed if task.elapsed > 0 else None
        unit = task.fields.get("unit", "")
        if not speed:
            return Text(f"- {unit}/s", style="progress.data.speed")
        return Text(f"{speed:,.0f} {unit}/s", style="progress.data.speed")


class _EtaColumn(ProgressColumn):
    """ETA with a known total; elapsed time while the total is unknown (rate and count still show)."""

    max_refresh = 0.5

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text(f"elapsed {_clock(task.elapsed)}", style="progress.elapsed")
        if task.finished:
            return Text(f"done in {_clock(task.finished_time or task.elapsed)}", style="progress.elapsed")
        return Text(f"ETA {_clock(task.time_remaining)}", style="progress.remaining")


class ProgressBar:
    """A single-task rich progress bar with rate and ETA; a context manager."""

    def __init__(self, description: str, *, total: int | None = None, unit: str = "records",
                 console: Console | None = None, completed: int = 0) -> None:
        self.description = description
        self.unit = unit
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), _CountColumn(), _RateColumn(), _EtaColumn(),
            TextColumn("{task.fields[note]}"), console=console or default_console, transient=False,
            speed_estimate_period=10.0)
        self._task: TaskID = self._progress.add_task(description, total=total, completed=completed,
                                                     unit=unit, note="", initial=completed, start=False)
        self._started = time.monotonic()
        self._initial = completed

    def __enter__(self) -> ProgressBar:
        self._started = time.monotonic()
        self._progress.start()
        self._progress.start_task(self._task)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._progress.stop()

    @property
    def completed(self) -> int:
        return int(self._progress.tasks[0].completed)

    @property
    def total(self) -> int | None:
        total = self._progress.tasks[0].total
        return None if total is None else int(total)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    @property
    def rate(self) -> float:
        """Average units per second over this run (for summaries)."""
        return (self.completed - self._initial) / self.elapsed if self.elapsed > 0 else 0.0

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        if note is None:  # `note` is a field of the task: set only when given
            self._progress.update(self._task, advance=n)
        else:
            self._progress.update(self._task, advance=n, note=note)

    def update(self, *, completed: int | None = None, total: int | None = None, note: str | None = None) -> None:
        # rich leaves completed and total as they are when given None
        if note is None:
            self._progress.update(self._task, completed=completed, total=total)
        else:
            self._progress.update(self._task, completed=completed, total=total, note=note)

    def summary(self) -> str:
        """`1,234 records in 0:00:05 (246 records/s)`."""
        done = self.completed - self._initial
        return f"{done:,} {self.unit} in {_clock(self.elapsed)} ({self.rate:,.0f} {self.unit}/s)"


class RichProgress:
    """`jobs.progress.Progress` on the console: a `ProgressBar` per phase, log lines (plain text) above it.

    After a phase, `bar` is still its bar, for the summary (`bar.summary()`); a context manager that closes
    a phase left open."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or default_console
        self.bar: ProgressBar | None = None
        self._open = False

    def start(self, description: str, *, total: int | None = None, unit: str = "records",
              completed: int = 0) -> None:
        self.finish()
        self.bar = ProgressBar(description, total=total, unit=unit, console=self.console, completed=completed)
        self.bar.__enter__()
        self._open = True

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        if self.bar is not None:
            self.bar.advance(n, note=note)

    def update(self, *, total: int | None = None, note: str | None = None) -> None:
        if self.bar is not None:
            self.bar.update(total=total, note=note)

    def log(self, message: str, *, level: Level = "info") -> None:
        self.console.print(Text(message, style="yellow" if level == "warning" else ""), highlight=False)

    def finish(self) -> None:
        if self.bar is not None and self._open:
            self._open = False
            self.bar.__exit__(None, None, None)

    def summary(self) -> str:
        """The last phase's `ProgressBar.summary()` (empty before any phase)."""
        return self.bar.summary() if self.bar is not None else ""

    def __enter__(self) -> RichProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, `kill`, a closed terminal


class Interrupt:
    """SIGINT (or SIGTERM, SIGHUP) sets a flag the loops check between units of work, so the job saves where it
    is; a second one raises KeyboardInterrupt. (SIGTERM used to end a job without its save: a `kill` of `dlq
    replay` left its last chunk unrecorded.) `notice`, if given, is written at the first one: a job that then waits
    in a library call (a producer's flush) would otherwise say nothing until it returns."""

    def __init__(self, notice: str | None = None) -> None:
        self.requested = False
        self.notice = notice
        self._previous = {sig: signal.getsignal(sig) for sig in STOPS}

    def install(self) -> Interrupt:
        for sig in STOPS:
            if self._previous[sig] is not signal.SIG_IGN:  # `nohup`: a closed terminal must not stop the job
                signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __enter__(self) -> Interrupt:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.notice is not None:  # os.write: a print here could re-enter a write of the interrupted code
            with contextlib.suppress(OSError):  # stderr gone (a closed terminal's SIGHUP): the stop goes on (a review)
                os.write(2, f"{self.notice}\n".encode())

    def __call__(self) -> bool:
        return self.requested
