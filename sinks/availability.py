"""Whether a store's error says the store is away (locked, failing I/O, full, no replica, timed out) rather than that
one request of it is bad: the worker's rollups wait out such an outage (agents.rollup_batches), the API answers 503
(query_api.responses) instead of a 500.

Why by class and code rather than a store-raised type: the errors come from sqlite3 and cassandra-driver wherever a
store calls them, and this classification is the one place that knows which of theirs mean "away".
"""

from __future__ import annotations

import sqlite3

__all__ = ["StoreAway", "store_unavailable"]


class StoreAway(RuntimeError):
    """A store's own error for an outage it detects itself (a Cassandra coordinator that does not know a table the
    catalog lists yet): waited out like the drivers' outage errors, never read as "no rows"."""


# SQLite primary result codes that say the file is away, not that one counter is bad: BUSY, LOCKED, NOMEM, READONLY,
# IOERR, FULL, CANTOPEN, PROTOCOL, NOTADB. Not SQLITE_ERROR (an overflowing SUM, a missing table), nor CORRUPT: a
# corrupt page may hold one counter's rows, and waiting does not mend it.
_SQLITE_AWAY = frozenset({5, 6, 7, 8, 10, 13, 14, 15, 26})
# cassandra-driver errors that say the cluster is away (by name: the driver is loaded only with a Cassandra store)
_CASSANDRA_AWAY = frozenset({"NoHostAvailable", "Unavailable", "Timeout", "OperationTimedOut", "ConnectionException",
                             "OverloadedErrorMessage", "IsBootstrappingErrorMessage"})


# Protocol v5's CAS_WRITE_UNKNOWN (Cassandra 4.0+): a lightweight transaction whose outcome is unknown under contention
# or a lost quorum, which protocol v4 reports as a WriteTimeout of type CAS. cassandra-driver 3.30 decodes it as the
# bare protocol.ErrorMessage, never shown to the retry policy; every caller of an LWT re-reads at the serial level.
_CAS_WRITE_UNKNOWN = 0x1700


def store_unavailable(exc: BaseException) -> bool:
    """Whether an error says the store is away (locked, failing I/O, full, no replica, timed out) rather than that
    one counter cannot be rolled up (an overflowing sum, a bad row). Only such errors can prove an outage; one counter
    can still fail with one alone (a read timing out on a huge partition), so one counter proves nothing."""
    if isinstance(exc, OSError | StoreAway):  # refused or reset connections, timeouts (TimeoutError), disk errors
        return True
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in _SQLITE_AWAY
    if type(exc).__name__ == "ErrorMessage" and getattr(exc, "code", None) == _CAS_WRITE_UNKNOWN:
        return True  # the driver has no class for it: a Paxos round whose outcome is unknown (a review)
    return any(cls.__module__.startswith("cassandra") and cls.__name__ in _CASSANDRA_AWAY for cls in type(exc).__mro__)
