"""The API's HTTP protocol: uvicorn's httptools protocol that serves the hottest calls straight from the parser.

Why: at concurrency 32 a cached GetCount spent about 60% of the event loop in ASGI plumbing (scope, receive
and send messages, middleware, routing) around a single memcached round trip. For a POST to one of
`fastpath.FAST_PATHS` this protocol keeps the body, asks `fastpath.fast_call` whether it is the plain case,
and if so writes the response itself from a done callback on the service's awaitable. A plain durable AddCount
goes first to `CounterService.write_plain` (read and encoded in C, query_api.plain_add), and the AddCounts of one
group-commit record are answered together in one callback on its acknowledgement (`_Answers`); a chunk that is
exactly one such request, on an idle connection, does not even go through the parser (`_plain_request`, a third of
its Python). Anything else (other
paths, API keys, invalid bodies, pipelined requests behind a busy one, `Expect: 100-continue`) is replayed
into uvicorn's own request cycle unchanged, so the FastAPI app answers it as before.

Use it with `uvicorn.run(..., http=CounterHttpProtocol)` (what `python -m query_api` does).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from producers.group_commit import Acknowledgement
from query_api import metrics
from query_api.fastpath import ADD_COUNT, FAST_PATHS, fast_call
from query_api.responses import SERVICE_ERRORS, answerable, error_response
from query_api.service import refused_by_record

log = logging.getLogger(__name__)

MAX_FAST_BODY = 16 * 1024  # larger bodies are not the plain case: hand them to the app as they arrive
_JSON = b"content-type: application/json\r\n"
_CLOSE = b"connection: close\r\n"


class _Noop:
    def set(self) -> None:
        pass


_NOOP = _Noop()


class FastCycle:
    """The state uvicorn's protocol reads from `self.cycle` while a fast request is in flight.

    While `response_complete` is False uvicorn queues any pipelined request behind it; `shutdown()` clears
    `keep_alive`; `connection_lost` sets `disconnected` and pokes `message_event`.
    """

    __slots__ = ("disconnected", "keep_alive", "message_event", "response_complete")

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.disconnected = False
        self.response_complete = False
        self.message_event = _NOOP


class _Heads:
    """Response heads up to the content type, per status, for uvicorn's current default headers (date and
    server; uvicorn replaces that list when the date changes, every second)."""

    def __init__(self) -> None:
        self.defaults: list[tuple[bytes, bytes]] | None = None
        self.by_status: dict[int, bytes] = {}

    def get(self, defaults: list[tuple[bytes, bytes]], status: int) -> bytes:
        if defaults is not self.defaults:
            self.defaults, self.by_status = defaults, {}
        head = self.by_status.get(status)
        if head is None:
            head = self.by_status[status] = b"".join(
                [STATUS_LINE[status], *(b"%s: %s\r\n" % (name, value) for name, value in defaults), _JSON])
        return head


_HEADS = _Heads()


class _Answers:
    """The plain AddCounts (query_api.plain_add) waiting on one group-commit record, answered in one callback when
    the broker has acknowledged it (or with the 503 of its failure): no future, callback or task per request.
    `waiting` is flat, five values per request: its protocol, its cycle, its answer, when it arrived and its event
    time (with the token in its answer, the identity its failure answers)."""

    __slots__ = ("tasks", "waiting")

    def __init__(self, tasks: set[Any]) -> None:
        self.tasks = tasks  # uvicorn's set of what its shutdown waits for (shared by the connections)
        self.waiting: list[Any] = []

    def answer(self, acknowledged: Acknowledgement) -> None:
        del _ANSWERS[acknowledged]
        self.tasks.discard(acknowledged)
        status, failure = _outcome(acknowledged, _NO_BODY, "plain AddCount failed")  # b"" once acknowledged
        waiting = self.waiting
        if not failure and (stamp := acknowledged.result()) is not None:
            waiting = _judged(waiting, stamp)  # the record's timestamp disagreed with this process's clock
            if not waiting:
                return
        head = _HEADS.get(waiting[0].server_state.default_headers, status)  # the server's: one for all connections
        for i in range(0, len(waiting), 5):
            protocol, cycle, answer, _started, event_time = waiting[i:i + 5]
            try:
                body = _failed(acknowledged, failure, answer, event_time) if failure else answer
                protocol._respond_with(cycle, head, body)
            except Exception:  # one connection's trouble must not leave the record's other writes unanswered
                log.exception("answering a plain AddCount failed")
        now = time.perf_counter()
        metrics.record_many(ADD_COUNT_ENDPOINT, status, [now - started for started in waiting[3::5]])


def _judged(waiting: list[Any], stamp_us: int) -> list[Any]:
    """Answer the plain AddCounts (`_Answers.waiting`) that the worker will refuse by their record's timestamp with
    their 503 (query_api.service.refused_by_record) now; the others, to answer as acknowledged."""
    admitted: list[Any] = []
    for i in range(0, len(waiting), 5):
        protocol, cycle, answer, started, event_time = waiting[i:i + 5]
        written = orjson.loads(answer)  # the namespace and token are in the answer
        ns = protocol.app_state["service"].registry[written["namespace"]]
        token = written["idempotency_token"]
        refused = refused_by_record(ns, token, event_time, stamp_us)
        if refused is None:
            admitted += waiting[i:i + 5]
            continue
        status, detail = error_response(refused, (token, event_time))
        try:
            protocol._respond(cycle, status, orjson.dumps(detail))
        except Exception:  # as in _Answers.answer
            log.exception("answering a plain AddCount failed")
        metrics.record(ADD_COUNT_ENDPOINT, status, time.perf_counter() - started)
    return admitted


def _failed(acknowledged: Acknowledgement, failure: bytes, answer: bytes, event_time: int) -> bytes:
    """A plain AddCount's answer when its record failed: the failure's body, with the write's identity when the
    failure is a service error (its token is in the answer it would have had)."""
    exc = acknowledged.exception() if not acknowledged.cancelled() else None
    if not isinstance(exc, SERVICE_ERRORS):
        return failure
    return orjson.dumps(error_response(exc, (orjson.loads(answer)["idempotency_token"], event_time))[1])


def _outcome(future: asyncio.Future[Any], render: Callable[[Any], bytes], *failed: object) -> tuple[int, bytes]:
    """A settled fast call's status and body: `render` of its result, or the response of its failure (a service
    error as the app maps it, with the write's identity when `render` carries one, anything else a 500, logged
    with `failed`: a message and its arguments)."""
    try:
        return 200, render(future.result())
    except (Exception, asyncio.CancelledError) as exc:
        if isinstance(exc, Exception) and answerable(exc):
            status, detail = error_response(exc, getattr(render, "identity", None))
            return status, orjson.dumps(detail)  # compact, like the app's JSONResponse
        log.exception(*failed)
        return 500, b'{"detail":"Internal Server Error"}'


def _NO_BODY(_result: object) -> bytes:
    return b""


def _declares_large_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the Content-Length is over MAX_FAST_BODY: such a request goes to the app as its headers end, so a
    body over the app's limit is answered 413 at once (`app.BodyLimit`), not after the fast path buffered 16 KiB."""
    for name, value in headers:
        if name == b"content-length":
            return not value.isdigit() or int(value) > MAX_FAST_BODY
    return False


_ANSWERS: dict[Acknowledgement, _Answers] = {}  # by the record's acknowledgement future, until it is done
ADD_COUNT_ENDPOINT = FAST_PATHS[ADD_COUNT]
_UPGRADE = re.compile(rb"\r\nupgrade:[^\r\n]*(?=\r\n|\Z)", re.IGNORECASE)  # the head's last line ends at \Z


def _without_upgrade(data: bytes) -> bytes:
    """A request's first chunk without its `Upgrade` header. The API serves no websocket and no HTTP/2, and a server
    may ignore an upgrade it does not do (RFC 9110, 7.8): the request is answered in HTTP/1.1. The parser stopped at
    the upgrade instead: `curl --http2 -d ...` (Upgrade: h2c) reached the app without its body (a 422 "Field
    required"), and a POST asking for a websocket was never answered."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return data
    head = _UPGRADE.sub(b"", data[:end])
    return data if len(head) == end else head + data[end:]




class CounterHttpProtocol(HttpToolsProtocol):
    _fast_body: bytes | None = None
    _idle_since: float | None = None  # when the last response completed; None while a request is in flight
    _between_messages = True  # the parser is between two requests (none begun and not finished)
    _deferred_400: str | None = None  # an unparsable request's answer, waiting for the answers of those before it
    _half_closed = False  # the client shut its sending side: close once every request it sent is answered
    _until_drained = False  # a response completed while the transport's buffer was full: the rest waits for it

    def data_received(self, data: bytes) -> None:
        """uvicorn's (which feeds the parser), but for a chunk that `_plain_request` takes whole."""
        if self._deferred_400 is not None:  # the parser failed on an earlier chunk: nothing after it is read
            return
        if self._between_messages and type(data) is bytes:
            if self._plain_request(data):
                return
            if b"pgrade" in data or b"PGRADE" in data:  # Upgrade, any case: other requests are not read for it
                data = _without_upgrade(data)
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        """uvicorn answers an unparsable request at once and closes the connection, dropping the answers of the
        requests pipelined before it, which were counted: a client then retries a counted write (a review). So
        the 400 waits until they are answered, reading nothing more meanwhile."""
        cycle = self.cycle
        if (cycle is not None and not cycle.response_complete) or self.pipeline:
            self._deferred_400 = msg
            self.flow.pause_reading()
            return
        super().send_400_response(msg)

    def _plain_request(self, data: bytes) -> bool:
        """Take a chunk that is exactly one plain AddCount request (`_plain_add.add_request`: HTTP/1.1, keep-alive,
        plain headers, the whole body), arriving on an idle connection between messages, straight to
        `write_plain_request`: no parser callbacks, a third of the Python such an AddCount cost. False when it is not
        taken, and the parser then reads the chunk as it reads any (a write refused here is refused there again,
        with its error: nothing was sent)."""
        cycle = self.cycle
        if (cycle is not None and not cycle.response_complete) or self.pipeline or self.limit_concurrency is not None:
            return False
        service = self.app_state.get("service")
        if service is None:
            return False
        try:
            plain = service.write_plain_request(data)
        except SERVICE_ERRORS:  # refused before anything was sent (admission): the parser's way answers it
            return False
        except Exception as exc:  # unexpected: the 500 the parser's way would give
            failed = self.loop.create_future()
            failed.set_exception(exc)
            self._idle_since = None
            self._settle(self._fast_cycle(keep_alive=True), ADD_COUNT, failed, bytes)
            return True
        if plain is None:
            return False
        self._idle_since = None
        answer, acknowledged, event_time = plain
        fast: Any = cycle  # uvicorn types it RequestResponseCycle; a FastCycle on this path
        if type(fast) is FastCycle and fast.keep_alive and not fast.disconnected:  # the last one's, answered
            fast.response_complete = False  # reused: a request object less per write on a keep-alive connection
        else:
            fast = self._fast_cycle(keep_alive=True)  # HTTP/1.1, no close
        self._answer_when_acknowledged(answer, acknowledged, event_time, fast)
        return True

    # -- httptools parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        """uvicorn builds the ASGI scope here; a fast request never needs one, so `_begin_app_request` builds
        it only when the request goes to the app."""
        self._between_messages = False
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def on_headers_complete(self) -> None:
        idle = (self.cycle is None or self.cycle.response_complete) and not self.pipeline
        if (idle and self.url in FAST_PATHS and not self.expect_100_continue and self.limit_concurrency is None
                and self.parser.get_method() == b"POST" and self.app_state.get("service") is not None
                and not _declares_large_body(self.headers)):
            self._fast_body = b""
            return
        self._fast_body = None
        self._begin_app_request()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._fast_body is None:
            super().on_body(body)
            return
        self._fast_body += body  # usually the one chunk: b"" + body is body, no copy
        if len(self._fast_body) > MAX_FAST_BODY:
            self._to_app(self._fast_body)

    def on_message_complete(self) -> None:
        self._between_messages = True
        if self._fast_body is None:
            super().on_message_complete()
            return
        body, self._fast_body = self._fast_body, None
        service = self.app_state["service"]
        try:
            if self.url == ADD_COUNT and (plain := service.write_plain(body)) is not None:
                answer, acknowledged, event_time = plain
                self._answer_when_acknowledged(answer, acknowledged, event_time, self._fast_cycle())
                return
            call = fast_call(service, self.url, body)
        except Exception as exc:  # raised before any await: answered by _done like a failed call
            failed = self.loop.create_future()
            failed.set_exception(exc)
            call = failed, bytes
        if call is None:
            self._to_app(body)
            super().on_message_complete()
            return
        awaitable, render = call
        self._settle(self._fast_cycle(), self.url, awaitable, render)

    # -- internals --------------------------------------------------------------------------------------

    def _fast_cycle(self, keep_alive: bool | None = None) -> FastCycle:
        """The cycle of the fast request just read, as `self.cycle`; keep-alive as the parser read it unless given."""
        if keep_alive is None:
            keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        cycle = FastCycle(keep_alive)
        self.cycle = cycle  # type: ignore[assignment]  # uvicorn types it RequestResponseCycle: FastCycle has what it reads
        return cycle

    def _settle(self, cycle: FastCycle, path: bytes, awaitable: Awaitable[Any], render: Callable[[Any], bytes]) -> None:
        """Answer `render(result)` once `awaitable` settles, or the response of its failure (`_done`)."""
        future = (awaitable if isinstance(awaitable, asyncio.Future)
                  else self.loop.create_task(awaitable))  # type: ignore[arg-type]  # not a Future: a coroutine
        future.add_done_callback(functools.partial(self._done, cycle, path, render, time.perf_counter()))
        # uvicorn's shutdown waits while this set is not empty; it is typed set[Task], a Future serves as well
        self.tasks.add(future)  # type: ignore[arg-type]

    def _answer_when_acknowledged(self, answer: bytes, acknowledged: Acknowledgement, event_time: int,
                                  cycle: FastCycle) -> None:
        """Answer a plain AddCount with `answer` once its record is acknowledged, in one callback per record."""
        answers = _ANSWERS.get(acknowledged)
        if answers is None:
            answers = _ANSWERS[acknowledged] = _Answers(self.tasks)
            acknowledged.add_done_callback(answers.answer)
            self.tasks.add(acknowledged)  # type: ignore[arg-type]  # as in on_message_complete
        answers.waiting += (self, cycle, answer, time.perf_counter(), event_time)

    def _begin_app_request(self) -> None:
        """uvicorn's own on_message_begin (the ASGI scope), keeping what the parser has read since."""
        url, headers, expect_100_continue = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()
        self.url, self.expect_100_continue = url, expect_100_continue
        self.headers = self.scope["headers"] = headers

    def _to_app(self, body: bytes) -> None:
        """Hand the request so far (headers, and the body read until now) to uvicorn's own cycle: the FastAPI
        app answers it."""
        self._fast_body = None
        self._begin_app_request()
        super().on_headers_complete()
        if body:
            super().on_body(body)

    def _done(self, cycle: FastCycle, path: bytes, render: Callable[[Any], bytes], started: float,
              future: asyncio.Future) -> None:
        self.tasks.discard(future)
        endpoint = FAST_PATHS[path]
        status, body = _outcome(future, render, "fast path %s failed", endpoint)
        self._respond(cycle, status, body)
        metrics.record(endpoint, status, time.perf_counter() - started)

    def _respond(self, cycle: FastCycle, status: int, body: bytes) -> None:
        self._respond_with(cycle, _HEADS.get(self.server_state.default_headers, status), body)

    def _respond_with(self, cycle: FastCycle, head: bytes, body: bytes) -> None:
        """Write the response (`head`: its status line and headers up to the content type, `_HEADS`)."""
        cycle.response_complete = True
        if cycle.disconnected or self.transport.is_closing():
            return
        length = b"content-length: %d\r\n" % len(body)
        self.transport.write(b"".join((head, length, b"\r\n" if cycle.keep_alive else _CLOSE + b"\r\n", body)))
        if not cycle.keep_alive:
            self.transport.close()
        self.on_response_complete()

    # -- keep-alive: one timer per idle period, not one per request ----------------------------------------
    # uvicorn arms a timer after every response and cancels it on the next request; at tens of thousands of
    # requests a second that was 4% of a fast request. Here a timer runs only while the connection is idle.

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None

    def on_response_complete(self) -> None:
        """uvicorn's: count it, then start the next pipelined request, or else note when idleness began. While the
        client does not read its answers (the transport's buffer is full) nothing more is read: uvicorn's own
        responses wait for the buffer to drain before they complete, but a fast one is written at once, and a
        client that pipelined requests without reading grew the buffer without bound (a review)."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self.flow.write_paused:
            self.flow.pause_reading()
            self._until_drained = True
            return
        self._next_request()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._until_drained and not self.transport.is_closing():
            self._until_drained = False
            self._next_request()

    def _next_request(self) -> None:
        if self.flow.read_paused and self._deferred_400 is None:
            self.flow.resume_reading()
        if self.pipeline:
            self._idle_since = None
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        if self._deferred_400 is not None:  # every request before the unparsable one is answered
            self.send_400_response(self._deferred_400)
            return
        if self._half_closed:  # every request the client sent is answered, and it sends no more
            self.transport.close()
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._check_keep_alive)

    def _check_keep_alive(self) -> None:
        self.timeout_keep_alive_task = None
        if self._idle_since is None:  # busy: the next response arms the timer again
            return
        idle = self.loop.time() - self._idle_since
        if idle >= self.timeout_keep_alive:
            self.timeout_keep_alive_handler()
        else:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive - idle,
                                                                self._check_keep_alive)

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio.Protocol's is bool | None; uvicorn types None
        """The client shut its sending side after its requests (a half-close: `nc -N`, `shutdown(SHUT_WR)`): answer
        them, then close. Returning false (asyncio.Protocol's None, which uvicorn keeps) closed the connection at once,
        and a write the client had sent went unanswered though it was counted (a review)."""
        self._half_closed = True
        if not self._between_messages:  # a request cut short: it can never be answered
            return False
        answering = (self.cycle is not None and not self.cycle.response_complete) or bool(self.pipeline)
        return answering or self._deferred_400 is not None  # true: the transport stays open to write the answers

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
