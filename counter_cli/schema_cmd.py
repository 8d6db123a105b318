"""`counter schema apply|print`: create (or show) the store's keyspace and tables.

Cassandra: the keyspace (replication from the URL or --replication) and the fixed tables, all
``IF NOT EXISTS`` so running it again is harmless. Slice tables are created by the workers as
time moves on. SQLite: the files and tables are created by opening the store.
Also runnable without the `counter` entry point: ``python -m counter_cli.schema_cmd apply``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import replace
from pathlib import Path

from counter_cli.common import console, fail, settings_or_exit

EXAMPLES = """examples:
  COUNTER_STORE='cassandra://cas1,cas2:9042/counters?dc=dc1&replication=3' counter schema apply
  counter schema apply --store 'cassandra://admin:secret@cas1/counters?dc=dc1&tls=1&ca=/etc/ca.pem'
  counter schema apply --replication dc1:3,dc2:3     (multi-DC keyspace)
  counter schema print --store cassandra://x/counters --replication dc1:3   (the CQL, no connection)"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="create or print the store schema (Cassandra keyspace and tables)",
                       description="Create the keyspace and tables of the configured store "
                                   "(COUNTER_STORE), or print the CQL.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="schema_action", metavar="ACTION", required=True)
    for name, helptext, run in (
        ("apply", "create the keyspace and tables (idempotent)", run_apply),
        ("print", "print the CQL that apply runs, without connecting", run_print),
    ):
        a = actions.add_parser(name, help=helptext, description=helptext, epilog=EXAMPLES,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        a.add_argument("--store", help="store URL (default COUNTER_STORE)")
        a.add_argument("--replication", help="keyspace replication: N (local DC) or dc1:N,dc2:M "
                                             "(default: the URL's replication option, else 3)")
        a.set_defaults(run=run)


def _cassandra_config(args: argparse.Namespace):
    from sinks.cassandra.config import CassandraUrlError, parse_cassandra_url, with_replication

    try:
        config = parse_cassandra_url(args.store_url)
        if args.replication:
            config = with_replication(config, args.replication)
    except CassandraUrlError as exc:
        fail(str(exc))
    return config


def _store_url(args: argparse.Namespace) -> str:
    settings = settings_or_exit(store=args.store)
    args.store_url = settings.store
    args.data_dir = settings.data_dir
    return settings.store


def run_print(args: argparse.Namespace) -> int:
    from sinks.cassandra.cql import schema_statements

    if not _store_url(args).startswith("cassandra://"):
        fail("schema print is for a cassandra:// store (SQLite creates its schema when the store opens)")
    config = _cassandra_config(args)
    for cql in schema_statements(config.keyspace, config.replication_map()):
        print(f"{cql};\n")
    return 0


def run_apply(args: argparse.Namespace) -> int:
    url = _store_url(args)
    if not url.startswith("cassandra://"):
        return _apply_sqlite(url, Path(args.data_dir))
    from sinks.cassandra.session import CassandraSession

    config = _cassandra_config(args)
    session = CassandraSession(replace(config, create=True))
    try:
        session.connect()  # create=True: runs every statement of `schema print`, waiting for agreement
    except Exception as exc:
        fail(f"cannot apply the schema on {config.redacted()}: {type(exc).__name__}: {exc}", code=1)
    try:
        replication = ", ".join(f"{k}={v}" for k, v in config.replication_map().items())
        console.print(f"schema applied: keyspace {config.keyspace} ({replication}) on {config.redacted()}")
    finally:
        asyncio.run(session.close())
    return 0


def _apply_sqlite(url: str, data_dir: Path) -> int:
    from sinks import open_stores

    def no_partitioning(namespace: str):
        raise KeyError(namespace)

    try:
        events, rollups, buckets = open_stores(url, data_dir, no_partitioning)
    except (OSError, ValueError) as exc:
        fail(f"cannot open the SQLite store {url!r}: {exc}", code=1)

    async def touch_and_close() -> None:
        try:  # the first operation of each store creates its file and tables
            await events.scan("_schema", "_schema", 0, 1, limit=1)
            await rollups.watermarks("_schema")
            await buckets.clears("_schema", ["_schema"])
        finally:
            await events.close()
            await rollups.close()
            await buckets.close()
    asyncio.run(touch_and_close())
    console.print(f"SQLite schema ready ({url}): the stores create their tables when they open")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="counter")
    register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(["schema", *(sys.argv[1:] if argv is None else argv)])
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
