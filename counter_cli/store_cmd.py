"""`counter store show|rebind`: which store the deployment's workers persist into (streams.store_binding), and
moving it to another on purpose."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from confluent_kafka import KafkaException

from counter_cli.common import (
    console,
    fail,
    kafka_failure,
    namespaces_or_exit,
    resolve_bootstrap,
    stack_settings_or_exit,
    store_location,
)
from sinks import open_namespace_stores
from streams.settings import Settings
from streams.store_binding import StoreClaim, bind, read_binding
from streams.topics import ensure_topics, stores_spec

DESCRIPTION = """\
The first worker or API of a deployment records its store's identity in the topic <mutations topic>-stores,
under its consumer group (COUNTER_WORKER_ID); a worker or API on another store then refuses to start, since a
worker would persist its share of the writes where no API reads them. `show` prints that binding beside the store
these settings open; `rebind` moves the deployment to the store these settings open."""

REBIND_EPILOG = """\
example (after restoring the store elsewhere, or moving to Cassandra):
  COUNTER_STORE=cassandra://db1/counters counter store rebind

Stop every worker and API first. Those still running on the old store notice within COUNTER_STORE_BINDING_CHECK_S
(30 s): a worker stops, an API fails /readyz; until then a worker keeps persisting into the old store. Writes the
old store holds are not in the new one: `counter replay --from <a time before them>` reads them again from Kafka
while the mutations topic keeps them."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("store", help="show or move the store the deployment persists into", description=DESCRIPTION)
    verbs = p.add_subparsers(dest="store_verb", metavar="VERB", required=True)
    show = verbs.add_parser("show", help="the store the consumer group persists into, and this one",
                            description=DESCRIPTION)
    rebind = verbs.add_parser("rebind", help="move the consumer group to the store these settings open",
                              description=DESCRIPTION, epilog=REBIND_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    for parser in (show, rebind):
        parser.add_argument("--bootstrap", help="Kafka bootstrap (default COUNTER_KAFKA_BOOTSTRAP or counter up's)")
        parser.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR")
    show.set_defaults(run=run_show)
    rebind.set_defaults(run=run_rebind)


def run_show(args: argparse.Namespace) -> int:
    settings, bootstrap = _settings(args)
    mine = _identity(settings)
    try:
        binding = read_binding(bootstrap, settings.stores_topic, settings.worker_id,
                               config=settings.kafka_security.librdkafka())
    except KafkaException as exc:
        fail(kafka_failure(exc, bootstrap))
    console.print(f"consumer group {settings.worker_id} (topic {settings.stores_topic}): "
                  + (binding.described() if binding else "no store bound yet (the first worker or API binds its own)"),
                  soft_wrap=True, highlight=False)
    console.print(f"these settings: store {mine} ({store_location(settings)})", soft_wrap=True, highlight=False)
    if binding is not None and binding.store != mine:
        console.print("[yellow]another store:[/] a worker or API with these settings refuses to start",
                      soft_wrap=True, highlight=False)
        return 1
    return 0


def run_rebind(args: argparse.Namespace) -> int:
    settings, bootstrap = _settings(args)
    security = settings.kafka_security.librdkafka()
    claim = StoreClaim.now(_identity(settings), store_location(settings), rebind=True)
    try:
        ensure_topics(bootstrap, [stores_spec(settings)], admin_config=security)
        before = read_binding(bootstrap, settings.stores_topic, settings.worker_id, config=security)
        if before is not None and before.store == claim.store:
            console.print(f"consumer group {settings.worker_id} already persists into {before.described()}",
                          soft_wrap=True, highlight=False)
            return 0
        bind(bootstrap, settings.stores_topic, settings.worker_id, claim, config=security)
    except KafkaException as exc:
        fail(kafka_failure(exc, bootstrap))
    was = f" (was {before.described()})" if before else ""
    console.print(f"consumer group {settings.worker_id} now persists into store {claim.store} ({claim.location})"
                  f"{was}. Workers still on the old store stop within {settings.store_binding_check_s:g} s and APIs "
                  "fail /readyz; writes the old store holds are not in this one (`counter replay --from` reads them "
                  "again while Kafka keeps them)", soft_wrap=True, highlight=False)
    return 0


def _settings(args: argparse.Namespace) -> tuple[Settings, str]:
    settings = stack_settings_or_exit(data_dir=args.data_dir)
    return settings, resolve_bootstrap(settings, args.bootstrap)


def _identity(settings: Settings) -> str:
    """The identity of the store the settings open (taken now if it has none: a new store)."""
    _, registry = namespaces_or_exit(settings)
    stores = open_namespace_stores(settings.store, settings.data_dir, registry)

    async def read() -> str:
        try:
            return await stores.rollups.identity()
        finally:
            for store in stores:
                await store.close()

    return asyncio.run(read())
