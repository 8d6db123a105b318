"""Cassandra for the shared store contract suite (tests/integration/test_store_contract.py).

Where the cluster comes from, in order:
1. ``COUNTER_TEST_CASSANDRA=host:port`` (or a full ``cassandra://...`` URL; its keyspace is ignored);
2. a throw-away ``cassandra`` container through testcontainers, when it is installed
   (``pip install -e '.[testcontainers]'``) and a Docker engine answers;
3. neither: the Cassandra parameter of every contract test is *skipped with the reason*, which
   pytest's ``-ra`` (in addopts) prints in the summary. Never a silent pass.

One keyspace per test process (``counter_contract_<pid>_<random>``, replication 1, created with the
fixed tables), dropped at exit; each test works in a fresh namespace and removes it afterwards.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import uuid
from collections.abc import Callable, Iterator

from sinks.model import Partitioning

__all__ = ["ENV", "NOT_RUN", "contract_stores", "contract_url"]

ENV = "COUNTER_TEST_CASSANDRA"
NOT_RUN = ("Cassandra contract tests not run: set COUNTER_TEST_CASSANDRA=host:port or run a Docker engine "
           "for testcontainers")
IMAGE = os.environ.get("COUNTER_TEST_CASSANDRA_IMAGE", "cassandra:4.1")

_state: dict[str, object] = {}


def _skip(why: str):
    import pytest

    _state["skip"] = why  # later tests skip at once, with the same reason
    pytest.skip(f"{NOT_RUN} ({why})")


def _from_testcontainers() -> str:
    """host:port of a started container, or skip saying why there is none."""
    try:
        from testcontainers.cassandra import CassandraContainer
    except ImportError as exc:
        _skip(f"{ENV} is unset and testcontainers is not installed ({exc}); pip install -e '.[testcontainers]'")
    try:
        import docker  # a testcontainers dependency
    except ImportError as exc:
        _skip(f"{ENV} is unset and the docker client library is missing ({exc})")
    try:
        docker.from_env().ping()
    except Exception as exc:
        _skip(f"{ENV} is unset and no Docker engine answered: {type(exc).__name__}: {exc}")
    container = CassandraContainer(IMAGE)
    try:
        container.start()
    except Exception as exc:
        _skip(f"{ENV} is unset and the {IMAGE} container did not start: {type(exc).__name__}: {exc}")
    atexit.register(container.stop)
    (host, port), *_ = container.get_contact_points()
    return f"{host}:{port}"


def contract_url() -> str:
    """``cassandra://`` URL of this process' contract keyspace (skips when there is no cluster)."""
    url = _state.get("url")
    if isinstance(url, str):
        return url
    if "skip" in _state:
        _skip(str(_state["skip"]))
    target = os.environ.get(ENV, "").strip() or _from_testcontainers()
    if target.startswith("cassandra://"):
        base, _, query = target.partition("?")
        hosts = base[len("cassandra://"):].split("/", 1)[0]
        extra = f"&{query}" if query else ""
    else:
        hosts, extra = target, ""
    keyspace = f"counter_contract_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    url = f"cassandra://{hosts}/{keyspace}?create=1&replication=1{extra}"
    _state["url"] = url
    return url


def _session():
    from sinks.cassandra.store import connect

    session = _state.get("session")
    if session is None:
        session = connect(contract_url())
        _state["session"] = session

        def drop_keyspace() -> None:
            with contextlib.suppress(Exception):
                session._ddl_sync(f"DROP KEYSPACE IF EXISTS {session.keyspace}")
            session._refs = 1
            with contextlib.suppress(Exception):
                asyncio.run(session.close())
        atexit.register(drop_keyspace)
    return session


@contextlib.contextmanager
def contract_stores(partitioning_for: Callable[[str], Partitioning]
                    ) -> Iterator[tuple[object, object, object, str]]:
    """(event store, rollup store, bucket store, fresh namespace) on the shared contract keyspace."""
    from sinks.cassandra.buckets import CassandraBucketStore
    from sinks.cassandra.events import CassandraEventStore
    from sinks.cassandra.rollups import CassandraRollupStore
    from sinks.windows import CHAIN

    session = _session()
    for _ in range(3):  # the stores' close() release these; the session lives until exit
        session.acquire()
    events = CassandraEventStore(session, partitioning_for, table_ids=session.config.table_ids)
    rollups = CassandraRollupStore(session, pending_shards=session.config.pending_shards)
    buckets = CassandraBucketStore(session)
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    try:
        yield events, rollups, buckets, namespace
    finally:
        async def cleanup() -> None:
            await rollups.delete(namespace)
            await events.drop_namespace(namespace)
            for g in CHAIN:
                await buckets.drop_expired(namespace, g, 2**62)
        with contextlib.suppress(Exception):
            asyncio.run(cleanup())


@contextlib.contextmanager
def contract_sketch_stores(partitioning_for: Callable[[str], Partitioning]
                           ) -> Iterator[tuple[object, object, str]]:
    """(event store, sketch store, fresh namespace) on the shared contract keyspace, for the sketch contract
    (tests/integration/test_sketch_contract.py)."""
    from sinks.cassandra.events import CassandraEventStore
    from sinks.cassandra.sketches import CassandraSketchStore
    from sinks.windows import CHAIN

    session = _session()
    for _ in range(2):  # the stores' close() release these; the session lives until exit
        session.acquire()
    events = CassandraEventStore(session, partitioning_for, table_ids=session.config.table_ids)
    sketches = CassandraSketchStore(session)
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    try:
        yield events, sketches, namespace
    finally:
        async def cleanup() -> None:
            await events.drop_namespace(namespace)
            for g in CHAIN:
                await sketches.drop_expired(namespace, g, 2**62)
        with contextlib.suppress(Exception):
            asyncio.run(cleanup())
