"""query_api._plain_add (C): every body read_add takes is read as the Python fast path reads it; encode_add encodes
and answers byte for byte as schemas.codec.mutation_body and query_api.responses.add_json do; the plain bodies it is
for are all taken; a stale build is never used.

`make test` compiles it (python -m query_api.plain_add); COUNTER_TEST_PURE_PYTHON=1 says no build is expected (a
machine without a C compiler), and then only the check that no stale build is used runs its course.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import httptools
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from control_plane import parse_namespaces
from producers import new_token
from query_api import plain_add as plain_add_module
from query_api.early_persist import eligible
from query_api.responses import add_json
from query_api.service import Written
from schemas import INT64_MAX, INT64_MIN, Mutation, MutationOp, ValidationError, mutation_body, validate_counter_name

PURE_ONLY = os.environ.get("COUNTER_TEST_PURE_PYTHON") == "1"
PLAIN = plain_add_module.plain_add()
REGISTRY = parse_namespaces({"namespaces": {
    "ev": {"counter_type": "EVENTUAL"},
    "acc": {"counter_type": "ACCURATE"},
    "be": {"counter_type": "BEST_EFFORT", "ttl": "1h"},
}})
TYPES = {name: REGISTRY[name].counter_type.value for name in REGISTRY
         if REGISTRY[name].counter_type.value != "BEST_EFFORT" and eligible(REGISTRY[name])}
TOKEN = "0123456789abcdef0123456789abcdef"
EVENT_TIME = 1_764_125_000_123_456

Reading = tuple[str, str, int, str, Any, Any]


def python_reading(body: bytes) -> Reading | None:
    """What query_api.fastpath reads from an AddCount body it serves as a durable add of a plain namespace (namespace,
    counter, delta, counter type, token, generation time), or None."""
    try:
        req: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(req, dict) or not {"namespace", "counter_name", "delta"} <= req.keys() <= {
            "namespace", "counter_name", "delta", "idempotency_token"}:
        return None
    namespace, counter, delta = req["namespace"], req["counter_name"], req["delta"]
    if type(namespace) is not str or namespace not in TYPES:
        return None
    try:
        validate_counter_name(counter)
    except ValidationError:
        return None
    if type(delta) is not int or not INT64_MIN <= delta <= INT64_MAX:
        return None
    token, when = None, None
    if "idempotency_token" in req:
        spec = req["idempotency_token"]
        if not (type(spec) is dict and spec.keys() <= {"token", "generation_time"} and type(spec.get("token")) is str):
            return None
        token, when = spec["token"], spec.get("generation_time")
    return namespace, counter, delta, TYPES[namespace], token, when


def test_the_api_uses_the_build_of_the_current_source() -> None:
    assert PLAIN is not None or PURE_ONLY, "no build of query_api/_plain_add.c: run `python -m query_api.plain_add`"
    if PLAIN is not None:
        assert type(PLAIN.read_add).__name__ == type(PLAIN.encode_add).__name__ == "builtin_function_or_method"


def test_a_build_of_another_source_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plain_add_module, "source_digest", lambda: "0" * 64)  # as if _plain_add.c had been edited
    assert plain_add_module.plain_add(warn=False) is None


def needs_build() -> plain_add_module.PlainAdd:
    if PLAIN is None:
        assert PURE_ONLY, "no compiled build to test"
        pytest.skip("COUNTER_TEST_PURE_PYTHON=1: no C build on this machine")
    return PLAIN


# -- bodies -------------------------------------------------------------------------------------------------------

plain_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters='"\\'), max_size=210)
names = st.sampled_from([*sorted(REGISTRY.names()), "unknown", ""]) | plain_text
deltas = st.integers(INT64_MIN, INT64_MAX) | st.sampled_from([0, -1, 1, INT64_MIN, INT64_MAX, INT64_MAX + 1,
                                                               INT64_MIN - 1, 10**30])
spaces = st.text(" \t\r\n", max_size=3)
scalars = st.none() | st.booleans() | st.integers(INT64_MIN, INT64_MAX) | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(scalars,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                           max_leaves=5)


@st.composite
def plain_objects(draw: st.DrawFn, members: dict[str, bytes]) -> bytes:
    """A JSON object of these members (raw values) in any order, whitespace between tokens."""
    ws = lambda: draw(spaces).encode()  # noqa: E731
    keys = draw(st.permutations(list(members)))
    return ws() + b"{" + b",".join(ws() + b'"%s"' % k.encode() + ws() + b":" + ws() + members[k] + ws()
                                   for k in keys) + b"}" + ws()


@st.composite
def plain_bodies(draw: st.DrawFn) -> bytes:
    """Bodies in the plain form: the three keys, maybe a token (and a generation time, a string or an integer)."""
    members = {"namespace": orjson.dumps(draw(names)), "counter_name": orjson.dumps(draw(plain_text)),
               "delta": b"%d" % draw(deltas)}
    if draw(st.booleans()):
        token = {"token": orjson.dumps(draw(plain_text))}
        when = draw(st.none() | plain_text | st.sampled_from(["2026-11-26T03:00:00Z", "2026-11-26T03:00:00.123Z"])
                    | st.integers(INT64_MIN, INT64_MAX)  # beyond 64 bits: the Python path refuses it
                    | st.sampled_from([1_764_126_000, 1_764_126_000_123, 1_764_126_000_123_456]))
        if when is not None:
            token["generation_time"] = orjson.dumps(when) if isinstance(when, str) else b"%d" % when
        members["idempotency_token"] = draw(plain_objects(token))
    return draw(plain_objects(members))


@st.composite
def other_bodies(draw: st.DrawFn) -> bytes:
    """Bodies near the plain form: other keys, other value types, escapes, non-ASCII, duplicates."""
    body: dict[str, Any] = {"namespace": draw(names), "counter_name": draw(plain_text | st.text(max_size=5)),
                            "delta": draw(json_values)}  # deltas beyond 64 bits: plain_bodies (orjson writes none)
    for key in draw(st.lists(st.sampled_from(["namespace", "counter_name", "delta", "idempotency_token", "x"]),
                             max_size=2)):
        body[key] = draw(json_values | names)
    if draw(st.booleans()):
        body["idempotency_token"] = draw(st.dictionaries(st.sampled_from(["token", "generation_time", "x"]),
                                                         json_values | plain_text, max_size=3))
    raw = orjson.dumps(body)
    if draw(st.booleans()):  # a duplicate key, as text
        raw = raw[:-1] + b',"delta":%d}' % draw(deltas)
    return raw


def corrupted(bodies: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Bodies cut short, or with a byte replaced or inserted."""
    @st.composite
    def damage(draw: st.DrawFn) -> bytes:
        body = draw(bodies)
        at = draw(st.integers(0, len(body)))
        byte = bytes([draw(st.integers(0, 255))])
        return draw(st.sampled_from([body[:at], body[:at] + byte + body[at + 1:], body[:at] + byte + body[at:]]))
    return damage()


# -- the properties -----------------------------------------------------------------------------------------------


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain_bodies() | other_bodies() | corrupted(plain_bodies()))
@example(b'{"namespace":"ev","counter_name":"c","delta":-0}')
@example(b'{"namespace":"ev","counter_name":"c","delta":01}')
@example(b'{"namespace":"ev","counter_name":"c","delta":1e2}')
@example(b'{"namespace":"ev","counter_name":"c","delta":1} x')
@example(b'{"namespace":"ev","counter_name":"c\\u0041","delta":1}')
@example(b'{"namespace":"ev","counter_name":"c","delta":1,}')
@example(b'{"namespace":"ev","counter_name":"c","delta":1,"delta":2}')
@example(b'{"namespace":"ev","counter_name":"' + b"x" * 201 + b'","delta":1}')
@example(b'\xef\xbb\xbf{"namespace":"ev","counter_name":"c","delta":1}')
@example(b'{"namespace":"ev","counter_name":"c","delta":1,"idempotency_token":{}}')
@example(b'{"namespace":"ev","counter_name":"c","delta":1,"idempotency_token":{"generation_time":1}}')
@example(b'{"namespace":"ev","counter_name":"c","delta":1,"idempotency_token":{"token":"t","token":"u"}}')
@example(b'{"namespace":"ev","counter_name":"c","delta":1,"idempotency_token":{"token":"t","generation_time":1.5}}')
@example(b'{"namespace":"ev","counter_name":"c","delta":1,"idempotency_token":null}')
@example(b'{"namespace":"ev","counter_name":"c","delta":1,"idempotency_token":{"token":"t"},"idempotency_token":{}}')
def test_a_body_taken_is_read_as_the_python_path_reads_it(body: bytes) -> None:
    taken = needs_build().read_add(body, TYPES)
    if taken is not None:
        assert taken == python_reading(body), f"taken, but not so by the Python path: {body!r}"


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain_bodies())
def test_every_plain_body_of_a_plain_namespace_is_taken(body: bytes) -> None:
    expected = python_reading(body)
    assert needs_build().read_add(body, TYPES) == expected, body  # None: unknown namespace, invalid name or delta


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from(sorted(TYPES)), plain_text.filter(lambda name: 0 < len(name) <= 200 and " " not in name),
       st.integers(INT64_MIN, INT64_MAX), st.integers(INT64_MIN, INT64_MAX), plain_text | st.text(max_size=8))
@example("ev", "c", 1, EVENT_TIME, 'a"b')
@example("ev", "c", 1, EVENT_TIME, "a\\b")
@example("ev", "c", 1, EVENT_TIME, "a\x7fb")
@example("ev", "c", 1, EVENT_TIME, "caf\u00e9")
def test_encode_add_is_mutation_body_and_add_json(namespace: str, counter: str, delta: int, event_time: int,
                                                  token: str) -> None:
    encoded = needs_build().encode_add(namespace, counter, delta, TYPES[namespace], event_time, token)
    if not (token.isascii() and token.isprintable() and '"' not in token and "\\" not in token):
        assert encoded is None, "a token the answer would escape"  # the Python path answers it
        return
    mutation = Mutation(namespace, counter, delta, event_time, token, "", MutationOp.ADD, (), "")
    assert encoded == (mutation_body(mutation), add_json(Written(REGISTRY[namespace], counter, token, event_time)))


def test_what_is_not_for_this_path_is_left_to_the_python_path() -> None:
    plain = needs_build()
    body = b'{"namespace":"%s","counter_name":"c","delta":1}'
    assert plain.read_add(body % b"ev", TYPES) == ("ev", "c", 1, "EVENTUAL", None, None)
    assert plain.read_add(body % b"be", TYPES) is None  # BEST_EFFORT: not in the namespaces given
    with pytest.raises(OverflowError):
        plain.encode_add("ev", "c", 1, "EVENTUAL", 2**64, TOKEN)
    with pytest.raises(TypeError):
        plain.read_add(body.decode(), TYPES)  # type: ignore[arg-type]


def test_no_reference_is_leaked_or_lost() -> None:
    """The C functions hold references by hand: many calls, taken and declined, leave the counts of what they were
    given where they were (None's count moves with the interpreter's own work: a leak per call would be thousands)."""
    plain = needs_build()
    counter_type, token = TYPES["ev"], "a-token-of-its-own"
    body = (b'{"namespace":"ev","counter_name":"c","delta":1,'
            b'"idempotency_token":{"token":"t","generation_time":"2026-11-26T03:00:00Z"}}')
    before = sys.getrefcount(counter_type), sys.getrefcount(token), sys.getrefcount(body), sys.getrefcount(None)
    for _ in range(10_000):
        assert plain.read_add(body, TYPES) is not None
        assert plain.read_add(b'{"namespace":"ev","counter_name":"c","delta":1}', TYPES) is not None
        assert plain.read_add(body.replace(b'"ev"', b'"zz"'), TYPES) is None
        assert plain.encode_add("ev", "c", 1, counter_type, EVENT_TIME, token) is not None
        assert plain.encode_add("ev", "c", 1, counter_type, EVENT_TIME, 't"') is None
    after = sys.getrefcount(counter_type), sys.getrefcount(token), sys.getrefcount(body), sys.getrefcount(None)
    assert after[:3] == before[:3]
    assert abs(after[3] - before[3]) < 1_000


# -- plain_request: one whole AddCount request, read without the HTTP parser ---------------------------------------

class ParsedRequests:
    """What httptools reads from a chunk: every message's method, URL, version, keep-alive, headers and body."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.parser = httptools.HttpRequestParser(self)

    def on_message_begin(self) -> None:
        self.messages.append({"url": b"", "headers": [], "body": b"", "complete": False})

    def on_url(self, url: bytes) -> None:
        self.messages[-1]["url"] += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.messages[-1]["headers"].append((name.lower(), value))

    def on_headers_complete(self) -> None:
        m = self.messages[-1]
        m["method"], m["version"] = self.parser.get_method(), self.parser.get_http_version()
        m["keep_alive"], m["upgrade"] = self.parser.should_keep_alive(), self.parser.should_upgrade()

    def on_body(self, body: bytes) -> None:
        self.messages[-1]["body"] += body

    def on_message_complete(self) -> None:
        self.messages[-1]["complete"] = True


PLAIN_HEADERS = {b"host", b"content-type", b"content-length", b"user-agent", b"accept", b"accept-encoding",
                 b"connection"}
header_names = st.sampled_from(["Host", "Content-Type", "User-Agent", "Accept", "Accept-Encoding", "Connection",
                                "Expect", "Transfer-Encoding", "Upgrade", "X-Api-Key", "Content-Length"])
header_values = st.sampled_from(["bench", "application/json", "keep-alive", "Keep-Alive", "close", "100-continue",
                                 "chunked", "websocket", "*/*", ""]) | st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)


def cased(draw: st.DrawFn, name: str) -> str:
    return "".join(c.upper() if draw(st.booleans()) else c.lower() for c in name)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """An AddCount request (or one like it) as a client writes it: a request line, headers, a body."""
    body = draw(st.sampled_from([b'{"namespace":"ev","counter_name":"c","delta":1}', b"", b"x" * 20]))
    line = draw(st.sampled_from(["POST /v1/AddCount HTTP/1.1"] * 6 + [
        "POST /v1/AddCount HTTP/1.0", "GET /v1/AddCount HTTP/1.1", "POST /v1/GetCount HTTP/1.1",
        "POST /v1/AddCount?x=1 HTTP/1.1", "post /v1/AddCount HTTP/1.1"]))
    headers = [(cased(draw, name), value) for name, value in draw(st.lists(st.tuples(header_names, header_values),
                                                                           max_size=4))]
    length = draw(st.sampled_from([len(body)] * 4 + [len(body) + 1, max(0, len(body) - 1), None]))
    if length is not None:
        headers.insert(draw(st.integers(0, len(headers))), (cased(draw, "Content-Length"), str(length)))
    spaces = draw(st.sampled_from(["", " ", "  ", "\t"]))
    head = "".join(f"{name}:{spaces}{value}{draw(st.sampled_from(['', ' ']))}\r\n" for name, value in headers)
    return f"{line}\r\n{head}\r\n".encode() + body


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests() | corrupted(requests()) | st.tuples(requests(), requests()).map(b"".join))
@example(b"POST /v1/AddCount HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
@example(b"POST /v1/AddCount HTTP/1.1\r\nContent-Length: 2\r\n Host: folded\r\n\r\n{}")
@example(b"POST /v1/AddCount HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}")
@example(b"POST /v1/AddCount HTTP/1.1\r\nContent-Length: +2\r\n\r\n{}")
@example(b"POST /v1/AddCount HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}POST")
@example(b"POST /v1/AddCount HTTP/1.1\nContent-Length: 2\n\n{}")
def test_a_request_taken_whole_is_one_plain_keep_alive_addcount_to_httptools(data: bytes) -> None:
    body = needs_build().plain_request(data)
    if body is None:
        return
    parsed = ParsedRequests()
    parsed.parser.feed_data(data)  # raises on anything httptools refuses
    assert len(parsed.messages) == 1, data
    m = parsed.messages[0]
    assert (m["complete"], m["method"], m["url"], m["version"], m["keep_alive"], m["upgrade"]) == (
        True, b"POST", b"/v1/AddCount", "1.1", True, False), data
    assert m["body"] == body, data
    assert {name for name, _ in m["headers"]} <= PLAIN_HEADERS, data
    assert [value.strip() for name, value in m["headers"] if name == b"content-length"] == [b"%d" % len(body)]


@settings(max_examples=500, deadline=None)
@given(st.permutations([("Host", "bench"), ("Content-Type", "application/json"), ("Accept", "*/*"),
                        ("User-Agent", "client/1.0"), ("Connection", "keep-alive")]), st.integers(0, 5), st.data())
def test_every_plain_keep_alive_addcount_request_is_taken(headers: list[tuple[str, str]], kept: int,
                                                          data: st.DataObject) -> None:
    body = b'{"namespace":"ev","counter_name":"c","delta":1}'
    chosen = [*headers[:kept], ("Content-Length", str(len(body)))]
    head = "".join(f"{data.draw(st.sampled_from([name, name.lower(), name.upper()]))}: {value}\r\n"
                   for name, value in chosen)
    assert needs_build().plain_request(f"POST /v1/AddCount HTTP/1.1\r\n{head}\r\n".encode() + body) == body


# -- add_request: the request, the body and its encoding in one call -----------------------------------------------

def request_of(body: bytes) -> bytes:
    return b"POST /v1/AddCount HTTP/1.1\r\nHost: bench\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def is_token(token: str) -> bool:
    return len(token) == 32 and all(c in "0123456789abcdef" for c in token)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain_bodies() | other_bodies() | corrupted(plain_bodies()))
def test_add_request_is_plain_request_then_read_add_then_encode_add(body: bytes) -> None:
    """A body without a token is encoded as encode_add encodes it, at the time it was taken, with a token of its
    own; one with a token or a generation time comes back for the Python path to validate; the rest is declined."""
    plain = needs_build()
    before = time.time_ns() // 1000
    taken = plain.add_request(request_of(body), TYPES)
    after = time.time_ns() // 1000
    reading = plain.read_add(body, TYPES)
    if reading is None:
        assert taken is None, body
    elif reading[4] is not None or reading[5] is not None:
        assert taken == body
    else:
        assert type(taken) is tuple, body
        avro_body, answer, key, event = taken
        namespace, counter, delta, counter_type, _, _ = reading
        event_time, token, item_key, event_delta, clear = event
        assert before <= event_time <= after and is_token(token)
        assert (avro_body, answer) == plain.encode_add(namespace, counter, delta, counter_type, event_time, token)
        assert (key, item_key, event_delta, clear) == (f"{namespace}:{counter}", "", delta, False)
    assert plain.add_request(body, TYPES) is None  # a body alone is not a request


def test_add_request_tokens_are_this_process_s_own_and_a_forked_child_draws_others() -> None:
    """Unique tokens: one prefix per process, then a number that counts up; never new_token's prefix (so the two
    never meet); a forked child has a prefix of its own, as new_token's does."""
    plain = needs_build()
    data = request_of(b'{"namespace":"ev","counter_name":"c","delta":1}')
    tokens = [plain.add_request(data, TYPES)[3][1] for _ in range(3)]  # type: ignore[index]
    assert len({t[:16] for t in tokens}) == 1 and all(map(is_token, tokens))
    numbers = [int(t[16:], 16) for t in tokens]
    assert numbers == list(range(numbers[0], numbers[0] + 3))
    assert new_token()[:16] != tokens[0][:16]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next token, then out at once
        os.write(write, plain.add_request(data, TYPES)[3][1].encode())  # type: ignore[index]
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert is_token(child) and child[:16] != tokens[0][:16]


def test_add_request_leaks_no_reference() -> None:
    plain = needs_build()
    counter_type = TYPES["ev"]
    data = request_of(b'{"namespace":"ev","counter_name":"c","delta":1}')
    tokened = request_of(b'{"namespace":"ev","counter_name":"c","delta":1,"idempotency_token":{"token":"t"}}')
    before = sys.getrefcount(counter_type), sys.getrefcount(data), sys.getrefcount(False), sys.getrefcount(None)
    for _ in range(10_000):
        assert type(plain.add_request(data, TYPES)) is tuple
        assert type(plain.add_request(tokened, TYPES)) is bytes
        assert plain.add_request(data.replace(b'"ev"', b'"be"'), TYPES) is None  # not a namespace of this path
    after = sys.getrefcount(counter_type), sys.getrefcount(data), sys.getrefcount(False), sys.getrefcount(None)
    assert after[:2] == before[:2]
    assert abs(after[2] - before[2]) < 1_000 and abs(after[3] - before[3]) < 1_000  # shared: they move a little
