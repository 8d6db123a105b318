"""`counter worker`: run one pipeline worker (persist + rollup agents) in the foreground."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from counter_cli.common import add_no_compile, build_native_parts, resolve_bootstrap, settings_or_exit


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker", help="run a pipeline worker (persist and rollup agents)",
        description="Consume counter-mutations into the event store and roll counters up. Start as many "
                    "workers as there are partitions; they share the work as one consumer group "
                    "(COUNTER_WORKER_ID). Metrics at http://127.0.0.1:<COUNTER_WORKER_PORT>/metrics.",
        epilog="example: COUNTER_WORKER_PORT=6067 counter worker --bootstrap 127.0.0.1:9092",
    )
    p.add_argument("--bootstrap", help="Kafka bootstrap (default COUNTER_KAFKA_BOOTSTRAP or counter up's)")
    p.add_argument("--web-port", type=int, help="metrics port (default COUNTER_WORKER_PORT, 6066)")
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR")
    add_no_compile(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_or_exit(data_dir=args.data_dir)
    env = dict(os.environ, COUNTER_KAFKA_BOOTSTRAP=resolve_bootstrap(settings, args.bootstrap))
    if args.web_port is not None:
        env["COUNTER_WORKER_PORT"] = str(args.web_port)
    if args.data_dir is not None:
        env["COUNTER_DATA_DIR"] = str(args.data_dir)
    build_native_parts(args)
    # The worker is its own process image (agents are never imported by the CLI).
    os.execve(sys.executable, [sys.executable, "-m", "agents"], env)
    return 0  # pragma: no cover
