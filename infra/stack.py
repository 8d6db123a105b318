"""The service's processes on one machine: broker, memcached, workers and API, each a child process.

One launcher for `counter up`, the integration tests and the benchmarks. Workers and the API are started as
`python -m agents` / `python -m query_api` with COUNTER_* variables, exactly as in production.
"""

from __future__ import annotations

import sys
from pathlib import Path

from infra.broker import LocalBroker
from infra.memcached import LocalMemcached
from infra.process import ManagedProcess, free_port


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

    def start_broker(self) -> str:
        self.broker = self._track(LocalBroker(self.logs / "broker.log").start())
        self.env["COUNTER_KAFKA_BOOTSTRAP"] = self.broker.bootstrap
        return self.broker.bootstrap

    def start_memcached(self) -> str:
        self.memcached = self._track(LocalMemcached(self.logs / "memcached.log").start())
        self.env["COUNTER_CACHE"] = f"memcached://{self.memcached.address}"
        return self.memcached.address

    def start_worker(self, port: int | None = None, **env: str) -> ManagedProcess:
        """A pipeline worker, ready once it joined the consumer group and owns partitions."""
        port = port or free_port()
        worker = ManagedProcess([sys.executable, "-m", "agents"], host="127.0.0.1", port=port,
                                log_path=self.logs / f"worker-{len(self.workers)}.log", ready_path="/ready",
                                env={**self.env, "COUNTER_WORKER_PORT": str(port), **env})
        worker.name = f"worker-{len(self.workers)}"
        self.workers.append(self._track(worker.start(timeout=90)))
        return worker

    def start_api(self, port: int | None = None, host: str = "127.0.0.1", **env: str) -> ManagedProcess:
        """The HTTP API, ready once /healthz answers."""
        port = port or free_port()
        api = ManagedProcess([sys.executable, "-m", "query_api"], host=host, port=port,
                             log_path=self.logs / f"api-{len(self.apis)}.log", ready_path="/healthz",
                             env={**self.env, "COUNTER_API_HOST": host, "COUNTER_API_PORT": str(port), **env})
        api.name = f"api-{len(self.apis)}"
        self.apis.append(self._track(api.start(timeout=60)))
        return api

    def _track(self, process: ManagedProcess) -> ManagedProcess:
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
