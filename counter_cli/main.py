"""`counter` entry point: one sub-command per verb, each with its own --help."""

from __future__ import annotations

import argparse
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
    up_cmd,
    worker_cmd,
)


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
    schema_cmd.register(sub)
    bench_cmd.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
