"""`counter` entry point: one sub-command per verb, each with its own --help."""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys

from counter_cli import (
    api_cmd,
    audit_cmd,
    bench_cmd,
    dlq_cmd,
    produce_cmd,
    recount_cmd,
    replay_cmd,
    schema_cmd,
    store_cmd,
    up_cmd,
    worker_cmd,
)
from counter_cli.common import fail


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="counter",
        description="Distributed counters (BEST_EFFORT, EVENTUAL, ACCURATE) on a Kafka stream pipeline.",
        epilog="Configuration comes from COUNTER_* environment variables; see README.md.",
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    up_cmd.register(sub)
    produce_cmd.register(sub)
    worker_cmd.register(sub)
    api_cmd.register(sub)
    replay_cmd.register(sub)
    recount_cmd.register(sub)
    audit_cmd.register(sub)
    dlq_cmd.register(sub)
    store_cmd.register(sub)
    schema_cmd.register(sub)
    bench_cmd.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except sqlite3.OperationalError as exc:  # a store file a verb reads or writes (audit, recount, replay)
        hint = ""
        if any(word in str(exc) for word in ("readonly", "unable to open")):
            hint = (" (the data directory must be writable, even to read: SQLite keeps each file's write-ahead log "
                    "and its index beside it; copy a read-only one somewhere writable)")
        fail(f"the SQLite store in the data directory (COUNTER_DATA_DIR or --data-dir) failed: {exc}{hint}", code=1)
    except BrokenPipeError:  # `counter recount --format jsonl | head`: the reader left (a traceback before; a review)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return 141  # 128 + SIGPIPE, as a shell reports a pipeline cut short


if __name__ == "__main__":
    sys.exit(main())
