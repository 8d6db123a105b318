"""The driver side without a server: cluster options, retry policy, the asyncio bridge, statement
binding and bounded fan-out (driver objects replaced by small fakes where a server would answer)."""

from __future__ import annotations

import asyncio
import logging
import threading
from types import SimpleNamespace

import pytest
from cassandra import ConsistencyLevel, InvalidRequest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster
from cassandra.policies import DCAwareRoundRobinPolicy, RetryPolicy, TokenAwarePolicy, WriteType
from cassandra.query import tuple_factory

from sinks.cassandra.config import parse_cassandra_url
from sinks.cassandra.cql import BASE_TABLES, EventCql, RollupCql, Stmt
from sinks.cassandra.session import (
    CassandraSchemaError,
    CassandraSession,
    IdempotentRetryPolicy,
    MissingTable,
    bridge_response,
    build_ssl_context,
    cluster_options,
    is_conditional,
    is_missing_table,
    run_bounded,
)

# -- cluster options ---------------------------------------------------------------------------------------


def test_cluster_options_dc_aware_token_aware_local_quorum():
    opts = cluster_options(parse_cassandra_url("cassandra://a,b:9142/ks?dc=dc1&timeout=3&schema_wait=20"))
    assert opts["contact_points"] == ["a", "b"] and opts["port"] == 9142
    assert opts["max_schema_agreement_wait"] == 20
    profile = opts["execution_profiles"][EXEC_PROFILE_DEFAULT]
    lb = profile.load_balancing_policy
    assert isinstance(lb, TokenAwarePolicy) and isinstance(lb._child_policy, DCAwareRoundRobinPolicy)
    assert lb._child_policy.local_dc == "dc1"
    assert profile.consistency_level == ConsistencyLevel.LOCAL_QUORUM
    assert profile.serial_consistency_level == ConsistencyLevel.LOCAL_SERIAL
    assert isinstance(profile.retry_policy, IdempotentRetryPolicy)
    assert profile.request_timeout == 3 and profile.row_factory is tuple_factory
    assert "auth_provider" not in opts and "ssl_context" not in opts and "protocol_version" not in opts


def test_cluster_options_auth_tls_protocol_and_consistency():
    opts = cluster_options(parse_cassandra_url(
        "cassandra://u:p@h/ks?consistency=EACH_QUORUM&serial_consistency=SERIAL&tls=1&tls_verify=0&protocol=4"))
    assert isinstance(opts["auth_provider"], PlainTextAuthProvider)
    assert (opts["auth_provider"].username, opts["auth_provider"].password) == ("u", "p")
    assert opts["ssl_context"].check_hostname is False and opts["protocol_version"] == 4
    profile = opts["execution_profiles"][EXEC_PROFILE_DEFAULT]
    assert profile.consistency_level == ConsistencyLevel.EACH_QUORUM
    assert profile.serial_consistency_level == ConsistencyLevel.SERIAL
    assert profile.load_balancing_policy._child_policy.local_dc == ""  # no dc: the driver picks the contact's DC


def test_tls_context_verifies_hosts_by_default():
    ctx = build_ssl_context(parse_cassandra_url("cassandra://h/ks?tls=1"))
    assert ctx is not None and ctx.check_hostname is True
    assert build_ssl_context(parse_cassandra_url("cassandra://h/ks")) is None
    with pytest.raises(OSError):
        build_ssl_context(parse_cassandra_url("cassandra://h/ks?tls=1&ca=/no/such/ca.pem"))


def test_the_driver_accepts_the_options_without_connecting():
    cluster = Cluster(**cluster_options(parse_cassandra_url("cassandra://u:p@127.0.0.1/ks?dc=dc1&tls=1")))
    try:
        assert cluster.contact_points == ["127.0.0.1"] and cluster.port == 9042
    finally:
        cluster.shutdown()


# -- retry policy -------------------------------------------------------------------------------------------


def _timeout(policy: RetryPolicy, *, idempotent: bool, write_type=WriteType.SIMPLE, retry_num: int = 0):
    query = SimpleNamespace(is_idempotent=idempotent)
    return policy.on_write_timeout(query, ConsistencyLevel.LOCAL_QUORUM, write_type, 2, 1, retry_num)


def test_idempotent_writes_are_retried_lwt_and_others_are_not():
    policy = IdempotentRetryPolicy(max_write_retries=2)
    assert _timeout(policy, idempotent=True) == (RetryPolicy.RETRY, ConsistencyLevel.LOCAL_QUORUM)
    assert _timeout(policy, idempotent=True, retry_num=1)[0] == RetryPolicy.RETRY
    assert _timeout(policy, idempotent=True, retry_num=2)[0] == RetryPolicy.RETHROW
    assert _timeout(policy, idempotent=True, write_type=WriteType.CAS)[0] == RetryPolicy.RETHROW
    assert _timeout(policy, idempotent=False)[0] == RetryPolicy.RETHROW
    assert _timeout(policy, idempotent=False, write_type=WriteType.BATCH_LOG)[0] == RetryPolicy.RETRY


# -- missing tables ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("message, missing", [
    ("Error from server: code=2200 [Invalid query] message=\"unconfigured table ev_ns_1_2\"", True),
    ("table ks.ev_ns_1_2 does not exist", True),
    ("Keyspace ks does not exist", False),
    ("Invalid STRING constant", False),
])
def test_missing_table_errors_are_recognised(message, missing):
    assert is_missing_table(InvalidRequest(message)) is missing
    assert is_missing_table(RuntimeError("unconfigured table x")) is False


# -- bridge ------------------------------------------------------------------------------------------------------


class FakeResponseFuture:
    """Delivers pages (or an error) from another thread, like the driver's I/O thread."""

    def __init__(self, pages: list[list[tuple]], error: BaseException | None = None, fail_paging: bool = False):
        self.pages = pages
        self.error = error
        self.fail_paging = fail_paging
        self.index = 0
        self.callbacks = None
        self.requests = 1

    @property
    def has_more_pages(self) -> bool:
        return self.index < len(self.pages) - 1

    def add_callbacks(self, callback, errback):
        self.callbacks = (callback, errback)
        self._deliver()

    def start_fetching_next_page(self):
        if self.fail_paging:
            raise RuntimeError("paging failed")
        self.index += 1
        self.requests += 1
        self._deliver()

    def _deliver(self):
        callback, errback = self.callbacks
        if self.error is not None:
            threading.Thread(target=errback, args=(self.error,)).start()
        else:
            threading.Thread(target=callback, args=(self.pages[self.index],)).start()


def test_bridge_collects_every_page_from_the_driver_thread():
    rf = FakeResponseFuture([[(1,), (2,)], [(3,)], [(4,), (5,)]])

    async def main():
        return await bridge_response(rf)
    assert asyncio.run(main()) == [(1,), (2,), (3,), (4,), (5,)] and rf.requests == 3


def test_bridge_handles_empty_and_void_results_and_errors():
    async def main(rf):
        return await bridge_response(rf)
    assert asyncio.run(main(FakeResponseFuture([None]))) == []
    assert asyncio.run(main(FakeResponseFuture([[]]))) == []
    with pytest.raises(InvalidRequest):
        asyncio.run(main(FakeResponseFuture([[]], error=InvalidRequest("boom"))))
    with pytest.raises(RuntimeError, match="paging failed"):
        asyncio.run(main(FakeResponseFuture([[(1,)], [(2,)]], fail_paging=True)))


def test_bridge_ignores_a_result_after_its_loop_closed():
    rf = FakeResponseFuture([[(1,)]])
    rf.add_callbacks = lambda cb, eb: setattr(rf, "callbacks", (cb, eb))  # hold the result back

    async def main():
        future = bridge_response(rf)
        future.cancel()
    asyncio.run(main())
    rf.callbacks[0]([(1,)])  # the loop is closed now: no exception escapes into the driver thread


# -- bounded fan-out ----------------------------------------------------------------------------------------


def _stmts(n: int, table: str | None = None) -> list[Stmt]:
    return [Stmt("op", "SELECT ?", (i,), table=table) for i in range(n)]


def test_run_bounded_keeps_order_and_bounds_in_flight():
    state = {"now": 0, "max": 0}

    async def one(stmt):
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.001 * (stmt.params[0] % 3))
        state["now"] -= 1
        return [stmt.params]
    results = asyncio.run(run_bounded(_stmts(50), one, 4, missing_ok=False))
    assert results == [[(i,)] for i in range(50)] and state["max"] == 4
    assert asyncio.run(run_bounded([], one, 4, missing_ok=False)) == []


def test_run_bounded_missing_tables_and_first_error():
    sent = []

    async def one(stmt):
        sent.append(stmt.params[0])
        if stmt.params[0] == 3:
            raise MissingTable("t")
        if stmt.params[0] == 5:
            raise TimeoutError("boom")
        return [stmt.params]
    results = asyncio.run(run_bounded(_stmts(5), one, 2, missing_ok=True))
    assert results[3] is None and results[4] == [(4,)]
    with pytest.raises(MissingTable):
        asyncio.run(run_bounded(_stmts(5), one, 2, missing_ok=False))
    sent.clear()
    with pytest.raises(TimeoutError):
        asyncio.run(run_bounded(_stmts(100), one, 1, missing_ok=True))
    assert max(sent) == 5  # nothing scheduled after the first error


# -- the session with a fake driver session ---------------------------------------------------------------------


class FakePrepared:
    def __init__(self, cql):
        self.cql = cql

    def bind(self, params):
        return SimpleNamespace(cql=self.cql, params=tuple(params), is_idempotent=False, fetch_size=None,
                               consistency_level=None)


class FakeDriverSession:
    def __init__(self, *, prepare_error: BaseException | None = None):
        self.prepared: list[str] = []
        self.executed: list[SimpleNamespace] = []
        self.timeouts: list[float] = []
        self.prepare_error = prepare_error
        self.ddl: list[str] = []
        self.agreed = True

    def prepare(self, cql):
        if self.prepare_error is not None:
            raise self.prepare_error
        self.prepared.append(cql)
        return FakePrepared(cql)

    def execute_async(self, bound, timeout=None):
        self.executed.append(bound)
        self.timeouts.append(timeout)
        return FakeResponseFuture([[bound.params]])

    def execute(self, statement, timeout=None):
        self.ddl.append(statement.query_string)
        return SimpleNamespace(response_future=SimpleNamespace(is_schema_agreed=self.agreed))


def _session(url: str = "cassandra://h/ks?concurrency=3&fetch_size=123&timeout=4", **kw) -> CassandraSession:
    s = CassandraSession(parse_cassandra_url(url))
    s._session = FakeDriverSession(**kw)
    s._serial_level = ConsistencyLevel.LOCAL_SERIAL
    s._refs = 1
    return s


def test_statements_are_prepared_once_and_bound_idempotent():
    s = _session()
    stmt = RollupCql("ks").get("ns", "c")

    async def main():
        return [await s.run(stmt), await s.run(stmt), await s.run(EventCql("ks").get_namespace("ns", serial=True))]
    results = asyncio.run(main())
    assert results[0] == [("ns", "c")]
    driver = s._session
    assert driver.prepared == [stmt.cql, EventCql("ks").get_namespace("ns").cql]
    assert all(b.is_idempotent and b.fetch_size == 123 for b in driver.executed)
    assert driver.executed[0].consistency_level is None  # the profile's LOCAL_QUORUM
    assert driver.executed[2].consistency_level == ConsistencyLevel.LOCAL_SERIAL
    assert driver.timeouts == [4, 4, 4]


def test_a_missing_table_surfaces_as_missing_table_only_for_slice_statements():
    s = _session(prepare_error=InvalidRequest("unconfigured table ev_x_1_2"))
    with pytest.raises(MissingTable):
        asyncio.run(s.run(EventCql("ks").rows("ev_x_1_2", "ns", "c", 1, 0, 0, 10)))
    with pytest.raises(InvalidRequest):
        asyncio.run(s.run(RollupCql("ks").get("ns", "c")))


def test_run_all_is_bounded_by_the_configured_concurrency():
    s = _session()
    state = {"now": 0, "max": 0}
    real = s._execute

    async def counting(stmt):
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.001)
        try:
            return await real(stmt)
        finally:
            state["now"] -= 1
    s._execute = counting

    async def main():  # two concurrent fan-outs share one per-loop bound
        return await asyncio.gather(s.run_all(_stmts(20)), s.run_all(_stmts(20)))
    a, b = asyncio.run(main())
    assert a == b == [[(i,)] for i in range(20)] and state["max"] == 3
    asyncio.run(main())  # a fresh event loop gets its own semaphore


def test_ddl_waits_for_agreement_and_forgets_statements_of_dropped_tables(caplog):
    s = _session()
    cql = EventCql("ks")
    asyncio.run(s.run(cql.rows("ev_a_1_2", "ns", "c", 1, 0, 0, 10)))
    asyncio.run(s.run(cql.rows("ev_a_1_3", "ns", "c", 1, 0, 0, 10)))
    s._session.agreed = False
    with caplog.at_level(logging.WARNING):
        asyncio.run(s.ddl(cql.drop_slice("ev_a_1_2")))
    assert "schema agreement not reached" in caplog.text
    assert s._session.ddl == ["DROP TABLE IF EXISTS ks.ev_a_1_2"]
    assert [c for c in s._prepared if "ev_a_1_2" in c] == [] and any("ev_a_1_3" in c for c in s._prepared)


def test_schema_check_names_what_is_missing():
    s = _session()
    s._cluster = SimpleNamespace(metadata=SimpleNamespace(keyspaces={}))
    with pytest.raises(CassandraSchemaError, match=r"keyspace 'ks' does not exist.*counter schema apply"):
        s.check_schema()
    s._cluster.metadata.keyspaces["ks"] = SimpleNamespace(tables={t: None for t in BASE_TABLES if t != "rollups"})
    with pytest.raises(CassandraSchemaError, match="lacks table\\(s\\) rollups"):
        s.check_schema()
    s._cluster.metadata.keyspaces["ks"].tables["rollups"] = None
    s.check_schema()


def test_apply_schema_runs_keyspace_then_tables():
    s = _session("cassandra://h/ks?dc=dc1&replication=3")
    statements = s.apply_schema()
    assert s._session.ddl == statements and statements[0].startswith("CREATE KEYSPACE IF NOT EXISTS ks")
    assert "'dc1': 3" in statements[0] and len(statements) == 1 + len(BASE_TABLES)


def test_close_is_reference_counted():
    s = _session()
    shut = []
    s._cluster = SimpleNamespace(shutdown=lambda: shut.append(True))
    s.acquire()
    asyncio.run(s.close())
    assert shut == []
    asyncio.run(s.close())
    assert shut == [True] and s._session is None
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(s.run(RollupCql("ks").get("ns", "c")))


def test_lightweight_transactions_are_bound_not_idempotent_so_a_timeout_is_never_retried_blindly():
    """A review: a timeout in an LWT's commit step is reported as a SIMPLE write, not CAS, and every statement was
    bound idempotent, so the policy retried it; the retry answers not applied where the first attempt applied."""
    s = _session()
    cql = RollupCql("ks")
    lwt, plain = cql.first_claim("t", 0, 7), cql.get("ns", "c")
    assert is_conditional(lwt.cql) and not is_conditional(plain.cql)

    async def main():
        await s.run(lwt)
        await s.run(plain)
    asyncio.run(main())
    assert [b.is_idempotent for b in s._session.executed] == [False, True]
    assert _timeout(IdempotentRetryPolicy(), idempotent=False, write_type=WriteType.SIMPLE)[0] == RetryPolicy.RETHROW


def test_a_sub_second_schema_wait_still_waits_and_a_keyspace_is_folded_as_cql_folds_it():
    """A review: int(0.5) is 0, with which the driver skips schema agreement altogether; and `Counters` was created
    as `counters` (unquoted) but looked up as `Counters`, so every start said the keyspace was missing."""
    assert cluster_options(parse_cassandra_url("cassandra://h/ks?schema_wait=0.5"))["max_schema_agreement_wait"] == 1
    assert parse_cassandra_url("cassandra://h/Counters").keyspace == "counters"
