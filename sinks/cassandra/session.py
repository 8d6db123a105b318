"""The cassandra-driver side of the backend: cluster options, prepared statements, asyncio bridge.

* One ``Cluster``/``Session`` per process, shared by the event and the rollup store (reference
  counted: the last ``close`` shuts it down).
* Load balancing ``TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc))``: requests go to a replica
  of their partition in the local data center. Consistency ``LOCAL_QUORUM`` by default (URL option
  ``consistency``); ``LOCAL_SERIAL`` for the lightweight transactions (the namespace pin, the watermark claims).
* Every statement the stores send is idempotent (inserts keyed by identity, ``USING TIMESTAMP``
  writes, deletes), so :class:`IdempotentRetryPolicy` may retry write timeouts too.
* Statements are prepared once per CQL text and bound per call; ``execute_async`` futures are
  bridged to asyncio with ``loop.call_soon_threadsafe`` (all result pages are fetched).
* Requests in flight are bounded per process (URL option ``concurrency``) by an asyncio semaphore
  per event loop, and :meth:`CassandraSession.run_all` fans a list of statements out through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import ssl
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from cassandra import ConsistencyLevel, InvalidRequest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import DCAwareRoundRobinPolicy, RetryPolicy, TokenAwarePolicy, WriteType
from cassandra.query import SimpleStatement, tuple_factory

from sinks.availability import StoreAway
from sinks.cassandra.config import CassandraConfig
from sinks.cassandra.cql import BASE_TABLES, Stmt, schema_statements

__all__ = [
    "CassandraSchemaError",
    "CassandraSession",
    "Executor",
    "IdempotentRetryPolicy",
    "MissingTable",
    "bridge_response",
    "build_ssl_context",
    "cluster_options",
    "is_missing_table",
    "run_bounded",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class MissingTable(Exception):
    """A slice table that no longer exists (retention dropped it) or does not exist yet."""

    def __init__(self, table: str | None, cause: BaseException | None = None) -> None:
        super().__init__(f"table {table!r} does not exist" + (f": {cause}" if cause else ""))
        self.table = table


class SliceTableUnknown(StoreAway):
    """A slice table the catalog lists and retention cannot have dropped answered "unconfigured table": its
    coordinator has not applied the table's schema yet (agreement pending, a node down during the DDL). Reading it
    as empty would let a rollup certify a count without its events, for good (a review)."""

    def __init__(self, namespace: str, tables: Sequence[str]) -> None:
        super().__init__(f"namespace {namespace!r}: slice table(s) {', '.join(tables)} are listed in event_slices but "
                         "unknown to the coordinator (schema agreement pending?): retried later")
        self.tables = tuple(tables)


class CassandraSchemaError(RuntimeError):
    """The keyspace or its fixed tables are missing: run ``counter schema apply``."""


class Executor(Protocol):
    """What the stores need from a session (the unit tests substitute an in-memory fake)."""

    keyspace: str
    concurrency: int  # requests in flight at most

    async def run(self, stmt: Stmt) -> list[tuple]: ...

    async def run_all(self, stmts: Sequence[Stmt], *, missing_ok: bool = False) -> list[list[tuple] | None]: ...

    async def ddl(self, stmt: Stmt) -> None: ...

    def acquire(self) -> None: ...

    async def close(self) -> None: ...


def is_missing_table(exc: BaseException) -> bool:
    """Whether a server error says the table does not exist (Cassandra 3.x-5.x wording)."""
    if not isinstance(exc, InvalidRequest):
        return False
    text = str(exc).lower()
    return "unconfigured table" in text or ("table" in text and "does not exist" in text)


# -- bounded fan-out -------------------------------------------------------------------------------------

async def run_bounded(stmts: Sequence[T], one: Callable[[T], Awaitable[R]], limit: int, *,
                      missing_ok: bool) -> list[R | None]:
    """Run ``one(stmt)`` for every statement with at most ``limit`` in flight; results in order.

    The first error stops scheduling more statements and is raised (statements already sent
    complete in the background: every statement is idempotent, so a retry of the whole call is safe).
    With ``missing_ok`` a :class:`MissingTable` yields ``None`` for that statement instead. The items may
    be other work than statements (the event store runs a batch's aggregates through it).
    """
    results: list[R | None] = [None] * len(stmts)
    if not stmts:
        return results
    next_index = 0
    failure: list[BaseException] = []

    async def worker() -> None:
        nonlocal next_index
        while not failure and next_index < len(stmts):
            i = next_index
            next_index += 1
            try:
                results[i] = await one(stmts[i])
            except MissingTable as exc:
                if not missing_ok:
                    failure.append(exc)
                    return
                results[i] = None
            except Exception as exc:
                failure.append(exc)
                return

    await asyncio.gather(*(worker() for _ in range(min(limit, len(stmts)))))
    if failure:
        raise failure[0]
    return results


# -- asyncio bridge ----------------------------------------------------------------------------------------

def bridge_response(response_future: Any) -> asyncio.Future:
    """An asyncio future resolved with every row of a driver ``ResponseFuture`` (all pages).

    Driver callbacks run on the driver's I/O thread; results cross to the loop with
    ``call_soon_threadsafe``. A loop that closed meanwhile (its caller gave up) is ignored.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()
    rows: list[tuple] = []

    def resolve(value: list[tuple]) -> None:
        if not future.done():
            future.set_result(value)

    def reject(exc: BaseException) -> None:
        if not future.done():
            future.set_exception(exc)

    def post(fn, value) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: its caller gave up
            loop.call_soon_threadsafe(fn, value)

    def on_page(page: Any) -> None:
        if page:
            rows.extend(page)
        if response_future.has_more_pages:
            try:
                response_future.start_fetching_next_page()  # invokes on_page again
            except Exception as exc:
                post(reject, exc)
            return
        post(resolve, rows)

    def on_error(exc: BaseException) -> None:
        post(reject, exc)

    response_future.add_callbacks(on_page, on_error)
    return future


# -- cluster options -----------------------------------------------------------------------------------------

_CONDITIONAL = re.compile(r"\sIF\s", re.IGNORECASE)


def is_conditional(cql: str) -> bool:
    """Whether a statement is a lightweight transaction (`IF ...`, `IF NOT EXISTS`): never retried blindly."""
    return _CONDITIONAL.search(cql) is not None


def build_ssl_context(config: CassandraConfig) -> ssl.SSLContext | None:
    if not config.tls:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.ca_file)
    # the driver checks each node's certificate against the address it dials: an IP address (contact points are
    # resolved, peers come from system.peers), so node certificates need IP subject alternative names
    context.check_hostname = config.tls_verify
    if not config.tls_verify:
        log.warning("cassandra TLS without host name verification (tls_verify=0)")
    if config.cert_file and config.key_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    return context


class IdempotentRetryPolicy(RetryPolicy):
    """The driver's default, plus: retry a timed-out write of an idempotent statement (every
    statement of this backend but the lightweight transactions), up to ``max_write_retries`` times at the same
    consistency. A lightweight transaction's timed-out write is not retried, its outcome unknown: its statement is
    not marked idempotent (`is_conditional`), since a timeout in its commit step is reported as a SIMPLE write, not
    CAS, and a retry then answers not applied where the first attempt applied. The driver does still send any
    statement again on the next host after a connection or server error (`on_request_error`, whatever
    `is_idempotent` says; a review): so every caller of a lightweight transaction reads the row back at the serial
    consistency when it answers not applied (`_claim`, `_set_claimed`, `identity`, `_pin`), and a retried one that
    had applied is recognised as its own."""

    def __init__(self, max_write_retries: int = 2) -> None:
        self.max_write_retries = max_write_retries

    def on_write_timeout(self, query: Any, consistency: int, write_type: str, required_responses: int,
                         received_responses: int, retry_num: int) -> tuple[int, int | None]:
        if (write_type != WriteType.CAS and getattr(query, "is_idempotent", False)
                and retry_num < self.max_write_retries):
            return self.RETRY, consistency
        return super().on_write_timeout(query, consistency, write_type, required_responses, received_responses,
                                        retry_num)


def cluster_options(config: CassandraConfig) -> dict[str, Any]:
    """Keyword arguments for ``cassandra.cluster.Cluster`` (pure: nothing connects)."""
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=config.local_dc or "")),
        retry_policy=IdempotentRetryPolicy(),
        consistency_level=ConsistencyLevel.name_to_value[config.consistency],
        serial_consistency_level=ConsistencyLevel.name_to_value[config.serial_consistency],
        request_timeout=config.timeout_s,
        row_factory=tuple_factory,
    )
    options: dict[str, Any] = {
        "contact_points": list(config.hosts),
        "port": config.port,
        "execution_profiles": {EXEC_PROFILE_DEFAULT: profile},
        "connect_timeout": config.connect_timeout_s,
        "control_connection_timeout": config.connect_timeout_s,
        "max_schema_agreement_wait": max(1, math.ceil(config.schema_wait_s)),  # the driver skips the wait at 0
    }
    if config.username is not None:
        options["auth_provider"] = PlainTextAuthProvider(username=config.username, password=config.password or "")
    context = build_ssl_context(config)
    if context is not None:
        options["ssl_context"] = context
    if config.protocol_version is not None:
        options["protocol_version"] = config.protocol_version
    return options


# -- the session -------------------------------------------------------------------------------------------------

class CassandraSession:
    """The real :class:`Executor`: one driver session, prepared statements, bounded async fan-out."""

    def __init__(self, config: CassandraConfig) -> None:
        self.config = config
        self.concurrency = config.concurrency
        self.keyspace = config.keyspace
        self._cluster: Any = None
        self._session: Any = None
        self._prepared: dict[str, Any] = {}
        self._prepare_lock = threading.Lock()
        self._ddl_lock = threading.Lock()
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary())
        self._refs = 0
        self._serial_level: Any = None

    # lifecycle
    def connect(self) -> CassandraSession:
        """Connect (blocking); create the schema when the URL says ``create=1``, otherwise check it."""
        self._cluster = Cluster(**cluster_options(self.config))
        try:
            self._session = self._cluster.connect()
            self._serial_level = ConsistencyLevel.name_to_value[self.config.serial_consistency]
            if self.config.create:
                self.apply_schema()
            else:
                self.check_schema()
        except BaseException:
            self._cluster.shutdown()
            raise
        self._refs = 1
        log.info("connected to %s (dc=%s, consistency=%s)", self.config.redacted(), self.config.local_dc or "auto",
                 self.config.consistency)
        if self.config.unsafe_consistency:
            log.warning("cassandra consistency %s accepted with unsafe_consistency=1: reads may miss the writes they "
                        "follow (see sinks.cassandra.config)", self.config.consistency)
        return self

    def acquire(self) -> None:
        self._refs += 1

    async def close(self) -> None:
        self._refs -= 1
        if self._refs <= 0 and self._cluster is not None:
            cluster, self._cluster, self._session = self._cluster, None, None
            await asyncio.to_thread(cluster.shutdown)

    def apply_schema(self) -> list[str]:
        """Create the keyspace and the fixed tables (idempotent); returns the statements run."""
        statements = schema_statements(self.keyspace, self.config.replication_map())
        for cql in statements:
            self._ddl_sync(cql)
        return statements

    def check_schema(self) -> None:
        meta = self._cluster.metadata.keyspaces.get(self.keyspace)
        if meta is None:
            raise CassandraSchemaError(f"keyspace {self.keyspace!r} does not exist on {self.config.redacted()}: "
                                       "run `counter schema apply` (or add create=1 to the URL for a dev cluster)")
        missing = [t for t in BASE_TABLES if t not in meta.tables]
        if missing:
            raise CassandraSchemaError(f"keyspace {self.keyspace!r} lacks table(s) {', '.join(missing)}: "
                                       "run `counter schema apply`")

    # Executor
    async def run(self, stmt: Stmt) -> list[tuple]:
        async with self._semaphore():
            return await self._execute(stmt)

    async def run_all(self, stmts: Sequence[Stmt], *, missing_ok: bool = False) -> list[list[tuple] | None]:
        return await run_bounded(stmts, self.run, self.config.concurrency, missing_ok=missing_ok)

    async def ddl(self, stmt: Stmt) -> None:
        await asyncio.to_thread(self._ddl_sync, stmt.cql)

    # internals
    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(loop)
        if sem is None:
            sem = self._semaphores[loop] = asyncio.Semaphore(self.config.concurrency)
        return sem

    async def _execute(self, stmt: Stmt) -> list[tuple]:
        if self._session is None:
            raise RuntimeError("cassandra session is closed")
        try:
            prepared: Any = self._prepared.get(stmt.cql)  # a PreparedStatement (the driver is untyped)
            if prepared is None:
                prepared = await asyncio.to_thread(self._prepare_sync, stmt.cql)
            bound = prepared.bind(stmt.params)
            bound.is_idempotent = not is_conditional(stmt.cql)
            bound.fetch_size = self.config.fetch_size
            if stmt.serial:
                bound.consistency_level = self._serial_level
            return await bridge_response(self._session.execute_async(bound, timeout=self.config.timeout_s))
        except Exception as exc:
            if stmt.table is not None and is_missing_table(exc):
                raise MissingTable(stmt.table, exc) from exc
            raise

    def _prepare_sync(self, cql: str) -> Any:
        prepared = self._prepared.get(cql)
        if prepared is None:
            prepared = self._session.prepare(cql)
            with self._prepare_lock:
                self._prepared[cql] = prepared
        return prepared

    def _ddl_sync(self, cql: str) -> None:
        """One schema change at a time per process; the driver waits for schema agreement."""
        with self._ddl_lock:
            timeout = self.config.timeout_s + self.config.schema_wait_s
            result = self._session.execute(SimpleStatement(cql), timeout=timeout)
            if not result.response_future.is_schema_agreed:
                log.warning("schema agreement not reached within %.0fs after: %s", self.config.schema_wait_s,
                            cql.splitlines()[0])
        # Statements prepared against a dropped table are stale: forget them (re-prepared on use).
        if cql.startswith("DROP TABLE"):
            table = cql.rsplit(".", 1)[-1]
            with self._prepare_lock:
                for text in [t for t in self._prepared if f".{table} " in t]:
                    del self._prepared[text]
