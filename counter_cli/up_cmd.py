"""`counter up`: run the embedded default on one machine, keep it running, stop it on Ctrl-C.

The children are supervised (infra.supervisor): a worker, the API or memcached that dies is restarted with
backoff; the local broker's death stops everything, because the in-memory broker takes acknowledged writes not
yet persisted with it. Children die with `counter up`, even when it is killed with SIGKILL.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO

from confluent_kafka import KafkaException

from counter_cli.common import (
    add_no_compile,
    build_native_parts,
    console,
    fail,
    kafka_failure,
    namespaces_or_exit,
    settings_or_exit,
)
from infra.memcached import find_memcached
from infra.process import ManagedProcess, ServiceError
from infra.stack import LocalStack
from infra.supervisor import Supervisor
from streams.settings import Settings
from streams.topics import TopicError, ensure_topics, topic_specs

BROKER_LOSS = (
    "The local broker keeps its topics in memory: the mutations it acknowledged that the worker had not yet "
    "persisted are lost with it. It is not restarted, because a silent restart would hide that loss; "
    "stopping everything. Persisted counts are safe in the data directory; after `counter up` again, clients "
    "that retry their writes with the same idempotency tokens are counted exactly once."
)
POLL_S = 0.25
LOCK_FILE = "counter-up.lock"  # in the data directory: one `counter up` per directory (_lock_data_dir)
STOP_TIMEOUT_S = 10.0  # per child: SIGTERM, then SIGKILL
# With the local broker a worker's clean stop first persists what its partitions hold (COUNTER_PERSIST_DRAIN_S):
# the broker keeps its topics in memory, so writes it acknowledged and no worker persisted would go with it.
LOCAL_BROKER_DRAIN_S = 30.0
# Without a broker a worker's graceful stop only waits for a broker that will not come back (and there is
# nothing left to commit to it): give it less time.
STOP_TIMEOUT_WITHOUT_BROKER_S = 3.0
STYLES = {"info": "green", "warning": "yellow", "error": "bold red"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up", help="start the embedded default (broker, cache, topics, worker, API) and wait for Ctrl-C",
        description="Start everything one machine needs: the local Tansu broker (unless "
                    "COUNTER_KAFKA_BOOTSTRAP points at Kafka), memcached when installed (otherwise an "
                    "in-process cache), the service topics, one pipeline worker and the HTTP API. Prints the "
                    "endpoints and writes them, with the processes' pids, to <data dir>/endpoints.json. "
                    "A worker, API or memcached that dies is restarted (with backoff); the local broker's "
                    "death stops everything (its topics are in memory). Ctrl-C stops everything cleanly (the "
                    "worker first persists what the local broker still holds), and no child outlives "
                    "`counter up`, even if it is killed. The compiled parts (the worker's Avro readers, the "
                    "API's plain AddCount) are built first when missing or stale.",
        epilog="example: COUNTER_DATA_DIR=/tmp/counter COUNTER_API_PORT=8081 counter up",
    )
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR (default .counter/)")
    add_no_compile(p)
    p.set_defaults(run=run)


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while starting or stopping: abandon what was under way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """SIGINT/SIGTERM/SIGHUP. While running they ask the supervision loop to stop; while starting or stopping they
    interrupt (a Ctrl-C during a slow start stops at once; a second Ctrl-C while stopping kills everything)."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.received: int | None = None
        self.interrupting = True

    def install(self) -> None:
        # SIGHUP too: a closed terminal or a dropped ssh session ended `counter up` at once, without the drain (the
        # children, killed with it, lost the acknowledged writes the worker had not read)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._handle)

    def running(self) -> None:
        """Started: from here a signal asks the supervision loop to stop. A signal that came while starting
        interrupts now, even if its Interrupted was lost: Python ignores an exception raised in some places, such
        as the at-fork hooks around a child's start (logging's lock release), and starting then went on."""
        self.interrupting = False
        if self.received is not None:
            raise Interrupted(self.received)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        self.requested.set()
        if self.interrupting:
            raise Interrupted(signum)


def run(args: argparse.Namespace) -> int:
    settings = settings_or_exit(data_dir=args.data_dir)
    ns_path, registry = namespaces_or_exit(settings)
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        lock = _lock_data_dir(settings.data_dir)  # held until the end of the stop, or of this process however it ends
    except OSError as exc:
        fail(f"data directory {settings.data_dir} (COUNTER_DATA_DIR): {exc.strerror or exc}", code=1)
    for port, variable in ((settings.api_port, "COUNTER_API_PORT"), (settings.worker_port, "COUNTER_WORKER_PORT")):
        if port and not _port_free(settings.api_host if variable == "COUNTER_API_PORT" else "127.0.0.1", port):
            fail(f"port {port} is in use ({variable}): another `counter up` or server holds it; set {variable} to "
                 "a free port, or 0 for any", code=1)
    signals = StopSignals()
    signals.install()
    stack = LocalStack(settings.data_dir)
    stop_timeout = STOP_TIMEOUT_S
    try:
        build_native_parts(args)  # before the children start: each loads its build once
        try:
            endpoints = _start(stack, settings)
        except (ServiceError, TopicError) as exc:
            console.print(f"[bold red]error:[/] {exc}", highlight=False)
            return 1
        except KafkaException as exc:  # COUNTER_KAFKA_BOOTSTRAP given but not answering
            console.print(f"[bold red]error:[/] {kafka_failure(exc, settings.kafka_bootstrap or '?')}", highlight=False)
            return 1
        stop_timeout += float(stack.env.get("COUNTER_PERSIST_DRAIN_S", settings.persist_drain_s))  # the drain
        signals.running()  # from here a signal is a request to stop, also while printing below
        _write_endpoints(settings, {**endpoints, "processes": stack.pids()})
        console.print(f"[bold green]counter is up[/] (namespaces: {', '.join(registry.names())} from {ns_path})",
                      soft_wrap=True)
        for name, value in endpoints.items():
            console.print(f"  {name:16} {value if value is not None else '-'}", soft_wrap=True)
        console.print(f"  processes        {', '.join(f'{k} {v}' for k, v in stack.pids().items())}", soft_wrap=True)
        console.print(f"  endpoints file   {settings.endpoints_path}\nPress Ctrl-C to stop.", soft_wrap=True)
        code = _supervise(stack, settings, endpoints, signals)
        if code != 0:
            stop_timeout = STOP_TIMEOUT_WITHOUT_BROKER_S
        return code
    except Interrupted as exc:
        console.print(f"{exc} received while starting")
        return 128 + exc.signum
    finally:
        _stop(stack, signals, stop_timeout)
        settings.endpoints_path.unlink(missing_ok=True)
        lock.close()  # the directory is free once its endpoints file is gone
        console.print("stopped.")


def _lock_data_dir(data_dir: Path) -> IO[str]:
    """Own the data directory (an exclusive flock on `counter-up.lock`, which the kernel drops when this process
    ends), or exit naming the `counter up` that owns it. Two stacks on one directory would share its stores with
    two brokers whose partitions have the same names: each worker's persist watermark would overwrite the other's,
    so a rollup could pass events the other had not persisted yet, and one stop would remove the other's
    endpoints file."""
    path = data_dir / LOCK_FILE
    handle = open(path, "a+")  # noqa: SIM115  # held open for the life of the process: that is the lock
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "another process"
        handle.close()
        fail(f"{data_dir} is in use by another `counter up` (pid {owner}); stop it, or give this one another "
             "data directory (--data-dir or COUNTER_DATA_DIR)", code=1)
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _port_free(host: str, port: int) -> bool:
    """Whether `port` can be bound now: the children's readiness check only asks whether something answers there,
    so a port another server holds read as a child that is up (and then restarted forever)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _start(stack: LocalStack, settings: Settings) -> dict[str, object]:
    """Start the children in dependency order; returns the endpoints to publish."""
    bootstrap = settings.kafka_bootstrap or stack.start_broker()
    stack.env["COUNTER_KAFKA_BOOTSTRAP"] = bootstrap
    if settings.kafka_bootstrap is None and "COUNTER_PERSIST_DRAIN_S" not in os.environ:
        stack.env["COUNTER_PERSIST_DRAIN_S"] = str(LOCAL_BROKER_DRAIN_S)
    memcached = _cache(stack, settings)
    ensure_topics(bootstrap, topic_specs(settings))
    worker = stack.start_worker(port=settings.worker_port)
    api = stack.start_api(port=settings.api_port, host=settings.api_host)
    return {"kafka_bootstrap": bootstrap, "api_url": f"http://{api.address}", "ui_url": f"http://{api.address}/ui/",
            "memcached": memcached, "worker_metrics": f"http://{worker.address}/metrics", "supervisor_pid": os.getpid()}


def _supervise(stack: LocalStack, settings: Settings, endpoints: dict[str, object], signals: StopSignals) -> int:
    """Restart what dies until a signal asks to stop (0) or the broker dies (1)."""
    supervisor = Supervisor(_report, on_change=lambda: _write_endpoints(
        settings, {**endpoints, "processes": stack.pids()}))
    for process in stack.processes:
        if process is stack.broker:
            supervisor.watch(process, restart=False, consequence=BROKER_LOSS)
        else:
            supervisor.watch(process, restart=True)
    while not signals.requested.wait(POLL_S):
        if supervisor.tick() is not None:
            return 1
    console.print(f"{signal.Signals(signals.received or signal.SIGINT).name} received")
    return 0


def _stop(stack: LocalStack, signals: StopSignals, timeout: float) -> None:
    """Stop the children, last started first; a signal meanwhile kills them all instead."""
    signals.interrupting = True
    console.print("stopping...")
    try:
        stack.stop(timeout, report=_stopping)
    except Interrupted:
        console.print("signal received while stopping: killing everything")
        stack.kill()
    except ServiceError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        stack.kill()


def _stopping(process: ManagedProcess) -> None:
    console.print(f"  stopping {process.name} (pid {process.pid})", highlight=False, soft_wrap=True)


def _report(level: str, message: str) -> None:
    """A supervision event on the console; child log lines are printed verbatim, never as markup."""
    console.print(f"{time.strftime('%H:%M:%S')} {message}", style=STYLES.get(level), markup=False,
                  highlight=False, soft_wrap=True)


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
    """Replace the file atomically: a reader sees the old or the new content, never half of one."""
    tmp = settings.endpoints_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(endpoints, indent=2) + "\n")
    os.replace(tmp, settings.endpoints_path)
