"""The service's processes on one machine: broker, memcached, workers and API, each a child process.

One launcher for `counter up`, the integration tests and the benchmarks. Workers and the API are started as
`python -m agents` / `python -m query_api` with COUNTER_* variables, exactly as in production. Every child
dies with the process that started it (infra.parent_death); `counter up` also restarts them (infra.supervisor).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from infra.broker import LocalBroker
from infra.memcached import LocalMemcached
from infra.process import ManagedProcess, ServiceError, free_port

_P = TypeVar("_P", bound=ManagedProcess)

WORKER_READY_TIMEOUT_S = 90.0  # joining the consumer group waits out Tansu's rebalance
API_READY_TIMEOUT_S = 60.0


class LocalStack:
    """Child processes sharing one environment (`env`); stop() ends them in reverse order of start."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.logs = self.data_dir / "logs"
        self.env: dict[str, str] = {"COUNTER_DATA_DIR": str(self.data_dir), **(env or {})}
        self.processes: list[ManagedProcess] = []
        self.broker: LocalBroker | None = None
        self.memcached: LocalMemcached | None = None
        self.workers: list[ManagedProcess] = []
        self.apis: list[ManagedProcess] = []

    def start_broker(self, *, port: int | None = None, advertised: str | None = None) -> str:
        """The local broker; `advertised`: the host:port its clients are told to use, when a proxy stands before
        it (they then connect there: it is the stack's bootstrap)."""
        self.broker = self._launch(LocalBroker(self.logs / "broker.log", port=port, advertised=advertised))
        self.env["COUNTER_KAFKA_BOOTSTRAP"] = advertised or self.broker.bootstrap
        return self.env["COUNTER_KAFKA_BOOTSTRAP"]

    def start_memcached(self) -> str:
        self.memcached = self._launch(LocalMemcached(self.logs / "memcached.log"))
        self.env["COUNTER_CACHE"] = f"memcached://{self.memcached.address}"
        return self.memcached.address

    def start_worker(self, port: int | None = None, **env: str) -> ManagedProcess:
        """A pipeline worker, ready once it joined the consumer group and owns partitions."""
        port = port or free_port()
        name = f"worker-{len(self.workers)}"
        worker = ManagedProcess([sys.executable, "-m", "agents"], host="127.0.0.1", port=port, name=name,
                                log_path=self.logs / f"{name}.log", ready_path="/ready",
                                env={**self.env, "COUNTER_WORKER_PORT": str(port), **env})
        self.workers.append(worker)
        return self._launch(worker, timeout=WORKER_READY_TIMEOUT_S)

    def start_api(self, port: int | None = None, host: str = "127.0.0.1", **env: str) -> ManagedProcess:
        """The HTTP API, ready once /healthz answers."""
        port = port or free_port()
        name = f"api-{len(self.apis)}"
        env = {**self.env, "COUNTER_API_HOST": host, "COUNTER_API_PORT": str(port), **env}
        api = ManagedProcess([sys.executable, "-m", "query_api"], host=host, port=port, name=name,
                             log_path=self.logs / f"{name}.log", ready_path="/healthz", env=env,
                             death_signal=_api_death_signal(env))
        self.apis.append(api)
        return self._launch(api, timeout=API_READY_TIMEOUT_S)

    def _launch(self, process: _P, timeout: float = 20.0) -> _P:
        """Track the process before starting it, so an interrupted start is still stopped by stop()."""
        self.processes.append(process)
        return process.start(timeout=timeout)

    def pids(self) -> dict[str, int | None]:
        """Each child's pid by name (None while it is down), e.g. for the endpoints file."""
        return {process.name: process.pid for process in self.processes}

    def stop(self, timeout: float = 10.0, report: Callable[[ManagedProcess], None] | None = None) -> None:
        """Stop every child, last started first; `report` hears of each running one before it is stopped."""
        errors: list[ServiceError] = []
        for process in reversed(self.processes):
            if report is not None and process.pid is not None:
                report(process)
            try:
                process.stop(timeout)
            except ServiceError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def kill(self) -> None:
        """SIGKILL every child at once (a second Ctrl-C, or a stop that must not wait)."""
        for process in reversed(self.processes):
            with contextlib.suppress(ServiceError):
                process.kill()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _api_death_signal(env: dict[str, str]) -> int:
    """SIGKILL for a one-process API; SIGTERM when uvicorn runs worker processes, so it ends them on the way
    out (they are its children, not ours, and would otherwise keep serving the port)."""
    try:
        processes = int({**os.environ, **env}.get("COUNTER_API_WORKERS") or 1)
    except ValueError:
        processes = 1
    return signal.SIGTERM if processes > 1 else signal.SIGKILL
