"""`counter store show|rebind`: which store the deployment's workers persist into (streams.store_binding), and
moving it to another on purpose."""

from __future__ import annotations

import argparse
from pathlib import Path

from confluent_kafka import KafkaException

from counter_cli.common import (
    console,
    existing_store_or_fail,
    fail,
    kafka_failure,
    namespaces_or_exit,
    resolve_bootstrap,
    stack_settings_or_exit,
    store_location,
)
from sinks import store_identity
from streams.settings import Settings
from streams.store_binding import StoreClaim, claimed, read_binding
from streams.topics import ensure_topics, stores_spec

DESCRIPTION = """\
The first worker or API of a deployment records its store's identity in the topic <mutations topic>-stores,
under its consumer group (COUNTER_WORKER_ID); a worker or API on another store then refuses to start, since a
worker would persist its share of the writes where no API reads them. `show` prints that binding beside the store
these settings open; `rebind` moves the deployment to the store these settings open."""

REBIND_EPILOG = """\
examples:
  COUNTER_STORE=cassandra://db1/counters counter store rebind  # moved to Cassandra
  counter store rebind --new-store --data-dir /srv/restored     # a restored backup or a copy replaces the original

Stop every worker and API first. Those still running on the old store notice within their
COUNTER_STORE_BINDING_CHECK_S (30 s by default): a worker stops, an API fails /readyz; until then a worker keeps
persisting into the old store. Writes the old store holds are not in the new one: `counter replay --from <a time
before them>` reads them again from Kafka while the mutations topic keeps them.

A copy of a store (a restored backup, a cloned disk or image) carries the original's identity, so it passes for the
original: a worker on a copy beside one on the original would split the writes between them, unnoticed. --new-store
gives this store an identity of its own before binding it, so processes on the original are then refused; without
it, a rebind to a SQLite directory that holds no store is refused (a mistyped directory would otherwise become an
empty store)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("store", help="show or move the store the deployment persists into", description=DESCRIPTION)
    verbs = p.add_subparsers(dest="store_verb", metavar="VERB", required=True)
    show = verbs.add_parser("show", help="the store the consumer group persists into, and this one",
                            description=DESCRIPTION)
    rebind = verbs.add_parser("rebind", help="move the consumer group to the store these settings open",
                              description=DESCRIPTION, epilog=REBIND_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    rebind.add_argument("--new-store", action="store_true",
                        help="this store is new, or a copy of the bound one that replaces it: give it an identity of "
                             "its own first")
    for parser in (show, rebind):
        parser.add_argument("--bootstrap", help="Kafka bootstrap (default COUNTER_KAFKA_BOOTSTRAP or counter up's)")
        parser.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR")
    show.set_defaults(run=run_show)
    rebind.set_defaults(run=run_rebind)


def run_show(args: argparse.Namespace) -> int:
    settings, bootstrap = _settings(args)
    _existing_or_fail(settings)
    mine = _identity(settings)
    try:
        binding = read_binding(bootstrap, settings.stores_topic, settings.worker_id,
                               config=settings.kafka_security.librdkafka())
    except (KafkaException, TimeoutError) as exc:
        fail(_broker_failure(exc, bootstrap))
    console.print(f"consumer group {settings.worker_id} (topic {settings.stores_topic}): "
                  + (binding.described() if binding else "no store bound yet (the first worker or API binds its own)"),
                  soft_wrap=True, highlight=False)
    console.print(f"these settings: store {mine} ({store_location(settings)})", soft_wrap=True, highlight=False)
    if binding is not None and binding.store != mine:
        console.print("[yellow]another store:[/] a worker or API with these settings refuses to start",
                      soft_wrap=True, highlight=False)
        return 1
    if binding is not None and binding.location != store_location(settings):
        console.print(COPY_HINT, soft_wrap=True, highlight=False)
    return 0


COPY_HINT = ("[yellow]note:[/] this store has the bound store's identity but was bound at another location: it is "
             "that store reached another way, or a copy of it (a restored backup, a cloned disk), which passes for it. "
             "A copy run beside the original splits the writes between them; if this one replaces the original, "
             "`counter store rebind --new-store` gives it an identity of its own")


def run_rebind(args: argparse.Namespace) -> int:
    settings, bootstrap = _settings(args)
    _existing_or_fail(settings, new=args.new_store)
    security = settings.kafka_security.librdkafka()
    claim = StoreClaim.now(_identity(settings, new=args.new_store), store_location(settings), rebind=True)
    try:
        ensure_topics(bootstrap, [stores_spec(settings)], admin_config=security)
        before = read_binding(bootstrap, settings.stores_topic, settings.worker_id, config=security)
        if before is not None and before.store == claim.store:
            console.print(f"consumer group {settings.worker_id} already persists into {before.described()}",
                          soft_wrap=True, highlight=False)
            if before.location != claim.location:
                console.print(COPY_HINT, soft_wrap=True, highlight=False)
            return 0
        claimed(bootstrap, settings.stores_topic, settings.worker_id, claim, config=security)
    except (KafkaException, TimeoutError) as exc:
        fail(_broker_failure(exc, bootstrap))
    was = f" (was {before.described()})" if before else ""
    console.print(f"consumer group {settings.worker_id} now persists into store {claim.store} ({claim.location})"
                  f"{was}. Workers still on another store stop within their COUNTER_STORE_BINDING_CHECK_S (30 s by "
                  "default) and APIs fail /readyz; writes the old store holds are not in this one (`counter replay "
                  "--from` reads them again while Kafka keeps them)", soft_wrap=True, highlight=False)
    return 0


def _settings(args: argparse.Namespace) -> tuple[Settings, str]:
    settings = stack_settings_or_exit(data_dir=args.data_dir)
    return settings, resolve_bootstrap(settings, args.bootstrap)


def _existing_or_fail(settings: Settings, *, new: bool = False) -> None:
    """`existing_store_or_fail`, unless `new` says to make a store there."""
    if not new:
        existing_store_or_fail(settings, "; to bind a new, empty store there, `counter store rebind --new-store`")


def _identity(settings: Settings, *, new: bool = False) -> str:
    """The identity of the store the settings open (with `new`, replaced by a new one first)."""
    _, registry = namespaces_or_exit(settings)
    return store_identity(settings.store, settings.data_dir, registry, new=new)


def _broker_failure(exc: Exception, bootstrap: str) -> str:
    if isinstance(exc, KafkaException):
        return kafka_failure(exc, bootstrap)
    return f"Kafka at {bootstrap}: {exc} (is the broker running? `counter up` starts one)"
