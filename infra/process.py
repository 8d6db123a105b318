"""A child service process (broker, memcached) with a free port, a readiness wait and a clean stop.

One way to run local services, shared by `counter up` and the test harness.
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
    """A service started as a child process, logging to a file, stopped with SIGTERM then SIGKILL."""

    name = "service"

    def __init__(self, argv: Sequence[str], *, host: str, port: int, log_path: Path,
                 env: dict[str, str] | None = None, ready_path: str | None = None) -> None:
        self.argv = list(argv)
        self.host = host
        self.port = port
        self.log_path = log_path
        self.env = env
        self.ready_path = ready_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})}, start_new_session=True,
            )
        except OSError as exc:
            raise ServiceError(f"{self.name}: cannot run {self.argv[0]}: {exc}") from exc
        finally:
            log.close()
        if not wait_until(lambda: self.proc.poll() is not None or self.ready(), timeout):
            self.stop()
            raise ServiceError(f"{self.name} did not answer on {self.address} within {timeout:.0f}s; "
                               f"see {self.log_path}")
        if self.proc.poll() is not None:
            raise ServiceError(f"{self.name} exited with code {self.proc.returncode}; see {self.log_path}:\n"
                               + self.log_tail())
        return self

    def ready(self) -> bool:
        """Whether the service answers: GET ready_path is 2xx, or else the port accepts connections."""
        if self.ready_path:
            return http_ok(f"http://{self.host}:{self.port}{self.ready_path}")
        return port_open(self.host, self.port)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): it keeps its port but answers nothing, like a hung host."""
        if self.running():
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.running():
            os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> ManagedProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
