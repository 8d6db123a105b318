"""The fast path's serializers produce exactly the bytes of the response models."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane import Namespace, default_config_path, load_namespaces
from query_api.responses import add_json, add_response, count_json, count_response
from query_api.service import Count, Written
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
