"""The fast path's serializers produce exactly the bytes of the response models."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane import Namespace, default_config_path, load_namespaces
from query_api.responses import add_json, add_response, count_json, count_response, error_response
from query_api.service import Count, Rejected, Written
from schemas import ValidationError, validate_counter_name


def _valid(name: str) -> bool:
    try:
        validate_counter_name(name)
    except ValidationError:
        return False
    return True


names = st.text(min_size=1, max_size=40).filter(_valid)
REGISTRY = load_namespaces(default_config_path())
namespaces = st.sampled_from([REGISTRY[name] for name in REGISTRY.names()])
rollup_times = st.one_of(st.none(), st.just(0), st.integers(1, 4_102_444_800 * 10**6),
                         st.integers(1, 4_102_444_800).map(lambda s: s * 10**6))  # whole seconds too


@settings(max_examples=300)
@given(namespaces, names, st.integers(-(2**70), 2**70), rollup_times)
def test_count_json_equals_the_model(ns: Namespace, counter: str, count: int, rollup_ts: int | None) -> None:
    c = Count(ns, counter, count, rollup_ts)
    assert count_json(c) == count_response(c).model_dump_json().encode()


@settings(max_examples=100)
@given(namespaces, names, st.one_of(st.none(), st.text(min_size=1, max_size=20)), st.integers(0, 2**62))
def test_add_json_equals_the_model(ns: Namespace, counter: str, token: str | None, event_time: int) -> None:
    w = Written(ns, counter, token, event_time)
    assert add_json(w) == add_response(w).model_dump_json().encode()


def test_a_failed_or_uncounted_durable_write_answers_the_identity_a_retry_must_send() -> None:
    """A write without a token gets one drawn by the API: its 503 (not acknowledged) or 504 (not counted in time)
    answers that token and event time, which a retry sends to be counted once; other errors answer none."""
    from producers import DeliveryError
    from query_api.responses import error_response
    from query_api.service import BrokerUnavailable, NotCountedYet, Rejected

    identity = ("tok", 1_800_000_000_000_001)
    expected = {"token": "tok", "generation_time": 1_800_000_000_000_001}
    assert error_response(BrokerUnavailable("down", identity)) == (503, {"detail": "down",
                                                                        "idempotency_token": expected})
    assert error_response(NotCountedYet("late", identity))[1]["idempotency_token"] == expected
    assert error_response(DeliveryError("down"), identity)[1]["idempotency_token"] == expected  # a shared failure
    assert error_response(BrokerUnavailable("down")) == (503, {"detail": "down"})
    assert "idempotency_token" not in error_response(Rejected("delta", "bad"), identity)[1]


def test_a_best_effort_write_of_unknown_outcome_is_a_504_and_one_never_sent_a_503() -> None:
    """A review: BEST_EFFORT writes memcached took without answering were 503s ("not applied"), and applied."""
    from query_api.responses import error_response
    from sinks.best_effort import CounterUnavailable, CounterWriteUnknown

    assert error_response(CounterWriteUnknown("may have been applied")) == (504, {"detail": "may have been applied"})
    assert error_response(CounterUnavailable("refused")) == (503, {"detail": "refused"})


def test_a_refused_fields_loc_keeps_a_dimension_key_whole() -> None:
    """A 422's loc names the request's parts; a dimension key with dots in it is one part (it was split at them)."""
    def loc(field: str) -> list[str | int]:
        return error_response(Rejected(field, "refused"))[1]["detail"][0]["loc"]
    assert loc("dimensions.a.b") == ["body", "dimensions", "a.b"]
    assert loc("requests.2.dimensions.x.y") == ["body", "requests", 2, "dimensions", "x.y"]
    assert loc("requests.12.delta") == ["body", "requests", 12, "delta"]
    assert loc("idempotency_token.generation_time") == ["body", "idempotency_token", "generation_time"]
    assert loc("dimensions") == ["body", "dimensions"]


def test_an_error_never_echoes_a_huge_input_whole() -> None:
    """A 422 naming an unknown key of 20 KB, or a 404 for a namespace of 5,000 characters, answered them whole."""
    from query_api.app import LOC_PART_MAX, _safe_error
    from query_api.service import CounterService, NamespaceNotFound

    error = _safe_error({"loc": ("body", "k" * 20_000), "msg": "Extra inputs are not permitted", "type": "x"})
    assert error["loc"] == ["body", "k" * LOC_PART_MAX + "..."]
    svc = CounterService(REGISTRY, producer=None, signals=None, events=None, rollups=None,  # type: ignore[arg-type]
                         cache=None, counters=None)  # type: ignore[arg-type]
    try:
        svc.namespace("n" * 5000)
    except NamespaceNotFound as exc:
        assert len(str(exc)) < 120, str(exc)
    else:
        raise AssertionError("an unknown namespace was found")
