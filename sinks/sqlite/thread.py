"""One SQLite connection owned by one dedicated thread, with transactions that survive lock contention.

Why a thread per store: sqlite3 connections must stay on the thread that made them, and the Faust
event loop must never block on disk; async methods await ``run_in_executor`` on that thread.
Why retries: several processes (workers + API) share the files; ``BEGIN IMMEDIATE`` takes the write
lock up front so the 30 s busy timeout applies (a deferred transaction upgrading to a writer can
fail at once with SQLITE_BUSY), and whole transactions are re-run if a lock still escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

__all__ = ["BUSY_TIMEOUT_S", "SqliteThread", "is_busy"]

log = logging.getLogger(__name__)

T = TypeVar("T")

BUSY_TIMEOUT_S = 30.0
_RETRIES = 8  # on top of the busy timeout: ~4 minutes of contention before a lock error escapes
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is a transient lock conflict (SQLITE_BUSY / SQLITE_LOCKED), worth a retry."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    text = str(exc)
    return "locked" in text or "busy" in text


class SqliteThread:
    """Runs callables ``fn(conn, *args)`` on the thread that owns the connection.

    ``setup(conn)`` runs once on that thread, right after the connection opens (schema, caches).
    ``on_rollback()`` runs on that thread after any failed transaction, so callers can drop
    in-memory caches that may have been filled from work that was rolled back.
    """

    def __init__(self, path: str | Path, name: str, setup: Callable[[sqlite3.Connection], None],
                 on_rollback: Callable[[], None] | None = None, *, lock_wait_s: float | None = None) -> None:
        """``lock_wait_s``: how long a call waits for another process's lock before the lock error escapes (None:
        the busy timeout and its retries, about 4 minutes: what a worker's batch can afford; the API answers a
        client, which would rather have an answer in seconds than a request hanging for minutes)."""
        self.path = Path(path)
        self._busy_s = BUSY_TIMEOUT_S if lock_wait_s is None else lock_wait_s
        self._retries = _RETRIES if lock_wait_s is None else 0
        self._setup = setup
        self._on_rollback = on_rollback or (lambda: None)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._lock = threading.Lock()

    # -- entry points -------------------------------------------------------------------------

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(conn, *args)`` on the store's thread without blocking the event loop."""
        if self._closed:
            raise RuntimeError(f"store {self.path} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, fn, args)

    def run_sync(self, fn: Callable[..., T], *args: object) -> T:
        """Blocking variant for synchronous callers (CLI, tests); never call it from the event loop."""
        return self._executor.submit(self._call, fn, args).result()

    async def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_conn)
        self._executor.shutdown(wait=True)

    # -- transactions (call these from inside fn, i.e. on the store's thread) ------------------

    def write(self, conn: sqlite3.Connection, fn: Callable[..., T], *args: object) -> T:
        """``fn(conn, *args)`` inside one ``BEGIN IMMEDIATE`` transaction, re-run if a lock escapes."""
        return self._transaction(conn, "BEGIN IMMEDIATE", fn, args)

    def read(self, conn: sqlite3.Connection, fn: Callable[..., T], *args: object) -> T:
        """``fn(conn, *args)`` on one consistent snapshot (WAL readers never wait for writers)."""
        return self._transaction(conn, "BEGIN", fn, args)

    # -- internals ----------------------------------------------------------------------------

    def _call(self, fn: Callable[..., T], args: tuple[object, ...]) -> T:
        if self._conn is None:
            self._conn = self._retrying(self._open)
        return fn(self._conn, *args)

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=self._busy_s, isolation_level=None, cached_statements=512)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_s * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA cache_size = -65536")  # 64 MiB of page cache per connection
            conn.execute("PRAGMA temp_store = MEMORY")
            self._transaction(conn, "BEGIN IMMEDIATE", self._setup, ())
        except BaseException:
            conn.close()
            raise
        return conn

    def _transaction(self, conn: sqlite3.Connection, begin: str, fn: Callable[..., T],
                     args: tuple[object, ...]) -> T:
        def attempt() -> T:
            conn.execute(begin)
            try:
                result = fn(conn, *args)
                conn.execute("COMMIT")
                return result
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                self._on_rollback()
                raise

        return self._retrying(attempt)

    def _retrying(self, attempt: Callable[[], T]) -> T:
        for n in range(self._retries + 1):
            try:
                return attempt()
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or n == self._retries:
                    raise
                log.warning("%s: %s after the %.0fs busy timeout; retry %d/%d",
                            self.path, exc, self._busy_s, n + 1, self._retries)
                time.sleep(min(0.05 * 2 ** n, 2.0))
        raise AssertionError("unreachable")

    def _close_conn(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("PRAGMA optimize")
            self._conn.close()
            self._conn = None
