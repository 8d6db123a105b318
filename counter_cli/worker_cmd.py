"""`counter worker`: run one pipeline worker (persist + rollup agents) in the foreground."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from counter_cli.common import (
    add_no_compile,
    alive,
    build_native_parts,
    check_against_namespaces,
    check_listen,
    console,
    fail,
    joined_stack,
    member_bootstrap,
    namespaces_or_exit,
    read_endpoints,
    settings_or_exit,
)
from infra.parent_death import die_with_this_process
from infra.process import free_port

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker", help="run a pipeline worker (persist and rollup agents)",
        description="Consume counter-mutations into the event store and roll counters up. Start as many "
                    "workers as there are partitions; they share the work as one consumer group "
                    "(COUNTER_WORKER_ID). Metrics at http://127.0.0.1:<COUNTER_WORKER_PORT>/metrics. "
                    "Says when it starts (its consumer group and metrics URL) and when it stops.",
        epilog="example: COUNTER_WORKER_PORT=6067 counter worker --bootstrap 127.0.0.1:9092",
    )
    p.add_argument("--bootstrap", help="Kafka bootstrap (default COUNTER_KAFKA_BOOTSTRAP or counter up's)")
    p.add_argument("--web-port", type=int, help="metrics port (default COUNTER_WORKER_PORT, 6066; 0: a free one)")
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR")
    add_no_compile(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.web_port is not None and not 0 <= args.web_port <= 65535:  # else the settings' error names the variable
        fail(f"--web-port: {args.web_port} is outside 0..65535 (0: any free port)")
    settings = settings_or_exit(data_dir=args.data_dir, worker_port=args.web_port)
    endpoints = read_endpoints(settings)
    shared = joined_stack(settings, endpoints)
    if shared:
        settings = settings_or_exit(data_dir=args.data_dir, worker_port=args.web_port, **shared)
    _, registry = namespaces_or_exit(settings)
    check_against_namespaces(settings, registry)
    bootstrap = member_bootstrap(settings, args.bootstrap, endpoints)
    port = settings.worker_port or free_port()
    check_listen("127.0.0.1", port, "the worker's host",
                 "--web-port" if args.web_port is not None else "COUNTER_WORKER_PORT")
    env = dict(os.environ, COUNTER_KAFKA_BOOTSTRAP=bootstrap, COUNTER_WORKER_PORT=str(port),
               **{f"COUNTER_{name.upper()}": value for name, value in shared.items()})
    if not settings.cache.startswith("memcached://") and not shared:
        console.print(f"[yellow]warning:[/] this worker writes no shared cache (COUNTER_CACHE={settings.cache}): an "
                      "API reading memcached would keep answering the counts it had cached for the counters this "
                      "worker rolls up; set COUNTER_CACHE as the API's", soft_wrap=True, highlight=False)
    if args.data_dir is not None:
        env["COUNTER_DATA_DIR"] = str(args.data_dir)
    build_native_parts(args)
    group = settings.worker_id
    # The worker is its own process (agents are never imported by the CLI), run as a child rather than exec'd so
    # that this process can say when it stops.
    stack = endpoints.get("supervisor_pid")
    return run_child([sys.executable, "-m", "agents"], env, started=lambda pid: console.print(
        f"worker {pid} joining consumer group {group} (persist: {group}.persist) on {bootstrap}; metrics "
        f"http://127.0.0.1:{port}/metrics" + (f"; it stops with counter up ({stack})" if stack else ""),
        soft_wrap=True, highlight=False), name="worker", stop_with=stack if isinstance(stack, int) else None)


STOP_GRACE_S = 15.0  # how long a worker whose `counter up` stopped may take to stop before it is killed


def run_child(argv: Sequence[str], env: dict[str, str], *, started: Callable[[int], None], name: str,
              stop_with: int | None = None) -> int:
    """Run `argv` to its end, print one line when it has stopped, and return its exit status (128 + the signal
    that killed it). The child has its own session, so a terminal's Ctrl-C reaches it once, forwarded from here,
    as do SIGTERM and SIGHUP sent to this process; and it gets SIGTERM if this process dies first (a stop it
    handles as any other: a worker persists what it holds). With `stop_with` (a `counter up`'s pid) it is stopped
    when that process is gone, and killed STOP_GRACE_S later: its broker went with it (a review's worker wrote
    thousands of connection errors and ignored SIGTERM for 40 s)."""
    received: list[int] = []
    child = subprocess.Popen(argv, env=env, start_new_session=True,
                             preexec_fn=die_with_this_process(signal.SIGTERM))

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if child.returncode is None:  # SIGHUP as a stop: Faust handles INT and TERM, a HUP would kill it unstopped
            os.kill(child.pid, signal.SIGTERM if signum == signal.SIGHUP else signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        started(child.pid)
        code = _wait(child, stop_with, name)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if child.returncode is None:  # this process is failing: the child must not outlive it
            child.kill()
            child.wait()
    how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit code {code}"
    asked = f" after {_signal_name(received[0])}" if received else ""
    console.print(f"{name} {child.pid} stopped{asked} ({how})", soft_wrap=True, highlight=False)
    return 128 - code if code < 0 else code


def _wait(child: subprocess.Popen[bytes], stop_with: int | None, name: str) -> int:
    """The child's exit status, once it ends; stopping it when `stop_with` is gone (see run_child)."""
    if stop_with is None:
        return child.wait()
    stopping_since: float | None = None
    while True:
        try:
            return child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        if stopping_since is None and not alive(stop_with):
            console.print(f"counter up ({stop_with}) stopped, and its broker with it: stopping {name} {child.pid}",
                          soft_wrap=True, highlight=False)
            os.kill(child.pid, signal.SIGTERM)
            stopping_since = time.monotonic()
        elif stopping_since is not None and time.monotonic() - stopping_since > STOP_GRACE_S:
            child.kill()


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
