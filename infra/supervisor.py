"""Keep `counter up`'s children running: restart the ones that may be restarted, give up on the others.

A worker, the API or memcached that dies is restarted with exponential backoff, on the same port and with
the same environment, and every death and restart is reported with the exit status and the end of the
child's log. A child whose death must not be papered over (the in-memory broker: acknowledged writes not yet
persisted die with it) makes `tick()` return it, and the caller stops everything.

Driven by polling from one long-lived thread (`counter up`'s main thread), which is also the thread that
forks the restarted children, as PR_SET_PDEATHSIG requires (see infra.parent_death).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from infra.process import ManagedProcess, ServiceError

Report = Callable[[str, str], None]  # (level: "info" | "warning" | "error", message)


@dataclass
class Backoff:
    """Delay before the next restart: `initial_s` doubling up to `max_s`; back to `initial_s` once the
    process has stayed up for `stable_s` (a crash an hour after the last one is not a crash loop)."""

    initial_s: float = 0.5
    max_s: float = 30.0
    stable_s: float = 60.0
    failures: int = 0

    def next_delay(self) -> float:
        delay = min(self.initial_s * 2 ** self.failures, self.max_s)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


class State(Enum):
    STARTING = "starting"  # spawned, not ready yet
    UP = "up"
    WAITING = "waiting"  # dead, restart scheduled


@dataclass
class Supervised:
    process: ManagedProcess
    restart: bool
    ready_timeout_s: float
    consequence: str
    backoff: Backoff
    state: State = State.UP
    since: float = field(default_factory=time.monotonic)  # when the current state began
    restart_at: float = 0.0
    restarts: int = 0


class Supervisor:
    """Polls its processes; `tick()` restarts the dead restartable ones and returns a fatal dead one."""

    def __init__(self, report: Report, on_change: Callable[[], None] = lambda: None, *,
                 backoff: Callable[[], Backoff] = Backoff, log_lines: int = 15,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._report = report
        self._on_change = on_change  # a pid changed (died, restarted): e.g. rewrite the endpoints file
        self._backoff = backoff
        self._log_lines = log_lines
        self._clock = clock
        self.watched: list[Supervised] = []

    def watch(self, process: ManagedProcess, *, restart: bool, ready_timeout_s: float | None = None,
              consequence: str = "", ready: bool = True) -> None:
        """Supervise a started process (`ready=False`: spawned, not ready yet). It may take `ready_timeout_s`
        (default: as long as its first start was given) to become ready after a restart; `consequence`
        explains a fatal death to the operator."""
        timeout = ready_timeout_s if ready_timeout_s is not None else process.start_timeout
        self.watched.append(Supervised(process, restart, timeout, consequence, self._backoff(),
                                       state=State.UP if ready else State.STARTING, since=self._clock()))

    def tick(self) -> ManagedProcess | None:
        """One supervision pass; returns a process whose death must stop everything, if one died."""
        for item in self.watched:
            fatal = self._tick_one(item)
            if fatal is not None:
                return fatal
        return None

    def _tick_one(self, item: Supervised) -> ManagedProcess | None:
        now = self._clock()
        process = item.process
        if item.state is State.WAITING:
            if now >= item.restart_at:
                self._respawn(item, now)
            return None
        if process.reap() is not None:
            return self._died(item, now)
        if item.state is State.STARTING:
            if process.ready():
                self._set(item, State.UP, now)
                self._report("info", f"{process.name} is up again (pid {process.pid}, restart "
                                     f"#{item.restarts}, ready after {now - process.started_at:.1f}s)")
            elif now - item.since > item.ready_timeout_s:
                self._report("warning", f"{process.name} (pid {process.pid}) did not become ready within "
                                        f"{item.ready_timeout_s:g}s; killing it")
                process.kill()
                return self._died(item, now)
        elif now - item.since >= item.backoff.stable_s:
            item.backoff.reset()
        return None

    def _died(self, item: Supervised, now: float) -> ManagedProcess | None:
        process = item.process
        self._on_change()
        tail = process.log_tail(self._log_lines)
        what = (f"{process.name} (pid {process.popen.pid}) died: {process.exit_description()}, after "
                f"{now - process.started_at:.1f}s; last lines of {process.log_path}:\n{_indent(tail)}")
        if "address already in use" in tail.lower():  # taken after `counter up` checked it (a review: two stacks)
            what += (f"\n{process.name}'s port {process.port} is held by another process: stop that one, or give "
                     f"this {process.name} another port")
        if not item.restart:
            self._report("error", what + (f"\n{item.consequence}" if item.consequence else ""))
            return process
        delay = item.backoff.next_delay()
        item.restart_at = now + delay
        self._set(item, State.WAITING, now)
        self._report("error", f"{what}\nrestarting {process.name} in {delay:.1f}s")
        return None

    def _respawn(self, item: Supervised, now: float) -> None:
        process = item.process
        item.restarts += 1
        try:
            process.spawn()
        except ServiceError as exc:
            delay = item.backoff.next_delay()
            item.restart_at = now + delay
            self._report("error", f"{exc}; retrying in {delay:.1f}s")
            return
        self._set(item, State.STARTING, now)
        self._on_change()
        self._report("info", f"restarted {process.name} (pid {process.pid}, restart #{item.restarts}) on "
                             f"{process.address}; waiting until it is ready")

    @staticmethod
    def _set(item: Supervised, state: State, now: float) -> None:
        item.state = state
        item.since = now


def _indent(text: str) -> str:
    return "\n".join(f"  | {line}" for line in text.splitlines()) or "  | (empty)"
