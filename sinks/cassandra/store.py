"""Cassandra backend, the production store: open the event, rollup and bucket stores on one shared driver session.

``COUNTER_STORE=cassandra://host1,host2:9042/keyspace?dc=dc1`` selects it (URL options in
``sinks.cassandra.config``). The keyspace and fixed tables come from ``counter schema apply``
(or ``create=1`` on a dev cluster); slice tables are created by the workers as time moves on.
Layout and concurrency rules are documented in ``sinks.cassandra.events``, ``sinks.cassandra.rollups`` and
``sinks.cassandra.buckets``.
"""

from __future__ import annotations

from collections.abc import Callable

from sinks.base import Stores
from sinks.cassandra.buckets import CassandraBucketStore
from sinks.cassandra.config import CassandraConfig, parse_cassandra_url
from sinks.cassandra.events import CassandraEventStore
from sinks.cassandra.rollups import CassandraRollupStore
from sinks.cassandra.session import CassandraSession
from sinks.model import Partitioning
from sinks.windows import Granularity

__all__ = ["CassandraBucketStore", "CassandraEventStore", "CassandraRollupStore", "connect", "open_cassandra_stores"]


def connect(config: CassandraConfig | str) -> CassandraSession:
    """A connected session (blocking): schema created with ``create=1``, otherwise checked."""
    cfg = parse_cassandra_url(config) if isinstance(config, str) else config
    return CassandraSession(cfg).connect()


def open_cassandra_stores(url: str, partitioning_for: Callable[[str], Partitioning], *,
                          delete_after_for: Callable[[str], float | None] | None = None,
                          retention_for: Callable[[str, Granularity], float | None] | None = None) -> Stores:
    """The three stores on one session; closing all three shuts the session down."""
    config = parse_cassandra_url(url)
    session = connect(config)
    session.acquire()  # connect() holds the events store's reference; one more for each further store
    session.acquire()
    events = CassandraEventStore(session, partitioning_for, delete_after_for=delete_after_for,
                                 ttl_grace_s=config.ttl_grace_s, table_ids=config.table_ids)
    rollups = CassandraRollupStore(session, pending_shards=config.pending_shards)
    buckets = CassandraBucketStore(session, retention_for=retention_for, ttl_grace_s=config.ttl_grace_s)
    return Stores(events, rollups, buckets)
