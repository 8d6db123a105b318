"""What every benchmark shares: a local stack, a progress bar, machine facts and the JSON result file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from infra.native import ensure_native_builds
from infra.process import ManagedProcess, free_port
from infra.stack import LocalStack
from schemas import codec
from sinks import ROLLUPS_FILE, SqliteRollupStore
from streams.settings import Settings, load_settings
from streams.topics import TopicSpec, ensure_topics, topic_specs

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
NAMESPACES = BENCH_DIR / "namespaces.yaml"
console = Console(stderr=True, soft_wrap=True)  # long result lines stay whole in a log file


@contextmanager
def local_stack(data_dir: Path, *, workers: int = 1, api: bool = True, broker_delay_ms: float = 0.0,
                **env: str) -> Iterator[LocalStack]:
    """Broker + memcached + topics + workers (+ API) in `data_dir`, stopped on exit. `broker_delay_ms`: every
    client of the stack reaches the broker through `bench.delay_proxy`, which hands them its answers that late."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for built in ensure_native_builds():  # measure what `counter up` runs
        if not built.ok or built.message:
            console.print(built.summary, highlight=False)
    with contextlib.ExitStack() as stop:
        broker_port = free_port()
        advertised = None
        if broker_delay_ms:
            proxy_port = free_port()
            stop.enter_context(ManagedProcess(
                [sys.executable, "-m", "bench.delay_proxy", "--listen", str(proxy_port), "--upstream",
                 str(broker_port), "--delay-ms", str(broker_delay_ms)],
                host="127.0.0.1", port=proxy_port, log_path=data_dir / "delay-proxy.log", name="delay-proxy"))
            advertised = f"127.0.0.1:{proxy_port}"
        stack = stop.enter_context(LocalStack(data_dir, {"COUNTER_NAMESPACES": str(NAMESPACES),
                                                         "COUNTER_WORKER_LOG_LEVEL": "warning", **env}))
        console.print("starting broker, memcached, topics...")
        stack.start_broker(port=broker_port, advertised=advertised)
        stack.start_memcached()
        ensure_topics(stack.env["COUNTER_KAFKA_BOOTSTRAP"], topic_specs(stack_settings(stack)))
        for _ in range(workers):
            console.print("starting worker (joins the consumer group)...")
            stack.start_worker()
        if api:
            console.print("starting API...")
            stack.start_api()
        yield stack


def stack_settings(stack: LocalStack) -> Settings:
    """The settings the stack's processes run with (its COUNTER_* environment)."""
    return load_settings(**{k.removeprefix("COUNTER_").lower(): v for k, v in stack.env.items()})


def exact_counters(data_dir: Path, expected: dict[tuple[str, str], int], *, allow_more: bool = False) -> int:
    """How many counters are exact (or, with allow_more, at least the expected) and caught up in the rollup
    store of a local stack's data directory."""
    async def check() -> int:
        store = SqliteRollupStore(data_dir / ROLLUPS_FILE)
        try:
            states = await store.get_many(list(expected))
        finally:
            await store.close()
        return sum(1 for key, v in expected.items()
                   if (s := states.get(key)) is not None and (s.count == v or (allow_more and s.count > v))
                   and s.rollup_ts >= s.last_write_ts)
    return asyncio.run(check())


def wait_exact(data_dir: Path, expected: dict[tuple[str, str], int], *, allow_more: bool = False,
               timeout_s: float = 300) -> bool:
    """Wait, with a progress bar, until every expected counter is exact in the rollup store; False on timeout."""
    deadline = time.monotonic() + timeout_s
    with progress_bar("waiting: all counted", len(expected), "counter") as update:
        while True:
            exact = exact_counters(data_dir, expected, allow_more=allow_more)
            update(exact)
            if exact == len(expected):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.25)


@contextmanager
def http_floor(data_dir: Path) -> Iterator[ManagedProcess]:
    """`bench.http_floor` in its own process: the cheapest Python HTTP endpoint, as a same-run baseline."""
    with _floor(data_dir, "http-floor", "bench.http_floor") as floor:
        yield floor


@contextmanager
def group_commit_floor(data_dir: Path, bootstrap: str, topic: str,
                       hold_max_ms: float = 0.0) -> Iterator[ManagedProcess]:
    """`bench.group_commit_floor` in its own process: the cheapest durable HTTP write (HTTP, group commit, the
    broker's acknowledgement, producing to `topic`, created here like the raw produce's), as a same-run baseline;
    `hold_max_ms` the API's COUNTER_API_GROUP_COMMIT_HOLD_MS, to hold its records as the API does."""
    ensure_baseline_topic(bootstrap, topic)
    with _floor(data_dir, "group-commit-floor", "bench.group_commit_floor", "--bootstrap", bootstrap,
                "--topic", topic, "--hold-max-ms", str(hold_max_ms)) as floor:
        yield floor


def ensure_baseline_topic(bootstrap: str, topic: str) -> None:
    """A topic of the mutations topic's shape (8 partitions, broker-set timestamps) that no worker reads: where the
    write benchmark's baselines produce."""
    ensure_topics(bootstrap, [TopicSpec(topic, 8, 1, {"message.timestamp.type": "LogAppendTime"})])


@contextmanager
def _floor(data_dir: Path, name: str, module: str, *args: str) -> Iterator[ManagedProcess]:
    port = free_port()
    floor = ManagedProcess([sys.executable, "-m", module, "--port", str(port), *args], host="127.0.0.1",
                           port=port, log_path=data_dir / f"{name}.log", ready_path="/")
    floor.name = name
    with floor:
        yield floor


@contextmanager
def progress_bar(label: str, total: float | None, unit: str = "req") -> Iterator[Any]:
    """A rich progress bar with rate and ETA; yields update(completed)."""
    columns = [TextColumn(f"{label:<28}"), BarColumn(), TextColumn("{task.completed:>10,.0f}"),
               TextColumn(f"{{task.fields[rate]:>10}} {unit}/s"), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn()]
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(label, total=total, rate="-")
        started = time.perf_counter()

        def update(completed: float) -> None:
            elapsed = time.perf_counter() - started
            progress.update(task, completed=completed, rate=f"{completed / elapsed:,.0f}" if elapsed else "-")

        yield update


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "load_avg": os.getloadavg(), "avro_readers": codec.READERS}


def write_result(name: str, result: dict[str, Any]) -> Path:
    """bench/results/<name>-<utc time>.json with the machine facts; returns the path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = RESULTS_DIR / f"{name}-{stamp}.json"
    path.write_text(json.dumps({"benchmark": name, "at": stamp, "machine": machine(), **result}, indent=2) + "\n")
    console.print(f"results written to {path}")
    return path
