"""`counter up`: run the embedded default on one machine until Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from contextlib import ExitStack
from pathlib import Path

from counter_cli.common import console, fail, namespaces_or_exit, settings_or_exit
from infra.broker import LocalBroker
from infra.memcached import LocalMemcached, find_memcached
from infra.process import ManagedProcess, ServiceError
from streams.settings import Settings
from streams.topics import TopicError, ensure_topics, topic_specs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up", help="start the embedded default (broker, cache, topics) and wait for Ctrl-C",
        description="Start everything one machine needs: the local Tansu broker (unless "
                    "COUNTER_KAFKA_BOOTSTRAP points at Kafka), memcached when installed (otherwise an "
                    "in-process cache), and the service topics. Prints the endpoints and writes them to "
                    "<data dir>/endpoints.json. Ctrl-C stops everything cleanly.",
        epilog="example: COUNTER_DATA_DIR=/tmp/counter counter up",
    )
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR (default .counter/)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_or_exit(data_dir=args.data_dir)
    ns_path, registry = namespaces_or_exit(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    logs = settings.data_dir / "logs"
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    with ExitStack() as stack:
        try:
            bootstrap = settings.kafka_bootstrap or _start_broker(stack, logs)
            memcached = _start_cache(stack, settings, logs)
            ensure_topics(bootstrap, topic_specs(settings))
            worker = _start_worker(stack, settings, bootstrap, memcached, logs)
            api = _start_api(stack, settings, bootstrap, memcached, logs)
        except (ServiceError, TopicError) as exc:
            fail(str(exc), code=1)
        endpoints = {"kafka_bootstrap": bootstrap, "api_url": f"http://{api.address}", "memcached": memcached,
                     "worker_metrics": f"http://{worker.address}/metrics"}
        _write_endpoints(settings, endpoints)
        stack.callback(lambda: settings.endpoints_path.unlink(missing_ok=True))
        console.print(f"[bold green]counter is up[/] (namespaces: {', '.join(registry.names())} from {ns_path})")
        for name, value in endpoints.items():
            console.print(f"  {name:16} {value if value is not None else '-'}")
        console.print(f"  endpoints file   {settings.endpoints_path}\nPress Ctrl-C to stop.")
        code = 0
        while not stop.wait(0.5):
            dead = next((p for p in (worker, api) if not p.running()), None)
            if dead is not None:
                console.print(f"[bold red]the {dead.name} exited[/] (code {dead.proc.returncode}); "
                              f"last lines of {dead.log_path}:\n{dead.log_tail()}")
                code = 1
                break
        console.print("stopping...")
    console.print("stopped.")
    return code


def _start_broker(stack: ExitStack, logs: Path) -> str:
    broker = stack.enter_context(LocalBroker(logs / "broker.log"))
    return broker.bootstrap


def _start_cache(stack: ExitStack, settings: Settings, logs: Path) -> str | None:
    """memcached address to use, or None for the in-process cache."""
    if settings.cache.startswith("memcached://"):
        return settings.cache.removeprefix("memcached://")
    if settings.cache == "memory" or find_memcached() is None:
        if settings.cache == "auto":
            console.print("memcached is not installed: using the in-process cache "
                          "(apt-get install memcached for a shared one)")
        return None
    return stack.enter_context(LocalMemcached(logs / "memcached.log")).address


def _child_env(settings: Settings, bootstrap: str, memcached: str | None) -> dict[str, str]:
    return {"COUNTER_KAFKA_BOOTSTRAP": bootstrap, "COUNTER_DATA_DIR": str(settings.data_dir),
            "COUNTER_CACHE": f"memcached://{memcached}" if memcached else "memory"}


def _start_api(stack: ExitStack, settings: Settings, bootstrap: str, memcached: str | None,
               logs: Path) -> ManagedProcess:
    """The HTTP API as a child process, ready once /healthz answers."""
    api = ManagedProcess([sys.executable, "-m", "query_api"], host=settings.api_host, port=settings.api_port,
                         log_path=logs / "api.log", env=_child_env(settings, bootstrap, memcached),
                         ready_path="/healthz")
    api.name = "api"
    return stack.enter_context(api.start(timeout=60))


def _start_worker(stack: ExitStack, settings: Settings, bootstrap: str, memcached: str | None,
                  logs: Path) -> ManagedProcess:
    """The pipeline worker as a child process, ready once it owns partitions."""
    env = _child_env(settings, bootstrap, memcached)
    worker = ManagedProcess([sys.executable, "-m", "agents"], host="127.0.0.1", port=settings.worker_port,
                            log_path=logs / "worker.log", env=env, ready_path="/ready")
    worker.name = "worker"
    return stack.enter_context(worker.start(timeout=90))


def _write_endpoints(settings: Settings, endpoints: dict[str, object]) -> None:
    tmp = settings.endpoints_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(endpoints, indent=2) + "\n")
    os.replace(tmp, settings.endpoints_path)
