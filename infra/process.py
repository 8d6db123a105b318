"""A child service process (broker, memcached, worker, API) with a readiness wait and a clean stop.

One way to run local services, shared by `counter up` (which supervises them, see infra.supervisor), the test
harness and the benchmarks. Children never outlive the process that started them (infra.parent_death).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

from infra.parent_death import die_with_this_process


class ServiceError(RuntimeError):
    """A local service could not be started or did not become ready."""


def free_port(host: str = "127.0.0.1") -> int:
    """Ask the kernel for a port nobody is listening on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """True when GET `url` answers 2xx."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300
    except (OSError, urllib.error.URLError):
        return False


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None when there is no such
    process (or no /proc). Linux only, like the rest of the local stack's process handling."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T; True when /proc cannot tell)."""
    fields = proc_stat(pid)
    return fields is None or fields[0] in ("T", "t")


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll `condition` until it holds or `timeout` seconds pass; return whether it held."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class ManagedProcess:
    """A service started as a child process, logging to a file, stopped with SIGTERM then SIGKILL.

    The child runs in its own session (a Ctrl-C in the terminal reaches only the parent, which stops
    children in order) and gets `death_signal` if the parent dies, so a killed parent leaves nothing behind.
    Start it from the main thread or a long-lived one (see infra.parent_death). Whatever the child leaves in
    its process group (uvicorn's worker processes, say) is killed with it once it has exited.
    """

    name = "service"

    def __init__(self, argv: Sequence[str], *, host: str, port: int, log_path: Path,
                 env: dict[str, str] | None = None, ready_path: str | None = None, name: str | None = None,
                 death_signal: int | None = signal.SIGKILL) -> None:
        self.argv = list(argv)
        self.host = host
        self.port = port
        self.log_path = log_path
        self.env = env
        self.ready_path = ready_path
        if name is not None:
            self.name = name
        self.death_signal = death_signal
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.log_start = 0  # the log's size when this run of the child started: its lines are after it
        self.start_timeout = 20.0  # how long it may take to become ready; a supervisor's restarts get as long

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def popen(self) -> subprocess.Popen[bytes]:
        """The child once spawned (ServiceError before)."""
        if self.proc is None:
            raise ServiceError(f"{self.name} was never spawned")
        return self.proc

    @property
    def pid(self) -> int | None:
        """The child's pid while it has not been seen to exit, else None."""
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    def start(self, timeout: float = 20.0) -> Self:
        """Spawn the child and wait until it is ready; a child that exits or stays unready raises ServiceError."""
        self.start_timeout = timeout
        self.spawn()
        if not wait_until(lambda: self._exited() or self.ready(), timeout):
            self.stop()
            raise ServiceError(f"{self.name} did not answer on {self.address} within {timeout:.0f}s; "
                               f"see {self.log_path}")
        if (code := self.reap()) is not None:
            raise ServiceError(f"{self.name} exited with code {code}; see {self.log_path}:\n"
                               + self.log_tail())
        return self

    def spawn(self) -> Self:
        """Start the child without waiting for it to be ready (a supervisor polls `ready()` instead)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.log_start = self.log_path.stat().st_size  # the log goes on across runs (restarts, `counter up` again)
        preexec = die_with_this_process(self.death_signal) if self.death_signal is not None else None
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})}, start_new_session=True, preexec_fn=preexec,
            )
        except OSError as exc:
            raise ServiceError(f"{self.name}: cannot run {self.argv[0]}: {exc}") from exc
        finally:
            log.close()
        self.started_at = time.monotonic()
        return self

    def ready(self) -> bool:
        """Whether the service answers: GET ready_path is 2xx, or else the port accepts connections."""
        if self.ready_path:
            return http_ok(f"http://{self.host}:{self.port}{self.ready_path}")
        return port_open(self.host, self.port)

    def running(self) -> bool:
        return self.proc is not None and not self._exited()

    def reap(self) -> int | None:
        """The exit status once the child has exited (negative: killed by that signal), else None.

        Kills what the child left in its process group before reaping it: until it is reaped its pid (the
        group's id) cannot be reused, so the group signal cannot hit an unrelated process.
        """
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            state = self._state()
            if state == "running":
                return None
            if state == "zombie":
                self._kill_group()
            self.proc.wait()
        return self.proc.returncode

    def exit_description(self) -> str:
        """'exit code 1' or 'killed by SIGKILL' for a child that has exited."""
        code = self.proc.returncode if self.proc is not None else None
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): it keeps its port but answers nothing, like a hung host. Returns once
        the kernel reports it stopped: SIGSTOP is delivered asynchronously, and a request sent in between could
        still be answered by one of its threads."""
        if self.running():
            os.kill(self.popen.pid, signal.SIGSTOP)
            wait_until(lambda: _stopped(self.popen.pid), timeout=2.0, interval=0.001)

    def resume(self) -> None:
        if self.running():
            os.kill(self.popen.pid, signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; then end whatever it left in its process group."""
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
        if not wait_until(self._exited, timeout):
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            wait_until(self._exited, timeout)
        if self.reap() is None:
            raise ServiceError(f"{self.name} (pid {self.proc.pid}) did not exit after SIGKILL")

    def kill(self) -> None:
        """SIGKILL the child and its process group now, and reap it."""
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        wait_until(self._exited, 10.0)
        if self.reap() is None:
            raise ServiceError(f"{self.name} (pid {self.proc.pid}) did not exit after SIGKILL")

    def _exited(self) -> bool:
        """Whether the child has exited (reaped or not); never reaps it."""
        return self.proc is None or self.proc.returncode is not None or self._state() != "running"

    def _state(self) -> str:
        """'running', 'zombie' (exited, not reaped: its pid is still ours) or 'reaped' (by someone else)."""
        try:
            exited = os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return "reaped"
        return "running" if exited is None else "zombie"

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines this run of the child logged (not an earlier run's: a death report quoting those
        would mislead)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_start)
                return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> ManagedProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
