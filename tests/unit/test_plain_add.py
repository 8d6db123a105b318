"""query_api._plain_add (C): every body it takes is read as the Python fast path reads it, and encoded and answered
byte for byte as schemas.codec.mutation_body and query_api.responses.add_json do; the plain bodies it is for are
all taken; a stale build is never used.

`make test` compiles it (python -m query_api.plain_add); COUNTER_TEST_PURE_PYTHON=1 says no build is expected (a
machine without a C compiler), and then only the check that no build is used runs its course.
"""

from __future__ import annotations

import os
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from control_plane import parse_namespaces
from query_api import plain_add as plain_add_module
from query_api.early_persist import eligible
from query_api.responses import add_json
from query_api.service import Written
from schemas import INT64_MAX, INT64_MIN, Mutation, MutationOp, ValidationError, mutation_body, validate_counter_name

PURE_ONLY = os.environ.get("COUNTER_TEST_PURE_PYTHON") == "1"
PLAIN_ADD = plain_add_module.plain_add()
REGISTRY = parse_namespaces({"namespaces": {
    "ev": {"counter_type": "EVENTUAL"},
    "acc": {"counter_type": "ACCURATE"},
    "be": {"counter_type": "BEST_EFFORT", "ttl": "1h"},
}})
TYPES = {name: REGISTRY[name].counter_type.value for name in REGISTRY
         if REGISTRY[name].counter_type.value != "BEST_EFFORT" and eligible(REGISTRY[name])}
TOKEN = "0123456789abcdef0123456789abcdef"
EVENT_TIME = 1_764_125_000_123_456


def python_reading(body: bytes) -> tuple[str, str, int] | None:
    """What query_api.fastpath reads from an AddCount body it serves as a plain durable add, or None."""
    try:
        req: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(req, dict) or req.keys() != {"namespace", "counter_name", "delta"}:
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
    return namespace, counter, delta


def test_the_api_uses_the_build_of_the_current_source() -> None:
    assert PLAIN_ADD is not None or PURE_ONLY, "no build of query_api/_plain_add.c: run `python -m query_api.plain_add`"
    if PLAIN_ADD is not None:
        assert type(PLAIN_ADD).__name__ == "builtin_function_or_method"  # C, not a Python function


def test_a_build_of_another_source_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plain_add_module, "source_digest", lambda: "0" * 64)  # as if _plain_add.c had been edited
    assert plain_add_module.plain_add(warn=False) is None


def needs_build() -> Any:
    if PLAIN_ADD is None:
        assert PURE_ONLY, "no compiled build to test"
        pytest.skip("COUNTER_TEST_PURE_PYTHON=1: no C build on this machine")
    return PLAIN_ADD


# -- bodies -------------------------------------------------------------------------------------------------------

plain_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters='"\\'), max_size=210)
names = st.sampled_from([*sorted(REGISTRY.names()), "unknown", ""]) | plain_text
deltas = st.integers(INT64_MIN, INT64_MAX) | st.sampled_from([0, -1, 1, INT64_MIN, INT64_MAX, INT64_MAX + 1,
                                                               INT64_MIN - 1, 10**30])
spaces = st.text(" \t\r\n", max_size=3)


@st.composite
def plain_bodies(draw: st.DrawFn) -> bytes:
    """Bodies in the plain form: the three keys in any order, whitespace between tokens."""
    values = {"namespace": orjson.dumps(draw(names)), "counter_name": orjson.dumps(draw(plain_text)),
              "delta": b"%d" % draw(deltas)}
    keys = draw(st.permutations(list(values)))
    ws = lambda: draw(spaces).encode()  # noqa: E731
    members = [ws() + b'"%s"' % k.encode() + ws() + b":" + ws() + values[k] + ws() for k in keys]
    return ws() + b"{" + b",".join(members) + b"}" + ws()


scalars = st.none() | st.booleans() | st.integers(INT64_MIN, INT64_MAX) | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(scalars,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                           max_leaves=5)


@st.composite
def other_bodies(draw: st.DrawFn) -> bytes:
    """Bodies near the plain form: other keys, other value types, escapes, non-ASCII, duplicates."""
    body: dict[str, Any] = {"namespace": draw(names), "counter_name": draw(plain_text | st.text(max_size=5)),
                            "delta": draw(json_values)}  # deltas beyond 64 bits: plain_bodies (orjson writes none)
    for key in draw(st.lists(st.sampled_from(["namespace", "counter_name", "delta", "idempotency_token", "x"]),
                             max_size=2)):
        body[key] = draw(json_values | names)
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


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
def test_a_body_taken_is_read_encoded_and_answered_as_the_python_path_does(body: bytes) -> None:
    plain_add = needs_build()
    taken = plain_add(body, TYPES, EVENT_TIME, TOKEN)
    expected = python_reading(body)
    if taken is None:
        return
    assert expected is not None, f"taken, but not a plain add to the Python path: {body!r}"
    namespace, counter, delta, avro_body, answer = taken
    assert (namespace, counter, delta) == expected
    mutation = Mutation(namespace, counter, delta, EVENT_TIME, TOKEN, "", MutationOp.ADD, (), "")
    assert avro_body == mutation_body(mutation)
    assert answer == add_json(Written(REGISTRY[namespace], counter, TOKEN, EVENT_TIME))


@settings(max_examples=800, deadline=None)
@given(plain_bodies(), st.integers(INT64_MIN, INT64_MAX), plain_text)  # any token the answer writes unescaped
def test_every_plain_body_of_a_plain_namespace_is_taken(body: bytes, event_time: int, token: str) -> None:
    plain_add = needs_build()
    expected = python_reading(body)
    taken = plain_add(body, TYPES, event_time, token)
    if expected is None:  # unknown namespace, a name the validation refuses, a delta beyond 64 bits
        assert taken is None
        return
    assert taken is not None, body
    namespace, counter, delta = expected
    assert taken[3] == mutation_body(Mutation(namespace, counter, delta, event_time, token, "", MutationOp.ADD, (), ""))
    assert taken[4] == add_json(Written(REGISTRY[namespace], counter, token, event_time))


def test_what_is_not_for_this_path_is_left_to_the_python_path() -> None:
    plain_add = needs_build()
    body = b'{"namespace":"%s","counter_name":"c","delta":1}'
    assert plain_add(body % b"ev", TYPES, EVENT_TIME, TOKEN) is not None
    assert plain_add(body % b"be", TYPES, EVENT_TIME, TOKEN) is None  # BEST_EFFORT: not in the namespaces given
    for token in ("t\u00e9", 't"', "t\\", "t\n"):  # a token JSON would escape (the API's never need it)
        assert plain_add(body % b"ev", TYPES, EVENT_TIME, token) is None, token
    with pytest.raises(OverflowError):
        plain_add(body % b"ev", TYPES, 2**64, TOKEN)
    with pytest.raises(TypeError):
        plain_add(body.decode(), TYPES, EVENT_TIME, TOKEN)
