"""`counter up`: run the embedded default on one machine until Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path

from counter_cli.common import console, fail, namespaces_or_exit, settings_or_exit
from infra.memcached import find_memcached
from infra.process import ServiceError
from infra.stack import LocalStack
from streams.settings import Settings
from streams.topics import TopicError, ensure_topics, topic_specs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up", help="start the embedded default (broker, cache, topics, worker, API) and wait for Ctrl-C",
        description="Start everything one machine needs: the local Tansu broker (unless "
                    "COUNTER_KAFKA_BOOTSTRAP points at Kafka), memcached when installed (otherwise an "
                    "in-process cache), the service topics, one pipeline worker and the HTTP API. Prints the "
                    "endpoints and writes them to <data dir>/endpoints.json. Ctrl-C stops everything cleanly.",
        epilog="example: COUNTER_DATA_DIR=/tmp/counter COUNTER_API_PORT=8081 counter up",
    )
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR (default .counter/)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_or_exit(data_dir=args.data_dir)
    ns_path, registry = namespaces_or_exit(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    with LocalStack(settings.data_dir) as stack:
        try:
            bootstrap = settings.kafka_bootstrap or stack.start_broker()
            stack.env["COUNTER_KAFKA_BOOTSTRAP"] = bootstrap
            memcached = _cache(stack, settings)
            ensure_topics(bootstrap, topic_specs(settings))
            worker = stack.start_worker(port=settings.worker_port)
            api = stack.start_api(port=settings.api_port, host=settings.api_host)
        except (ServiceError, TopicError) as exc:
            fail(str(exc), code=1)
        endpoints = {"kafka_bootstrap": bootstrap, "api_url": f"http://{api.address}", "memcached": memcached,
                     "worker_metrics": f"http://{worker.address}/metrics"}
        _write_endpoints(settings, endpoints)
        try:
            console.print(f"[bold green]counter is up[/] (namespaces: {', '.join(registry.names())} "
                          f"from {ns_path})")
            for name, value in endpoints.items():
                console.print(f"  {name:16} {value if value is not None else '-'}")
            console.print(f"  endpoints file   {settings.endpoints_path}\nPress Ctrl-C to stop.")
            code = 0
            while not stop.wait(0.5):
                dead = next((p for p in stack.processes if not p.running()), None)
                if dead is not None:
                    console.print(f"[bold red]the {dead.name} exited[/] (code {dead.proc.returncode}); "
                                  f"last lines of {dead.log_path}:\n{dead.log_tail()}")
                    code = 1
                    break
            console.print("stopping...")
        finally:
            settings.endpoints_path.unlink(missing_ok=True)
    console.print("stopped.")
    return code


def _cache(stack: LocalStack, settings: Settings) -> str | None:
    """memcached address to use, or None for the in-process cache."""
    if settings.cache.startswith("memcached://"):
        stack.env["COUNTER_CACHE"] = settings.cache
        return settings.cache.removeprefix("memcached://")
    if settings.cache == "memory" or find_memcached() is None:
        if settings.cache == "auto":
            console.print("memcached is not installed: using the in-process cache "
                          "(apt-get install memcached for a shared one)")
        stack.env["COUNTER_CACHE"] = "memory"
        return None
    return stack.start_memcached()


def _write_endpoints(settings: Settings, endpoints: dict[str, object]) -> None:
    tmp = settings.endpoints_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(endpoints, indent=2) + "\n")
    os.replace(tmp, settings.endpoints_path)
