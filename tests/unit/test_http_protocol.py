"""CounterHttpProtocol on a fake transport: the fast path, the hand-off to the ASGI app, pipelining, keep-alive.

`query_api.http_protocol` subclasses uvicorn's private `HttpToolsProtocol` and leans on its internals (listed in
UVICORN_METHODS and UVICORN_ATTRIBUTES). These tests drive the protocol as uvicorn's server does (uvicorn's own
`Config` and `ServerState`, `connection_made`, `data_received`, `connection_lost`) on a real event loop (asyncio, and
uvloop, which `python -m query_api` runs), with a transport that records what is written, a stand-in for
CounterService whose futures the test settles, and a tiny ASGI app that records what it was handed. A uvicorn upgrade
that renames or changes one of those internals fails here, not in production.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
from collections.abc import Awaitable, Callable, Coroutine
from http import HTTPStatus
from typing import Any

import httptools
import orjson
import pytest
from uvicorn.config import Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from control_plane import parse_namespaces
from producers import DeliveryError
from query_api import http_protocol, metrics
from query_api.http_protocol import MAX_FAST_BODY, CounterHttpProtocol, FastCycle
from query_api.plain_add import plain_add
from query_api.responses import error_response
from query_api.service import BrokerUnavailable, Count, NamespaceNotFound, NotCountedYet, Rejected, Written
from schemas import MutationOp, ValidationError

try:
    import uvloop  # what `python -m query_api` runs on (uvicorn[standard], not on Windows)
except ImportError:  # pragma: no cover
    uvloop = None

BUILD = plain_add(warn=False)  # query_api._plain_add, when built from the current source
REGISTRY = parse_namespaces({"namespaces": {
    "ev": {"counter_type": "EVENTUAL"},
    "acc": {"counter_type": "ACCURATE"},
    "be": {"counter_type": "BEST_EFFORT", "ttl": "1h"},
    "secured": {"counter_type": "ACCURATE", "api_keys": [{"key": "reader-key", "scopes": ["read"]},
                                                          {"key": "writer-key", "scopes": ["write"]}]},
}})
EV, ACC = REGISTRY["ev"], REGISTRY["acc"]
DEFAULT_HEADERS = [(b"date", b"Thu, 01 Jan 2026 00:00:00 GMT"), (b"server", b"uvicorn")]
WAIT_S = 5.0  # deadline for a condition that should hold within a few loop iterations

# -- uvicorn's private surface ----------------------------------------------------------------------------------

# Every member of uvicorn's HttpToolsProtocol that query_api/http_protocol.py overrides, calls or reads.
UVICORN_METHODS = {
    # overridden, and called by uvicorn itself or by httptools
    "on_message_begin": "parser callback; ours skips the ASGI scope, _begin_app_request calls uvicorn's",
    "on_headers_complete": "parser callback; ours decides fast path vs uvicorn's RequestResponseCycle",
    "on_body": "parser callback; called via super() for app requests",
    "on_message_complete": "parser callback; called via super() for app requests",
    "on_response_complete": "RequestResponseCycle's on_response: starts the next pipelined request, arms keep-alive",
    "_unset_keepalive_if_required": "called by data_received/connection_lost: ours marks the connection busy",
    "connection_lost": "extended to cancel the keep-alive timer",
    "resume_writing": "extended to read the next request once a client that did not read its answers drains them",
    "eof_received": "overridden to answer a half-closed client's requests before closing",
    "send_400_response": "called by data_received when the parser fails; ours waits for the earlier answers",
    "data_received": "overridden for a whole plain AddCount (no parser); otherwise uvicorn's, which must call "
                     "_unset_keepalive_if_required before feeding the parser",
    # used, not overridden
    "on_url": "parser callback filling self.url",
    "on_header": "parser callback filling self.headers and self.expect_100_continue",
    "_start_asgi_task": "called with (cycle, app) popped from self.pipeline",
    "timeout_keep_alive_handler": "closes an idle connection",
    "shutdown": "reads self.cycle.response_complete and clears self.cycle.keep_alive (FastCycle has both)",
}
UVICORN_ATTRIBUTES = {  # set by HttpToolsProtocol.__init__ / connection_made
    "loop", "parser", "app_state", "limit_concurrency", "server_state", "tasks", "transport", "flow", "pipeline",
    "timeout_keep_alive", "timeout_keep_alive_task", "cycle", "scope", "headers", "expect_100_continue",
}
# and: httptools_impl.STATUS_LINE, ServerState.default_headers/total_requests/tasks, FlowControl.read_paused,
# write_paused, pause_reading and resume_reading, httptools' HttpRequestParser.get_method/get_http_version/
# should_keep_alive.
RECHECK = ("re-check query_api/http_protocol.py against the installed uvicorn (httptools_impl.py): it subclasses "
           "uvicorn's private HttpToolsProtocol")


def test_uvicorn_private_members_still_exist() -> None:
    missing = [name for name in UVICORN_METHODS if not callable(getattr(HttpToolsProtocol, name, None))]

    async def connected() -> HttpToolsProtocol:
        protocol = HttpToolsProtocol(config=Config(app=RecordingApp(), log_config=None), server_state=ServerState(),
                                     app_state={})
        protocol.connection_made(FakeTransport())  # type: ignore[arg-type]
        return protocol
    protocol = asyncio.run(connected())
    missing += [name for name in sorted(UVICORN_ATTRIBUTES) if not hasattr(protocol, name)]
    state, flow = ServerState(), FlowControl(FakeTransport())  # type: ignore[arg-type]
    missing += [f"ServerState.{name}" for name in ("default_headers", "total_requests", "tasks")
                if not hasattr(state, name)]
    missing += [f"FlowControl.{name}" for name in ("read_paused", "write_paused", "pause_reading", "resume_reading")
                if not hasattr(flow, name)]
    missing += [f"HttpRequestParser.{name}" for name in ("get_method", "get_http_version", "should_keep_alive")
                if not hasattr(httptools.HttpRequestParser, name)]
    if not isinstance(getattr(httptools_impl, "STATUS_LINE", None), dict):
        missing.append("httptools_impl.STATUS_LINE")
    assert not missing, f"uvicorn no longer has {missing}: {RECHECK}"

    params = list(inspect.signature(HttpToolsProtocol._start_asgi_task).parameters)
    assert params == ["self", "cycle", "app"], f"_start_asgi_task{tuple(params)}: {RECHECK}"
    assert "send_400_response" in inspect.getsource(HttpToolsProtocol.data_received), (
        f"data_received no longer answers a parser error with send_400_response (ours defers it): {RECHECK}")
    assert "_unset_keepalive_if_required" in inspect.getsource(HttpToolsProtocol.data_received), (
        f"data_received no longer calls _unset_keepalive_if_required (our keep-alive timer relies on it): {RECHECK}")


def test_fast_cycle_has_every_cycle_attribute_uvicorn_reads() -> None:
    """While a fast request is in flight `self.cycle` is a FastCycle, not uvicorn's RequestResponseCycle: every
    `self.cycle.<attribute>` uvicorn's protocol touches must exist on it."""
    read = set(re.findall(r"self\.cycle\.(\w+)", inspect.getsource(HttpToolsProtocol)))
    assert read, f"uvicorn's protocol no longer reads self.cycle: {RECHECK}"
    lacking = read - set(FastCycle.__slots__) - {"body", "more_body"}  # on_body/on_message_complete: app requests only
    assert not lacking, f"uvicorn reads self.cycle.{sorted(lacking)}, which FastCycle lacks: {RECHECK}"


# -- fakes --------------------------------------------------------------------------------------------------------


class FakeTransport:
    """Records writes, close, pause/resume; a write after close is recorded apart (the tests expect none)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.writes_after_close: list[bytes] = []
        self.closed = False
        self.read_paused = False
        self.protocol: Any = None  # set when uvicorn hands the connection to another protocol (websocket upgrade)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data: bytes) -> None:
        (self.writes_after_close.append(bytes(data)) if self.closed else self.data.extend(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.read_paused = True

    def resume_reading(self) -> None:
        self.read_paused = False

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # some uvicorn versions set them in connection_made

    def take(self) -> bytes:
        out = bytes(self.data)
        self.data.clear()
        return out


class FakeService:
    """What fastpath.fast_call uses of CounterService. Every call is recorded at once and returns (or awaits) a
    future the test settles: `get` and `count_after` are coroutines (as in CounterService, so the protocol wraps
    them in a task), `add_best_effort` and write_durable's acknowledgement are plain futures."""

    def __init__(self) -> None:
        self.registry = REGISTRY
        self.calls: list[tuple[Any, ...]] = []
        self.then_count: list[bool] = []
        self.futures: list[asyncio.Future[Any]] = []
        self.write_raises: BaseException | None = None
        self.plain: dict[bytes, bytes] = {}  # write_plain's answers by body; any other body: None (the Python path)
        self.plain_raises: dict[bytes, Exception] = {}  # bodies write_plain refuses (as admission does)

    def write_plain(self, body: bytes) -> tuple[bytes, asyncio.Future[None], int] | None:
        """As CounterService.write_plain: the bodies of `plain` share one future per loop pass, as group commit's
        records do; each write's event time is PLAIN_EVENT_TIME."""
        if body in self.plain_raises:
            self.calls.append(("write_plain", body))
            raise self.plain_raises[body]
        answer = self.plain.get(body)
        if answer is None:
            return None
        self.calls.append(("write_plain", body))
        shared = self.futures[-1] if self.futures and self._pass_open else self._future()
        if not self._pass_open:
            self._pass_open = True
            asyncio.get_running_loop().call_soon(setattr, self, "_pass_open", False)
        return answer, shared, PLAIN_EVENT_TIME

    def write_plain_request(self, data: bytes) -> tuple[bytes, asyncio.Future[None], int] | None:
        """As CounterService.write_plain_request: the body of a whole plain request (the real C reader) goes to
        `write_plain`."""
        body = BUILD.plain_request(data) if BUILD is not None else None
        return None if body is None else self.write_plain(body)

    _pass_open = False

    def _future(self) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return future

    @staticmethod
    async def _wait(future: asyncio.Future[Any]) -> Any:
        return await future

    def get(self, ns: Any, counter: str) -> Coroutine[Any, Any, Count]:
        self.calls.append(("get", ns.name, counter))
        return self._wait(self._future())

    def add_best_effort(self, ns: Any, counter: str, delta: int) -> Awaitable[int]:
        self.calls.append(("add_best_effort", ns.name, counter, delta))
        return self._future()

    def write_durable(self, ns: Any, counter: str, delta: int, op: MutationOp, token: str | None,
                      generation_time: Any, item_key: str = "", *,
                      then_count: bool = False) -> tuple[Written, asyncio.Future[None]]:
        self.calls.append(("write_durable", ns.name, counter, delta, op, token, generation_time))
        self.then_count.append(then_count)
        if self.write_raises is not None:
            raise self.write_raises
        return Written(ns, counter, token or "generated-id", 1_700_000_000_000_000), self._future()

    def late_checked(self, acknowledged: asyncio.Future[None], ns: Any, event_time: int,
                     token: str) -> asyncio.Future[None]:
        """As CounterService.late_checked for a write its accept_limit leaves time for: the acknowledgement itself
        (tests/integration/test_retry_window.py has one it does not)."""
        return acknowledged

    def count_after(self, written: Written, acknowledged: asyncio.Future[None]) -> Coroutine[Any, Any, Count]:
        self.calls.append(("count_after", written.ns.name, written.counter))
        later = self._future()

        async def run() -> Count:
            await acknowledged
            return await later
        return run()

    def settle(self, result: Any = None, *, exception: BaseException | None = None, index: int = -1) -> None:
        future = self.futures[index]
        future.set_exception(exception) if exception is not None else future.set_result(result)


class RecordingApp:
    """An ASGI app that reads the whole body (not for /healthz: such a route never calls receive()), records the
    request and answers `app <METHOD> <path> <body length>` (once `release` is set, when the test gives one)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.release: asyncio.Event | None = None  # when set by the test: answer only once it is set

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        assert scope["type"] == "http"
        body, more = b"", scope["path"] != "/healthz"
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message["body"]
            more = message.get("more_body", False)
        self.requests.append({"method": scope["method"], "path": scope["path"], "headers": scope["headers"],
                              "http_version": scope["http_version"], "body": body})
        if self.release is not None:
            await self.release.wait()
        text = b"app %s %s %d" % (scope["method"].encode(), scope["path"].encode(), len(body))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(text))]})
        await send({"type": "http.response.body", "body": text})


class JsonApp:
    """Answers every request with a fixed status and JSON body, as a FastAPI JSONResponse would."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(self.body))]})
        await send({"type": "http.response.body", "body": self.body})


class Connection:
    """One CounterHttpProtocol as uvicorn's server builds it (inside the running loop), on a FakeTransport."""

    def __init__(self, service: FakeService | None, app: Any = None, server_state: ServerState | None = None,
                 **config: Any) -> None:
        self.service = service
        self.app = app if app is not None else RecordingApp()
        self.config = Config(app=self.app, http=CounterHttpProtocol, log_config=None, **config)
        self.config.load()
        self.server_state = server_state or ServerState()  # another connection's: both of one server
        self.server_state.default_headers = list(DEFAULT_HEADERS)
        self.protocol = CounterHttpProtocol(config=self.config, server_state=self.server_state,
                                            app_state={} if service is None else {"service": service})
        self.transport = FakeTransport()
        self.protocol.connection_made(self.transport)  # type: ignore[arg-type]

    def send(self, data: bytes) -> None:
        self.protocol.data_received(data)

    def lose(self, exc: Exception | None = None) -> None:
        """The peer went away: as a real transport does, the transport is closing when connection_lost runs."""
        self.transport.closed = True
        self.protocol.connection_lost(exc)


def post(path: str, body: Any, *headers: str, version: str = "1.1") -> bytes:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    head = [f"POST {path} HTTP/{version}", "host: test", "content-type: application/json",
            f"content-length: {len(raw)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + raw


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: test\r\n\r\n".encode()


def status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())


def fast_response(status: int, body: bytes, *, keep_alive: bool = True) -> bytes:
    """What the fast path must write: uvicorn's default headers, then content type and length."""
    return (status_line(status) + b"date: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
            + b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
            + (b"" if keep_alive else b"connection: close\r\n") + b"\r\n" + body)


def app_response(method: str, path: str, body_length: int, *, keep_alive: bool = True) -> bytes:
    text = b"app %s %s %d" % (method.encode(), path.encode(), body_length)
    return (status_line(200) + b"date: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
            + b"content-type: text/plain\r\ncontent-length: %d\r\n" % len(text)
            + (b"" if keep_alive else b"connection: close\r\n") + b"\r\n" + text)


def count_body(ns: str, counter: str, count: int, counter_type: str) -> bytes:
    return (b'{"namespace":"%s","counter_name":"%s","count":%d,"counter_type":"%s","as_of":null}'
            % (ns.encode(), counter.encode(), count, counter_type.encode()))


def add_body(ns: str, counter: str, counter_type: str, durable: bool, token: str | None) -> bytes:
    return orjson.dumps({"namespace": ns, "counter_name": counter, "counter_type": counter_type,
                         "durable": durable, "idempotency_token": token})


LOOP_ERRORS: list[dict[str, Any]] = []  # what the loop's exception handler saw (callbacks and tasks that raised)


def _no_loop_errors(what: str) -> None:
    if LOOP_ERRORS:
        context = LOOP_ERRORS[0]
        raise AssertionError(f"while waiting for {what}, the event loop reported: {context.get('message')}: "
                             f"{context.get('exception')!r}") from context.get("exception")


async def until(condition: Callable[[], Any], what: str) -> None:
    """Run the loop until `condition()` holds; fail after WAIT_S, or at once if a callback or task raised."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    spins = 0
    while not condition():
        _no_loop_errors(what)
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {WAIT_S}s waiting for {what}")
        spins += 1
        await asyncio.sleep(0 if spins < 100 else 0.001)
    _no_loop_errors(what)


async def spin(iterations: int = 20) -> None:
    """Let every ready callback and task run a few times over (a response that should not come yet would)."""
    for _ in range(iterations):
        await asyncio.sleep(0)
    _no_loop_errors("the loop to settle")


# -- fixtures ---------------------------------------------------------------------------------------------------


@pytest.fixture(params=["asyncio"] + (["uvloop"] if uvloop is not None else []))
def run(request: pytest.FixtureRequest) -> Callable[[Callable[[], Coroutine[Any, Any, None]]], None]:
    """run(scenario): the scenario on a fresh loop of that kind; fails if the loop saw an unhandled exception."""
    factory = asyncio.new_event_loop if request.param == "asyncio" else uvloop.new_event_loop

    def runner(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
        LOOP_ERRORS.clear()
        with asyncio.Runner(loop_factory=factory) as r:
            r.get_loop().set_exception_handler(lambda _loop, context: LOOP_ERRORS.append(context))
            r.run(scenario())
        assert not LOOP_ERRORS, f"unhandled exceptions on the loop: {LOOP_ERRORS}"
    return runner


@pytest.fixture(autouse=True)
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, float]]:
    """metrics.record's calls (endpoint, status, seconds), instead of the process-wide tallies."""
    calls: list[tuple[str, int, float]] = []
    monkeypatch.setattr(metrics, "record", lambda endpoint, status, seconds: calls.append((endpoint, status, seconds)))
    monkeypatch.setattr(metrics, "record_many", lambda endpoint, status, durations: calls.extend(
        (endpoint, status, seconds) for seconds in durations))
    return calls


# -- the fast path ------------------------------------------------------------------------------------------------


def test_get_count_is_answered_once_the_service_settles(run, recorded) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}))
        assert service.calls == [("get", "ev", "c")]
        assert len(c.server_state.tasks) == 1, "uvicorn's shutdown waits on server_state.tasks"
        await spin()
        assert c.transport.data == b"", "answered before the service settled"
        assert recorded == []
        service.settle(Count(EV, "c", 7, None))
        await until(lambda: c.transport.data, "the response")
        assert c.transport.take() == (
            b"HTTP/1.1 200 OK\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
            b"content-type: application/json\r\ncontent-length: 86\r\n\r\n"
            b'{"namespace":"ev","counter_name":"c","count":7,"counter_type":"EVENTUAL","as_of":null}')
        assert c.app.requests == []
        assert not c.transport.closed
        assert c.server_state.tasks == set()
        assert c.server_state.total_requests == 1
        assert [(endpoint, status) for endpoint, status, _ in recorded] == [("/v1/GetCount", 200)]
        assert recorded[0][2] >= 0
    run(scenario)


def test_best_effort_add_is_answered_from_the_future(run, recorded) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/AddCount", {"namespace": "be", "counter_name": "c", "delta": -3}))
        assert service.calls == [("add_best_effort", "be", "c", -3)]
        await spin()
        assert c.transport.data == b""
        service.settle(41)
        await until(lambda: c.transport.data, "the response")
        assert c.transport.take() == fast_response(200, add_body("be", "c", "BEST_EFFORT", False, None))
        assert c.app.requests == []
        assert [(e, s) for e, s, _ in recorded] == [("/v1/AddCount", 200)]
    run(scenario)


@pytest.mark.parametrize("ns", ["ev", "acc"])
@pytest.mark.parametrize("token", [None, {"token": "t-1"}, {"token": "t-2", "generation_time": "2026-01-01T00:00:00Z"}])
def test_durable_add_is_answered_once_acknowledged(run, recorded, ns, token) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        body = {"namespace": ns, "counter_name": "c", "delta": 2}
        if token is not None:
            body["idempotency_token"] = token
        c.send(post("/v1/AddCount", body))
        t = token or {}
        assert service.calls == [("write_durable", ns, "c", 2, MutationOp.ADD, t.get("token"),
                                  t.get("generation_time"))]
        assert service.then_count == [False]  # nobody waits for its count
        await spin()
        assert c.transport.data == b"", "answered before the broker acknowledged"
        service.settle(None)
        await until(lambda: c.transport.data, "the response")
        counter_type = REGISTRY[ns].counter_type.value
        assert c.transport.take() == fast_response(200, add_body(ns, "c", counter_type, True,
                                                                 t.get("token", "generated-id")))
        assert c.app.requests == []
        assert [(e, s) for e, s, _ in recorded] == [("/v1/AddCount", 200)]
    run(scenario)


def test_add_and_get_waits_for_the_acknowledgement_and_the_count(run, recorded) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/AddAndGetCount", {"namespace": "acc", "counter_name": "c", "delta": 5}))
        assert [call[0] for call in service.calls] == ["write_durable", "count_after"]
        assert service.then_count == [True]  # the service marks the record read-your-write if it must
        service.settle(None, index=0)  # acknowledged, not yet counted
        await spin()
        assert c.transport.data == b""
        service.settle(Count(ACC, "c", 12, None), index=1)
        await until(lambda: c.transport.data, "the response")
        assert c.transport.take() == fast_response(200, count_body("acc", "c", 12, "ACCURATE"))
        assert [(e, s) for e, s, _ in recorded] == [("/v1/AddAndGetCount", 200)]
        assert c.server_state.tasks == set()
    run(scenario)


# -- plain AddCounts (CounterService.write_plain: one future per group-commit record) -------------------------------


PLAIN_EVENT_TIME = 1_800_000_000_123_456


def plain_service(*counters: str) -> tuple[FakeService, dict[str, bytes]]:
    """A FakeService taking the plain AddCount of each counter in `ev`: its body and its answer."""
    service = FakeService()
    bodies = {counter: orjson.dumps({"namespace": "ev", "counter_name": counter, "delta": 1}) for counter in counters}
    service.plain = {body: add_body("ev", counter, "EVENTUAL", True, f"token-{counter}")
                     for counter, body in bodies.items()}
    return service, bodies


def test_plain_adds_of_one_record_are_answered_together_once_acknowledged(run, recorded) -> None:
    async def scenario() -> None:
        service, bodies = plain_service("a", "b", "c")
        server = ServerState()
        connections = [Connection(service, server_state=server) for _ in bodies]
        for c, body in zip(connections, bodies.values(), strict=True):
            c.send(post("/v1/AddCount", body))
        assert [call[0] for call in service.calls] == ["write_plain"] * 3
        assert len(service.futures) == 1, "the fake shares one future per pass, as group commit does"
        assert server.tasks == {service.futures[0]}, "uvicorn's shutdown waits on it"
        await spin()
        assert all(c.transport.data == b"" for c in connections), "answered before the broker acknowledged"
        service.settle(None)
        await until(lambda: all(c.transport.data for c in connections), "the responses")
        for c, body in zip(connections, bodies.values(), strict=True):
            assert c.transport.take() == fast_response(200, service.plain[body])
            assert not c.transport.closed and c.app.requests == []
        assert [(e, s) for e, s, _ in recorded] == [("/v1/AddCount", 200)] * 3
        assert all(seconds >= 0 for _, _, seconds in recorded)
        assert server.tasks == set()
        assert server.total_requests == 3
        assert http_protocol._ANSWERS == {}, "a record's waiters are forgotten once answered"
    run(scenario)


@pytest.mark.parametrize(("exc", "status"), [(DeliveryError("not acknowledged; retry with the same token"), 503),
                                             (RuntimeError("boom"), 500)])
def test_a_failed_record_answers_each_of_its_plain_adds_with_the_error(run, recorded, caplog, exc, status) -> None:
    async def scenario() -> None:
        service, bodies = plain_service("a", "b")
        connections = [Connection(service) for _ in bodies]
        for c, body in zip(connections, bodies.values(), strict=True):
            c.send(post("/v1/AddCount", body))
        service.settle(exception=exc)
        await until(lambda: all(c.transport.data for c in connections), "the error responses")
        for c, counter in zip(connections, bodies, strict=True):
            if status == 503:  # with the token and event time this process drew: a retry with them counts once
                detail = {"detail": str(exc), "idempotency_token": {"token": f"token-{counter}",
                                                                    "generation_time": PLAIN_EVENT_TIME}}
                assert c.transport.take() == fast_response(status, orjson.dumps(detail))
            else:
                assert c.transport.take() == fast_response(status, b'{"detail":"Internal Server Error"}')
        assert [(e, s) for e, s, _ in recorded] == [("/v1/AddCount", status)] * 2
    run(scenario)
    if status == 500:
        assert "plain AddCount failed" in caplog.text


def test_a_plain_add_whose_client_left_or_asked_to_close(run, recorded) -> None:
    """A waiter that disconnected gets nothing written, one that sent `connection: close` is answered and closed,
    and the others are answered as usual."""
    async def scenario() -> None:
        service, bodies = plain_service("gone", "closing", "staying")
        gone, closing, staying = (Connection(service) for _ in bodies)
        gone.send(post("/v1/AddCount", bodies["gone"]))
        closing.send(post("/v1/AddCount", bodies["closing"], "connection: close"))
        staying.send(post("/v1/AddCount", bodies["staying"]))
        gone.lose(ConnectionResetError())
        service.settle(None)
        await until(lambda: closing.transport.data and staying.transport.data, "the responses")
        await spin()
        assert gone.transport.data == b"" and gone.transport.writes_after_close == []
        assert closing.transport.take() == fast_response(200, service.plain[bodies["closing"]], keep_alive=False)
        assert closing.transport.closed
        assert staying.transport.take() == fast_response(200, service.plain[bodies["staying"]])
        assert not staying.transport.closed
    run(scenario)


def test_one_connection_failing_to_write_leaves_the_others_of_its_record_answered(run, caplog) -> None:
    async def scenario() -> None:
        service, bodies = plain_service("broken", "fine")
        broken, fine = (Connection(service) for _ in bodies)

        def refuse(data: bytes) -> None:
            raise OSError("the socket refused the write")
        broken.transport.write = refuse  # type: ignore[method-assign]
        broken.send(post("/v1/AddCount", bodies["broken"]))
        fine.send(post("/v1/AddCount", bodies["fine"]))
        service.settle(None)
        await until(lambda: fine.transport.data, "the other connection's response")
        assert fine.transport.take() == fast_response(200, service.plain[bodies["fine"]])
    run(scenario)
    assert "answering a plain AddCount failed" in caplog.text


SHORTCUT = BUILD is not None  # the C build reads whole plain requests (else: the parser)
if not SHORTCUT:
    assert os.environ.get("COUNTER_TEST_PURE_PYTHON") == "1", "no C build: run `python -m query_api.plain_add`"


@pytest.fixture
def messages_begun(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many requests the HTTP parser began (CounterHttpProtocol.on_message_begin calls)."""
    begun = [0]
    original = CounterHttpProtocol.on_message_begin

    def counting(self: CounterHttpProtocol) -> None:
        begun[0] += 1
        original(self)
    monkeypatch.setattr(CounterHttpProtocol, "on_message_begin", counting)
    return begun


@pytest.mark.parametrize("chunks", [1, 2])
def test_a_plain_addcount_arriving_whole_skips_the_parser(run, recorded, messages_begun, chunks) -> None:
    """A chunk that is exactly one plain AddCount request goes straight to write_plain; the same request in two
    chunks goes through the parser. Both are answered alike, and the connection serves the next request."""
    async def scenario() -> None:
        service, bodies = plain_service("a", "b")
        c = Connection(service)
        for counter in ("a", "b"):
            request = post("/v1/AddCount", bodies[counter])
            for part in (request,) if chunks == 1 else (request[:30], request[30:]):
                c.send(part)
            assert service.calls[-1] == ("write_plain", bodies[counter])
            service.settle(None)
            await until(lambda: c.transport.data, "the response")
            assert c.transport.take() == fast_response(200, service.plain[bodies[counter]])
        assert messages_begun[0] == (0 if SHORTCUT and chunks == 1 else 2)
        assert [(e, s) for e, s, _ in recorded] == [("/v1/AddCount", 200)] * 2
        assert c.server_state.total_requests == 2 and c.server_state.tasks == set()
        assert not c.transport.closed
    run(scenario)


def test_a_plain_addcount_behind_a_pending_one_waits_its_turn(run) -> None:
    """While a fast request is in flight the next one is not taken whole: the parser queues it for the app."""
    async def scenario() -> None:
        service, bodies = plain_service("first", "second")
        c = Connection(service)
        c.send(post("/v1/AddCount", bodies["first"]))
        c.send(post("/v1/AddCount", bodies["second"]))
        assert service.calls == [("write_plain", bodies["first"])]
        await spin()
        assert c.transport.data == b"" and c.app.requests == []
        service.settle(None)
        expected = fast_response(200, service.plain[bodies["first"]]) + app_response(
            "POST", "/v1/AddCount", len(bodies["second"]))
        await until(lambda: len(c.transport.data) >= len(expected), "both responses")
        assert c.transport.take() == expected
    run(scenario)


def test_a_shutdown_during_the_next_addcount_taken_whole_closes_after_its_response(run) -> None:
    """The request state of a keep-alive connection is reused from one AddCount taken whole to the next: a graceful
    shutdown while the second is pending still answers it with `connection: close`, then closes."""
    async def scenario() -> None:
        service, bodies = plain_service("a", "b")
        c = Connection(service)
        c.send(post("/v1/AddCount", bodies["a"]))
        service.settle(None)
        await until(lambda: c.transport.data, "the first response")
        assert c.transport.take() == fast_response(200, service.plain[bodies["a"]])
        c.send(post("/v1/AddCount", bodies["b"]))
        c.protocol.shutdown()
        assert not c.transport.closed
        service.settle(None)
        await until(lambda: c.transport.closed, "the connection to close")
        assert c.transport.take() == fast_response(200, service.plain[bodies["b"]], keep_alive=False)
        assert c.transport.writes_after_close == []
    run(scenario)


def test_a_write_refused_when_taken_whole_is_answered_as_the_parser_path_answers_it(run, recorded) -> None:
    async def scenario() -> None:
        service, _ = plain_service()
        body = orjson.dumps({"namespace": "ev", "counter_name": "c", "delta": 1,
                             "idempotency_token": {"token": "t", "generation_time": "2024-01-01T00:00:00Z"}})
        refusal = Rejected("idempotency_token.generation_time", "outside the accept window")
        service.plain_raises[body] = refusal
        c = Connection(service)
        c.send(post("/v1/AddCount", body))
        await until(lambda: c.transport.data, "the error response")
        assert c.transport.take() == fast_response(422, orjson.dumps(error_response(refusal)[1]))
        # refused once when taken whole (nothing sent), then again on the parser's way, which answers it
        assert service.calls == [("write_plain", body)] * (2 if SHORTCUT else 1)
        assert [(e, s) for e, s, _ in recorded] == [("/v1/AddCount", 422)]
    run(scenario)


def test_an_unexpected_failure_when_taken_whole_gives_500_once(run, recorded, caplog) -> None:
    """Not retried on the parser's way (something may have been sent): answered 500, as that way answers it."""
    async def scenario() -> None:
        service, bodies = plain_service("c")
        service.plain_raises[bodies["c"]] = RuntimeError("boom")
        c = Connection(service)
        c.send(post("/v1/AddCount", bodies["c"]))
        await until(lambda: c.transport.data, "the error response")
        assert c.transport.take() == fast_response(500, b'{"detail":"Internal Server Error"}')
        assert service.calls == [("write_plain", bodies["c"])]
        assert [(e, s) for e, s, _ in recorded] == [("/v1/AddCount", 500)]
        assert c.server_state.tasks == set() and not c.transport.closed
    run(scenario)
    assert "fast path /v1/AddCount failed" in caplog.text


def test_a_body_write_plain_declines_takes_the_python_fast_path(run) -> None:
    async def scenario() -> None:
        service, _ = plain_service("a")
        c = Connection(service)
        c.send(post("/v1/AddCount", {"namespace": "ev", "counter_name": "other", "delta": 1}))
        assert [call[0] for call in service.calls] == ["write_durable"]
        Connection(service).send(post("/v1/AddAndGetCount", {"namespace": "ev", "counter_name": "a", "delta": 1}))
        assert [call[0] for call in service.calls] == ["write_durable", "write_durable", "count_after"]
    run(scenario)


@pytest.mark.parametrize(("request_line", "headers", "keep_alive"), [
    ("1.1", (), True),
    ("1.1", ("connection: close",), False),
    ("1.1", ("Connection: Close",), False),
    ("1.0", (), False),
    ("1.0", ("connection: keep-alive",), False),  # uvicorn does not keep HTTP/1.0 connections alive either
])
def test_connection_close(run, request_line, headers, keep_alive) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}, *headers, version=request_line))
        service.settle(Count(EV, "c", 1, None))
        await until(lambda: c.transport.data, "the response")
        assert c.transport.take() == fast_response(200, count_body("ev", "c", 1, "EVENTUAL"), keep_alive=keep_alive)
        assert c.transport.closed is not keep_alive
        assert c.transport.writes_after_close == []
    run(scenario)


@pytest.mark.parametrize("keep_alive", [True, False])
def test_fast_response_bytes_equal_uvicorns_own(run, keep_alive) -> None:
    """The same status, JSON body and connection header written by uvicorn's RequestResponseCycle and by the fast
    path are byte for byte the same response."""
    body = count_body("ev", "c", 3, "EVENTUAL")
    headers = () if keep_alive else ("connection: close",)

    async def scenario() -> None:
        via_app = Connection(None, app=JsonApp(200, body))
        via_app.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}, *headers))
        await until(lambda: via_app.transport.data, "the app's response")
        service = FakeService()
        fast = Connection(service)
        fast.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}, *headers))
        service.settle(Count(EV, "c", 3, None))
        await until(lambda: fast.transport.data, "the fast response")
        assert fast.transport.take() == via_app.transport.take()
        assert fast.transport.closed == via_app.transport.closed == (not keep_alive)
    run(scenario)


def test_response_head_follows_uvicorns_default_headers(run) -> None:
    """uvicorn replaces server_state.default_headers every second (the date): the fast path uses the current list."""
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}))
        service.settle(Count(EV, "c", 1, None))
        await until(lambda: c.transport.data, "the first response")
        assert b"date: Thu, 01 Jan 2026 00:00:00 GMT\r\n" in c.transport.take()
        c.server_state.default_headers = [(b"date", b"Fri, 02 Jan 2026 00:00:00 GMT"), (b"server", b"uvicorn"),
                                          (b"x-extra", b"1")]
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}))
        service.settle(Count(EV, "c", 1, None))
        await until(lambda: c.transport.data, "the second response")
        assert c.transport.take().startswith(b"HTTP/1.1 200 OK\r\ndate: Fri, 02 Jan 2026 00:00:00 GMT\r\n"
                                             b"server: uvicorn\r\nx-extra: 1\r\ncontent-type: application/json\r\n")
    run(scenario)


# -- errors -------------------------------------------------------------------------------------------------------

SERVICE_FAILURES = [
    (NamespaceNotFound("unknown namespace 'ev'"), 404),
    (BrokerUnavailable("broker down"), 503),
    (DeliveryError("not acknowledged"), 503),
    (NotCountedYet("not counted within 5s"), 504),
    (Rejected("idempotency_token.generation_time", "too old"), 422),
]


@pytest.mark.parametrize(("exc", "status"), SERVICE_FAILURES, ids=[type(e).__name__ for e, _ in SERVICE_FAILURES])
def test_failed_future_maps_to_the_error_response(run, recorded, exc, status) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}))
        service.settle(exception=exc)
        await until(lambda: c.transport.data, "the error response")
        mapped_status, detail = error_response(exc)  # the mapping the FastAPI handlers use too
        assert mapped_status == status
        assert c.transport.take() == fast_response(status, orjson.dumps(detail))
        assert not c.transport.closed
        assert [(e, s) for e, s, _ in recorded] == [("/v1/GetCount", status)]
    run(scenario)


def test_error_body_is_compact_json(run) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}))
        service.settle(exception=NamespaceNotFound("unknown namespace 'ev'"))
        await until(lambda: c.transport.data, "the error response")
        assert c.transport.take() == fast_response(404, b'{"detail":"unknown namespace \'ev\'"}')
    run(scenario)


def test_exception_raised_synchronously_by_the_service_maps_the_same_way(run, recorded) -> None:
    async def scenario() -> None:
        service = FakeService()
        exc = Rejected("idempotency_token.generation_time", "outside the accept window")
        service.write_raises = exc
        c = Connection(service)
        c.send(post("/v1/AddCount", {"namespace": "ev", "counter_name": "c", "delta": 1,
                                     "idempotency_token": {"token": "t", "generation_time": "2024-10-05T14:48:00Z"}}))
        await until(lambda: c.transport.data, "the error response")
        status, detail = error_response(exc)
        assert status == 422
        assert c.transport.take() == fast_response(422, orjson.dumps(detail))
        assert c.app.requests == []
        assert [(e, s) for e, s, _ in recorded] == [("/v1/AddCount", 422)]
    run(scenario)


@pytest.mark.parametrize("how", ["future", "synchronous", "cancelled"])
def test_unexpected_exception_gives_500(run, recorded, caplog, how) -> None:
    async def scenario() -> None:
        service = FakeService()
        if how == "synchronous":
            service.write_raises = RuntimeError("boom")
        c = Connection(service)
        c.send(post("/v1/AddCount", {"namespace": "ev", "counter_name": "c", "delta": 1}))
        if how == "future":
            service.settle(exception=RuntimeError("boom"))
        elif how == "cancelled":
            service.futures[-1].cancel()
        await until(lambda: c.transport.data, "the 500")
        assert c.transport.take() == fast_response(500, b'{"detail":"Internal Server Error"}')
        assert [(e, s) for e, s, _ in recorded] == [("/v1/AddCount", 500)]
        assert c.server_state.tasks == set()
    with caplog.at_level("ERROR", logger=http_protocol.log.name):
        run(scenario)
    assert "fast path /v1/AddCount failed" in caplog.text


# -- hand-off to the ASGI app -------------------------------------------------------------------------------------

TO_APP = {
    "other path": post("/v1/ClearCount", {"namespace": "ev", "counter_name": "c"}),
    "query string": post("/v1/GetCount?x=1", {"namespace": "ev", "counter_name": "c"}),
    "API-key namespace": post("/v1/GetCount", {"namespace": "secured", "counter_name": "c"}, "x-api-key: reader-key"),
    "API-key namespace, add": post("/v1/AddCount", {"namespace": "secured", "counter_name": "c", "delta": 1},
                                   "authorization: Bearer writer-key"),
    "unknown namespace": post("/v1/GetCount", {"namespace": "nope", "counter_name": "c"}),
    "invalid JSON": post("/v1/GetCount", b'{"namespace": "ev", "counter_name": '),
    "not an object": post("/v1/GetCount", b'["ev", "c"]'),
    "empty body": post("/v1/GetCount", b""),
    "unknown field": post("/v1/GetCount", {"namespace": "ev", "counter_name": "c", "extra": 1}),
    "unknown field, add": post("/v1/AddCount", {"namespace": "ev", "counter_name": "c", "delta": 1, "x": 2}),
    "invalid counter name": post("/v1/GetCount", {"namespace": "ev", "counter_name": ""}),
    "delta not an int": post("/v1/AddCount", {"namespace": "ev", "counter_name": "c", "delta": 1.5}),
    "delta beyond int64": post("/v1/AddCount", b'{"namespace":"ev","counter_name":"c","delta":9223372036854775808}'),
    "token not a string": post("/v1/AddCount", {"namespace": "ev", "counter_name": "c", "delta": 1,
                                                "idempotency_token": {"token": 5}}),
    "best effort AddAndGetCount": post("/v1/AddAndGetCount", {"namespace": "be", "counter_name": "c", "delta": 1}),
    "expect 100-continue": post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}, "expect: 100-continue"),
    "GET": get("/v1/GetCount"),
    "GET with a JSON body": post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}).replace(b"POST", b"GET"),
    "PUT": post("/v1/AddCount", {"namespace": "ev", "counter_name": "c", "delta": 1}).replace(b"POST", b"PUT"),
    "GET healthz": get("/healthz"),
    "body over MAX_FAST_BODY": post("/v1/GetCount", b'{"namespace":"ev","counter_name":"c"}'
                                    + b" " * MAX_FAST_BODY),
}


def _request_body(request: bytes) -> bytes:
    return request.partition(b"\r\n\r\n")[2]


# every request whole and in chunks; byte by byte only for the small ones (the large body adds nothing there)
TO_APP_SPLITS = [(case, chunk) for case in TO_APP for chunk in (None, 1, 7, 4096)
                 if not (chunk == 1 and len(TO_APP[case]) > 1000)]


@pytest.mark.parametrize(("case", "chunk"), TO_APP_SPLITS,
                         ids=[f"{case}-{'whole' if n is None else f'chunks of {n}'}" for case, n in TO_APP_SPLITS])
def test_goes_to_the_app_with_the_body_intact(run, recorded, case, chunk) -> None:
    request = TO_APP[case]

    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        for i in range(0, len(request), chunk or len(request)):
            c.send(request[i:i + (chunk or len(request))])
            await asyncio.sleep(0)
        await until(lambda: c.transport.data.endswith(b"app %s %s %d" % tuple(_app_key(request))),
                    "the app's response")
        method, path, length = _app_key(request)
        assert service.calls == []
        assert len(c.app.requests) == 1
        seen = c.app.requests[0]
        assert (seen["method"], seen["path"], seen["body"]) == (method.decode(), path.decode(), _request_body(request))
        sent_headers = [tuple(line.split(b": ", 1)) for line in request.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]]
        assert seen["headers"] == [(name.lower(), value) for name, value in sent_headers]
        response = c.transport.take()
        if b"expect: 100-continue" in request:
            assert response.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
            response = response.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")
        assert response == app_response(method.decode(), path.decode(), length)
        assert recorded == [], "the app's requests are counted by the app's middleware, not by the protocol"
    run(scenario)


def _app_key(request: bytes) -> tuple[bytes, bytes, int]:
    method, target = request.split(b" ", 2)[:2]
    return method, target.partition(b"?")[0], len(_request_body(request))


def test_service_raising_validation_error_hands_the_request_to_the_app(run) -> None:
    """write_durable refusing the mutation with a ValidationError (nothing sent): the route names the field."""
    async def scenario() -> None:
        service = FakeService()
        service.write_raises = ValidationError("idempotency_token.generation_time", "not a time")
        c = Connection(service)
        request = post("/v1/AddCount", {"namespace": "ev", "counter_name": "c", "delta": 1,
                                        "idempotency_token": {"token": "t", "generation_time": "yesterday"}})
        c.send(request)
        await until(lambda: c.transport.data, "the app's response")
        assert c.app.requests[0]["body"] == _request_body(request)
        assert c.transport.take() == app_response("POST", "/v1/AddCount", len(_request_body(request)))
    run(scenario)


@pytest.mark.parametrize(("size", "fast"), [(MAX_FAST_BODY, True), (MAX_FAST_BODY + 1, False)])
@pytest.mark.parametrize("chunk", [None, 1000])
def test_max_fast_body_boundary(run, size, fast, chunk) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        body = b'{"namespace":"ev","counter_name":"c"}'
        body += b" " * (size - len(body))
        request = post("/v1/GetCount", body)
        step = chunk or len(request)
        for i in range(0, len(request), step):
            c.send(request[i:i + step])
        if fast:
            assert service.calls == [("get", "ev", "c")]
            service.settle(Count(EV, "c", 1, None))
            await until(lambda: c.transport.data, "the fast response")
            assert c.app.requests == []
        else:
            await until(lambda: c.transport.data, "the app's response")
            assert service.calls == []
            assert c.app.requests[0]["body"] == body
    run(scenario)


def test_chunked_request_body_on_the_fast_path(run) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        pieces = [b'{"namespace": ', b'"ev", "counter_name": ', b'"c"}']
        c.send(b"POST /v1/GetCount HTTP/1.1\r\nhost: test\r\ntransfer-encoding: chunked\r\n\r\n")
        for piece in pieces:
            c.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            await asyncio.sleep(0)
        assert service.calls == []
        c.send(b"0\r\n\r\n")
        assert service.calls == [("get", "ev", "c")]
        service.settle(Count(EV, "c", 2, None))
        await until(lambda: c.transport.data, "the response")
        assert c.transport.take() == fast_response(200, count_body("ev", "c", 2, "EVENTUAL"))
    run(scenario)


def test_without_a_service_everything_goes_to_the_app(run) -> None:
    """No lifespan state (e.g. the app's lifespan did not run): the fast path steps aside."""
    async def scenario() -> None:
        c = Connection(None)
        request = post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"})
        c.send(request)
        await until(lambda: c.transport.data, "the app's response")
        assert c.transport.take() == app_response("POST", "/v1/GetCount", len(_request_body(request)))
    run(scenario)


def test_limit_concurrency_disables_the_fast_path(run) -> None:
    """With --limit-concurrency uvicorn must count every request: the fast path steps aside."""
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service, limit_concurrency=100)
        request = post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"})
        c.send(request)
        await until(lambda: c.transport.data, "the app's response")
        assert service.calls == []
        assert c.transport.take() == app_response("POST", "/v1/GetCount", len(_request_body(request)))
    run(scenario)


@pytest.mark.parametrize("path", ["/v1/GetCount", "/v1/BatchGetCount"])
@pytest.mark.parametrize("upgrade", [
    ["connection: Upgrade, HTTP2-Settings", "Upgrade: H2C ", "http2-settings: AAMAAABkAAQCAAAAAAIAAAAA"],
    ["connection: Upgrade", "upgrade: websocket", "sec-websocket-version: 13",
     "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ=="],
    ["connection: Upgrade", "upgrade: h2c"]], ids=["h2c", "websocket", "last-header"])
def test_an_upgrade_is_ignored_and_the_request_answered_with_its_body(run, path, upgrade) -> None:
    """The API serves neither HTTP/2 nor websockets: a request asking to upgrade is answered in HTTP/1.1 as if it had
    not asked (the fast path, or the app with the whole body). `curl --http2 -d ...` (h2c) reached the app without
    its body (a 422), and a POST asking for a websocket was handed to the websocket protocol and never answered."""
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        request = post(path, {"namespace": "ev", "counter_name": "c"}, *upgrade)
        c.send(request)
        if path == "/v1/GetCount":
            assert service.calls == [("get", "ev", "c")]
            service.settle(Count(EV, "c", 1, None))
            await until(lambda: c.transport.data, "the fast path's response")
            assert c.transport.take() == fast_response(200, count_body("ev", "c", 1, "EVENTUAL"))
        else:
            await until(lambda: c.transport.data, "the app's response")
            assert c.app.requests[0]["body"] == _request_body(request)
            assert not any(name == b"upgrade" for name, _ in c.app.requests[0]["headers"])
    run(scenario)


# -- pipelining ---------------------------------------------------------------------------------------------------


def test_pipelined_request_waits_for_a_pending_fast_request(run, recorded) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        second = post("/v1/GetCount", {"namespace": "acc", "counter_name": "d"})
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}) + second)
        assert service.calls == [("get", "ev", "c")], "the second request must not start before the first is done"
        assert c.transport.read_paused, "uvicorn pauses reading while a request is queued"
        await spin()
        assert c.app.requests == [] and c.transport.data == b""
        service.settle(Count(EV, "c", 1, None))
        await until(lambda: c.app.requests and c.transport.data.endswith(b"app POST /v1/GetCount %d"
                                                                        % len(_request_body(second))),
                    "both responses")
        assert c.transport.take() == (fast_response(200, count_body("ev", "c", 1, "EVENTUAL"))
                                      + app_response("POST", "/v1/GetCount", len(_request_body(second))))
        assert c.app.requests[0]["body"] == _request_body(second)
        assert not c.transport.read_paused
        assert c.server_state.total_requests == 2
        # idle again: the next request takes the fast path
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}))
        assert service.calls[-1] == ("get", "ev", "c") and len(service.calls) == 2
        service.settle(Count(EV, "c", 2, None))
        await until(lambda: c.transport.data, "the third response")
        assert c.transport.take() == fast_response(200, count_body("ev", "c", 2, "EVENTUAL"))
        assert [(e, s) for e, s, _ in recorded] == [("/v1/GetCount", 200)] * 2
    run(scenario)


def test_pipelined_requests_behind_a_fast_request_in_order(run) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/AddCount", {"namespace": "be", "counter_name": "c", "delta": 1})
               + get("/healthz") + post("/v1/ClearCount", {"namespace": "ev", "counter_name": "c"}))
        await spin()
        assert c.app.requests == []
        service.settle(5)
        await until(lambda: len(c.app.requests) == 2 and c.transport.data.endswith(b"/v1/ClearCount 37"),
                    "all three responses")
        assert [r["path"] for r in c.app.requests] == ["/healthz", "/v1/ClearCount"]
        assert c.transport.take() == (fast_response(200, add_body("be", "c", "BEST_EFFORT", False, None))
                                      + app_response("GET", "/healthz", 0)
                                      + app_response("POST", "/v1/ClearCount", 37))
        assert c.server_state.total_requests == 3
    run(scenario)


@pytest.mark.parametrize("pipelined", [0, 1])
def test_an_unparsable_request_is_answered_400_after_the_requests_before_it(run, pipelined) -> None:
    """uvicorn answered the garbage at once and closed: the write before it was counted, but its client got only
    the 400 (matched to the write) and would retry it (a review). Now the earlier answers go first, then the 400,
    and nothing after the garbage is read."""
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        add = post("/v1/AddCount", {"namespace": "be", "counter_name": "c", "delta": 1})
        earlier = add + get("/healthz") * pipelined
        c.send(earlier + b"GARBAGE\r\n\r\n")
        assert c.transport.data == b"" and not c.transport.closed, "the 400 went out before the earlier answers"
        c.send(post("/v1/AddCount", {"namespace": "be", "counter_name": "d", "delta": 1}))  # read no further
        service.settle(5)
        await until(lambda: c.transport.closed, "the 400 and the close")
        expected = fast_response(200, add_body("be", "c", "BEST_EFFORT", False, None))
        if pipelined:
            expected += app_response("GET", "/healthz", 0)
        data = c.transport.take()
        assert data.startswith(expected) and data[len(expected):].startswith(status_line(400)), data
        assert data.endswith(b"Invalid HTTP request received.") and c.transport.writes_after_close == []
        assert service.calls == [("add_best_effort", "be", "c", 1)], service.calls
    run(scenario)


def test_an_unparsable_request_on_an_idle_connection_is_answered_at_once(run) -> None:
    async def scenario() -> None:
        c = Connection(FakeService())
        c.send(b"GARBAGE\r\n\r\n")
        assert c.transport.closed and c.transport.take().startswith(status_line(400))
    run(scenario)


def test_reading_resumes_after_the_queue_drains(run) -> None:
    """uvicorn pauses reading while a request is queued; our on_response_complete resumes it (an app that never
    calls receive(), like a health check, does not)."""
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}) + get("/healthz"))
        assert c.transport.read_paused
        service.settle(Count(EV, "c", 1, None))
        await until(lambda: c.app.requests and c.transport.data.endswith(b"app GET /healthz 0"), "both responses")
        assert not c.transport.read_paused, "reading left paused: the client's next request is never read"
    run(scenario)


def test_fast_request_behind_a_busy_app_request_goes_to_the_app_in_order(run) -> None:
    async def scenario() -> None:
        service = FakeService()
        app = RecordingApp()
        app.release = asyncio.Event()
        c = Connection(service, app=app)
        c.send(get("/healthz"))
        await until(lambda: app.requests, "the app to receive the first request")
        fast = post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"})
        c.send(fast)
        assert service.calls == [], "a request behind a busy one is not the plain case"
        await spin()
        assert c.transport.data == b"" and len(app.requests) == 1
        app.release.set()
        await until(lambda: len(app.requests) == 2 and c.transport.data.endswith(b"/v1/GetCount 37"),
                    "both responses")
        assert c.transport.take() == (app_response("GET", "/healthz", 0)
                                      + app_response("POST", "/v1/GetCount", len(_request_body(fast))))
        assert app.requests[1]["body"] == _request_body(fast)
    run(scenario)


def test_shutdown_while_a_fast_request_is_pending_closes_after_the_response(run) -> None:
    """uvicorn's graceful shutdown: a busy connection gets its response with `connection: close`, then closes."""
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}))
        c.protocol.shutdown()
        assert not c.transport.closed
        service.settle(Count(EV, "c", 1, None))
        await until(lambda: c.transport.closed, "the connection to close")
        assert c.transport.take() == fast_response(200, count_body("ev", "c", 1, "EVENTUAL"), keep_alive=False)
        assert c.transport.writes_after_close == []
    run(scenario)


def test_a_half_closed_connection_answers_what_was_sent_then_closes(run) -> None:
    """eof_received keeps the transport open while a request waits for its answer (true), closes it once the last
    is answered, and lets asyncio close it at once (false) when nothing waits or a request was cut short."""
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}))
        assert c.protocol.eof_received() is True and not c.transport.closed
        service.settle(Count(EV, "c", 1, None))
        await until(lambda: c.transport.closed, "the connection to close once answered")
        assert c.transport.take() == fast_response(200, count_body("ev", "c", 1, "EVENTUAL"))

        idle = Connection(FakeService())
        assert idle.protocol.eof_received() is False  # nothing to answer: asyncio closes it
        cut = Connection(FakeService())
        cut.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"})[:-3])  # the body cut short
        assert cut.protocol.eof_received() is False
    run(scenario)


# -- connection lost ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [None, ConnectionResetError("reset by peer")])
@pytest.mark.parametrize("path", ["/v1/GetCount", "/v1/AddCount"])
def test_connection_lost_while_a_fast_request_is_pending(run, recorded, exc, path) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        body = {"namespace": "ev", "counter_name": "c"} | ({"delta": 1} if path == "/v1/AddCount" else {})
        c.send(post(path, body))
        c.lose(exc)
        service.settle(None if path == "/v1/AddCount" else Count(EV, "c", 1, None))
        await spin()
        assert c.transport.data == b"" and c.transport.writes_after_close == []
        assert c.protocol.timeout_keep_alive_task is None
        assert c.server_state.tasks == set()
        assert [(e, s) for e, s, _ in recorded] == [(path, 200)]
    run(scenario)


def test_connection_lost_unnoticed_by_the_transport_still_writes_nothing(run) -> None:
    """connection_lost marks the pending FastCycle disconnected (uvicorn sets `self.cycle.disconnected`): nothing is
    written even if the transport does not report closing."""
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}))
        c.protocol.connection_lost(ConnectionResetError())
        service.settle(Count(EV, "c", 1, None))
        await spin()
        assert c.transport.data == b""
    run(scenario)


def test_connection_lost_with_a_request_queued_behind_a_fast_one(run) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}) + get("/healthz"))
        c.lose(None)
        service.settle(Count(EV, "c", 1, None))
        await spin()
        assert c.transport.data == b"" and c.transport.writes_after_close == []
        assert c.app.requests == []
    run(scenario)


# -- keep-alive ---------------------------------------------------------------------------------------------------


class Clock:
    """The protocol's loop with a hand-driven clock: time() and call_later are fake, the rest is the real loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.now = 1000.0
        self.timers: list[FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> FakeTimer:
        timer = FakeTimer(self.now + delay, callback, args)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Move the clock and run every timer due by then, in order of their deadlines."""
        target = self.now + seconds
        while True:
            due = [t for t in self.timers if not t.cancelled and not t.fired and t.when <= target]
            if not due:
                break
            timer = min(due, key=lambda t: t.when)
            self.now = timer.when
            timer.fired = True
            timer.callback(*timer.args)
        self.now = target

    @property
    def armed(self) -> list[FakeTimer]:
        return [t for t in self.timers if not t.cancelled and not t.fired]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)


class FakeTimer:
    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.when, self.callback, self.args = when, callback, args
        self.cancelled = self.fired = False

    def cancel(self) -> None:
        self.cancelled = True


def clocked(service: FakeService, timeout: float = 5.0) -> tuple[Connection, Clock]:
    c = Connection(service, timeout_keep_alive=timeout)
    clock = Clock(asyncio.get_running_loop())
    c.protocol.loop = clock  # type: ignore[assignment]
    return c, clock


async def answer(c: Connection, service: FakeService) -> None:
    c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}))
    service.settle(Count(EV, "c", 1, None))
    await until(lambda: c.transport.data, "the response")
    c.transport.take()


def test_keep_alive_timer_is_armed_once_per_idle_period(run) -> None:
    async def scenario() -> None:
        service = FakeService()
        c, clock = clocked(service, timeout=5.0)
        assert clock.timers == []
        await answer(c, service)
        assert len(clock.timers) == 1 and clock.timers[0].when == 1005.0
        for _ in range(16):  # busy for 4 s: still that one timer
            clock.advance(0.25)
            await answer(c, service)
        assert len(clock.timers) == 1, "one keep-alive timer per idle period, not one per request"
        last_response = clock.now  # 1004.0
        clock.advance(1.0)  # the first timer fires at 1005: idle for 1 s only, re-armed for the remaining 4 s
        assert not c.transport.closed
        assert [t.when for t in clock.armed] == [last_response + 5.0]
        clock.advance(3.5)
        assert not c.transport.closed
        clock.advance(0.5)
        assert c.transport.closed, "idle for the keep-alive timeout: closed"
        assert clock.armed == []
    run(scenario)


def test_idle_connection_closes_after_the_timeout_on_a_real_loop(run) -> None:
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service, timeout_keep_alive=0.05)
        loop = asyncio.get_running_loop()
        await answer(c, service)
        idle_from = loop.time()
        await until(lambda: c.transport.closed, "the idle connection to close")
        assert loop.time() - idle_from >= 0.045
        assert c.protocol.timeout_keep_alive_task is None
    run(scenario)


def test_busy_connection_is_not_closed(run) -> None:
    async def scenario() -> None:
        service = FakeService()
        c, clock = clocked(service, timeout=5.0)
        await answer(c, service)  # idle from 1000, timer at 1005
        clock.advance(4.0)
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}))  # in flight past 1005
        clock.advance(10.0)
        assert not c.transport.closed, "closed while a request was in flight"
        assert clock.armed == []
        service.settle(Count(EV, "c", 1, None))
        await until(lambda: c.transport.data, "the response")
        assert [t.when for t in clock.armed] == [clock.now + 5.0], "the response starts a new idle period"
        clock.advance(5.0)
        assert c.transport.closed
    run(scenario)


def test_partial_request_counts_as_busy(run) -> None:
    """uvicorn's data_received calls _unset_keepalive_if_required: a request whose body has not all arrived yet is
    not an idle connection."""
    async def scenario() -> None:
        service = FakeService()
        c, clock = clocked(service, timeout=5.0)
        await answer(c, service)
        clock.advance(4.0)
        request = post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"})
        c.send(request[:-5])
        clock.advance(2.0)
        assert not c.transport.closed
        c.send(request[-5:])
        assert service.calls[-1] == ("get", "ev", "c")
    run(scenario)


def test_keep_alive_after_an_app_response(run) -> None:
    """uvicorn's RequestResponseCycle calls our on_response_complete: app responses start idle periods too."""
    async def scenario() -> None:
        service = FakeService()
        c, clock = clocked(service, timeout=5.0)
        c.send(get("/healthz"))
        await until(lambda: c.transport.data, "the app's response")
        assert [t.when for t in clock.armed] == [1005.0]
        clock.advance(5.0)
        assert c.transport.closed
    run(scenario)


def test_connection_lost_cancels_the_keep_alive_timer(run) -> None:
    async def scenario() -> None:
        service = FakeService()
        c, clock = clocked(service)
        await answer(c, service)
        timer = clock.armed[0]
        c.lose(ConnectionResetError())
        assert timer.cancelled and c.protocol.timeout_keep_alive_task is None
    run(scenario)


def test_a_client_that_does_not_read_its_answers_is_read_no_further(run) -> None:
    """A review: a fast answer is written at once and the next pipelined request read at once, so a client that
    sends without reading grew the API's buffer without bound. While the transport's buffer is full (it paused
    writing) nothing more is read or started; once it drains, the next request is."""
    async def scenario() -> None:
        service = FakeService()
        c = Connection(service)
        second = post("/v1/GetCount", {"namespace": "acc", "counter_name": "d"})
        c.send(post("/v1/GetCount", {"namespace": "ev", "counter_name": "c"}) + second)
        c.protocol.pause_writing()  # as the transport does above its high-water mark
        service.settle(Count(EV, "c", 1, None))
        await until(lambda: c.transport.data, "the first answer")
        await spin()
        held = (list(c.app.requests), c.transport.read_paused)
        c.protocol.resume_writing()  # first: a request the app started meanwhile waits for the drain
        assert held == ([], True), "read on while the client reads nothing"
        await until(lambda: c.app.requests, "the second request, once drained")
        assert c.app.requests[0]["body"] == _request_body(second) and not c.transport.read_paused
    run(scenario)
