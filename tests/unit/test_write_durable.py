"""CounterService.write_durable: which records ask the worker to persist promptly (the read-your-write header);
write_plain (the C path of a plain AddCount): what write_durable does for the same write."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import pytest

from control_plane import default_config_path, load_namespaces
from query_api import service as service_module
from query_api.responses import add_json
from query_api.service import CounterService, Rejected
from schemas import Mutation, MutationOp, mutation_body

REGISTRY = load_namespaces(default_config_path())


class RecordingProducer:
    def __init__(self) -> None:
        self.marked: list[bool] = []

    def send(self, mutations: Sequence[Mutation], read_your_write: bool = False) -> asyncio.Future[None]:
        self.marked.append(read_your_write)
        return asyncio.get_running_loop().create_future()


@pytest.mark.parametrize("ns_name, then_count, marked", [
    ("my_dataset", False, False),  # AddCount: nobody waits for its count
    ("my_dataset", True, False),  # AddAndGetCount in a plain namespace: this process stores the event itself
    ("my_dataset_accurate", True, False),
    ("plays", False, False),
    ("plays", True, True),  # dimensions: the API cannot store it, the client waits for the worker
])
def test_only_a_write_whose_count_waits_for_the_worker_is_marked(ns_name: str, then_count: bool,
                                                                 marked: bool) -> None:
    async def scenario() -> list[bool]:
        producer = RecordingProducer()
        svc = CounterService(REGISTRY, producer=producer, signals=None, events=None, rollups=None,  # type: ignore[arg-type]
                             cache=None, counters=None)  # type: ignore[arg-type]
        svc.write_durable(REGISTRY[ns_name], "c", 1, MutationOp.ADD, None, None, then_count=then_count)
        return producer.marked

    assert asyncio.run(scenario()) == [marked]


class BodyRecordingProducer(RecordingProducer):
    """Records the v1 body of every write, whether sent as a mutation or already encoded."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []

    def send(self, mutations: Sequence[Mutation], read_your_write: bool = False) -> asyncio.Future[None]:
        self.bodies += [mutation_body(m) for m in mutations]
        return super().send(mutations, read_your_write)

    def send_body(self, body: bytes) -> asyncio.Future[None]:
        self.bodies.append(body)
        return super().send([], False)


TOKENS = [None, {"token": "retry-safe-1", "generation_time": 1_795_662_001_000_000},
          {"token": "retry-safe-2", "generation_time": "2026-11-26T03:00:00.5Z"},
          {"token": "retry-safe-3", "generation_time": 1_795_662_000_250}]
NOW_NS = 1_795_662_001_123_456_789  # a second after the generation times above: inside every accept window


def plain_and_durable(ns_name: str, token: dict[str, Any] | None, *, whole: bool = False,
                      drew: Callable[[int, str], None] | None = None) -> tuple[list[Any], ...]:
    """What write_plain (the C path) and write_durable do for the same AddCount: (bodies sent, read-your-write marks,
    the events noted for read-your-write, the answer) of each. `whole`: the C path is write_plain_request, given the
    whole HTTP request; `drew` is then told the event time and token it drew, before write_durable runs."""
    body: dict[str, Any] = {"namespace": ns_name, "counter_name": "c-1", "delta": -7}
    if token is not None:
        body["idempotency_token"] = token

    async def scenario() -> tuple[list[Any], ...]:
        sent = []
        for plain in (True, False):
            producer = BodyRecordingProducer()
            svc = CounterService(REGISTRY, producer=producer, signals=None, events=None, rollups=None,  # type: ignore[arg-type]
                                 cache=None, counters=None)  # type: ignore[arg-type]
            if plain:
                raw = orjson.dumps(body)
                result = (svc.write_plain_request(b"POST /v1/AddCount HTTP/1.1\r\nHost: api\r\nContent-Length: "
                                                  b"%d\r\n\r\n%s" % (len(raw), raw)) if whole
                          else svc.write_plain(raw))
                assert result is not None, "the plain body was not taken"
                answer = result[0]
            else:
                written, _ = svc.write_durable(REGISTRY[ns_name], "c-1", -7, MutationOp.ADD, token and token["token"],
                                               token and token.get("generation_time"))
                answer = add_json(written)
            noted = [(key, writes[1:-1]) for generation in svc.early._generations
                     for key, writes in generation.writes.items()]  # its offset and acknowledgement left out
            sent.append((producer.bodies, producer.marked, noted, answer))
            if plain and drew is not None:
                drew(*noted[0][1][:2])
        return tuple(sent)

    return asyncio.run(scenario())


@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The time and the new token both paths would draw, fixed."""
    if service_module.plain_add() is None:
        assert os.environ.get("COUNTER_TEST_PURE_PYTHON") == "1", "no C build: run `python -m query_api.plain_add`"
        pytest.skip("COUNTER_TEST_PURE_PYTHON=1: no C build on this machine")
    monkeypatch.setattr(service_module.time, "time_ns", lambda: NOW_NS)
    monkeypatch.setattr(service_module, "new_token", lambda: "0123456789abcdef0123456789abcdef")


@pytest.mark.parametrize("ns_name", ["my_dataset", "my_dataset_accurate"])
@pytest.mark.parametrize("token", TOKENS,
                         ids=["no token", "token and epoch µs", "token and ISO time", "token and epoch ms"])
def test_a_plain_add_is_sent_noted_and_answered_as_write_durable_does(fixed_clock: None, ns_name: str,
                                                                      token: dict[str, Any] | None) -> None:
    via_plain, via_durable = plain_and_durable(ns_name, token)
    assert via_plain == via_durable
    event_time = {None: NOW_NS // 1000, "retry-safe-1": 1_795_662_001_000_000, "retry-safe-2": 1_795_662_000_500_000,
                  "retry-safe-3": 1_795_662_000_250_000}[token and token["token"]]
    event_id = (token or {}).get("token", "0123456789abcdef0123456789abcdef")
    assert via_plain[2] == [(f"{ns_name}:c-1", [event_time, event_id, "", -7, False])]


def test_write_plain_refuses_a_time_admission_refuses_as_write_durable_does(fixed_clock: None) -> None:
    async def scenario() -> None:
        svc = CounterService(REGISTRY, producer=BodyRecordingProducer(), signals=None, events=None,  # type: ignore[arg-type]
                             rollups=None, cache=None, counters=None)  # type: ignore[arg-type]
        old = {"token": "t", "generation_time": "2026-01-01T00:00:00Z"}  # far outside the accept window
        with pytest.raises(Rejected) as via_plain:
            svc.write_plain(orjson.dumps({"namespace": "my_dataset", "counter_name": "c", "delta": 1,
                                          "idempotency_token": old}))
        with pytest.raises(Rejected) as via_durable:
            svc.write_durable(REGISTRY["my_dataset"], "c", 1, MutationOp.ADD, "t", old["generation_time"])
        assert (via_plain.value.field, str(via_plain.value)) == (via_durable.value.field, str(via_durable.value))
        assert svc.producer.bodies == []  # type: ignore[attr-defined]  # nothing sent

    asyncio.run(scenario())


def test_write_plain_declines_what_is_not_a_plain_add_of_a_plain_namespace(fixed_clock: None) -> None:
    async def scenario() -> list[Any]:
        svc = CounterService(REGISTRY, producer=RecordingProducer(), signals=None, events=None,  # type: ignore[arg-type]
                             rollups=None, cache=None, counters=None)  # type: ignore[arg-type]
        return [svc.write_plain(b'{"namespace": "%s", "counter_name": "c", "delta": 1%s}' % (ns, extra))
                for ns, extra in [(b"plays", b""),  # dimensions declared: the worker expands them
                                  (b"my_dataset", b', "idempotency_token": {"token": ""}'),  # the route names it
                                  (b"my_dataset", b', "idempotency_token": {"token": "t", "generation_time": "x"}'),
                                  (b"my_dataset", b', "idempotency_token": {"token": "caf\\u00e9"}'),  # an escape
                                  ]]

    assert asyncio.run(scenario()) == [None, None, None, None]


@pytest.mark.parametrize("ns_name", ["my_dataset", "my_dataset_accurate"])
def test_a_whole_plain_request_is_sent_noted_and_answered_as_write_durable_does(monkeypatch: pytest.MonkeyPatch,
                                                                                ns_name: str) -> None:
    """write_plain_request draws the time and token in C (`_plain_add.add_request`); with the clock and new_token
    fixed to what it drew, write_durable sends, notes and answers the same."""
    if service_module.plain_add() is None:
        assert os.environ.get("COUNTER_TEST_PURE_PYTHON") == "1", "no C build: run `python -m query_api.plain_add`"
        pytest.skip("COUNTER_TEST_PURE_PYTHON=1: no C build on this machine")

    def fix_clock(event_time: int, token: str) -> None:
        monkeypatch.setattr(service_module.time, "time_ns", lambda: event_time * 1000)
        monkeypatch.setattr(service_module, "new_token", lambda: token)

    via_plain, via_durable = plain_and_durable(ns_name, None, whole=True, drew=fix_clock)
    assert via_plain == via_durable
    assert via_plain[2][0][0] == f"{ns_name}:c-1" and via_plain[2][0][1][2:] == ["", -7, False]


def test_a_whole_plain_request_with_its_own_token_goes_through_write_plain(fixed_clock: None) -> None:
    async def scenario() -> tuple[Any, Any]:
        svc = CounterService(REGISTRY, producer=BodyRecordingProducer(), signals=None, events=None,  # type: ignore[arg-type]
                             rollups=None, cache=None, counters=None)  # type: ignore[arg-type]
        body = orjson.dumps({"namespace": "my_dataset", "counter_name": "c", "delta": 1,
                             "idempotency_token": {"token": "retry-safe-1", "generation_time": 1_795_662_000_250}})
        request = b"POST /v1/AddCount HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        whole = svc.write_plain_request(request)
        declined = svc.write_plain_request(request.replace(b"my_dataset", b"plays"))  # dimensions: not this path
        return whole and orjson.loads(whole[0]), declined

    answer, declined = asyncio.run(scenario())
    assert answer["idempotency_token"] == "retry-safe-1" and declined is None


def test_a_bad_token_is_named_before_a_refused_time_as_the_routes_model_names_it() -> None:
    """A 257-byte token with a 2024 generation_time: the fast path named the time, the route the token (review)."""
    from schemas import ValidationError

    with pytest.raises(ValidationError) as bad:
        svc = CounterService(REGISTRY, producer=None, signals=None, events=None, rollups=None,  # type: ignore[arg-type]
                             cache=None, counters=None)  # type: ignore[arg-type]
        svc.event_identity(REGISTRY["my_dataset"], "t" * 257, "2024-10-05T14:48:00Z")
    assert bad.value.field == "idempotency_token.token"


@pytest.mark.parametrize("shared", [False, True])
def test_a_process_sharing_the_pipeline_sends_every_write_and_notes_none(fixed_clock: None, shared: bool) -> None:
    """A shared process never counts early (CounterService.shared_pipeline), so noting its writes would be dead
    work on every write; a lone one notes each, whichever path takes it."""
    async def scenario() -> tuple[int, int]:
        producer = BodyRecordingProducer()
        svc = CounterService(REGISTRY, producer=producer, signals=None, events=None, rollups=None,  # type: ignore[arg-type]
                             cache=None, counters=None, shared_pipeline=shared)  # type: ignore[arg-type]
        raw = orjson.dumps({"namespace": "my_dataset", "counter_name": "c-1", "delta": 2})
        assert svc.write_plain(raw) is not None
        assert svc.write_plain_request(b"POST /v1/AddCount HTTP/1.1\r\nHost: api\r\nContent-Length: %d\r\n\r\n%s"
                                       % (len(raw), raw)) is not None
        svc.write_durable(REGISTRY["my_dataset"], "c-1", 2, MutationOp.ADD, None, None, then_count=True)
        sending = asyncio.ensure_future(svc.send_durably([svc.mutation(REGISTRY["my_dataset"], "c-1", 2,
                                                                       MutationOp.ADD, None, None)]))
        await asyncio.sleep(0)
        sending.cancel()
        noted = sum(len(writes[1:]) // 6 for generation in svc.early._generations
                    for writes in generation.writes.values())
        return len(producer.bodies), noted

    assert asyncio.run(scenario()) == (4, 0 if shared else 4)


@pytest.mark.parametrize("path, op", [("write_plain", MutationOp.ADD), ("write_plain_request", MutationOp.ADD),
                                      ("write_durable", MutationOp.ADD), ("write_durable", MutationOp.CLEAR)])
def test_a_token_without_a_generation_time_is_refused_on_every_path(fixed_clock: None, path: str,
                                                                    op: MutationOp) -> None:
    """A token alone was taken with the time it arrived: a retry 1.5 s later was a second event, counted twice.
    Every path refuses it naming the generation time, and sends nothing."""
    async def scenario() -> tuple[str, list[bytes]]:
        producer = BodyRecordingProducer()
        svc = CounterService(REGISTRY, producer=producer, signals=None, events=None, rollups=None,  # type: ignore[arg-type]
                             cache=None, counters=None)  # type: ignore[arg-type]
        body = orjson.dumps({"namespace": "my_dataset", "counter_name": "c", "delta": 1,
                             "idempotency_token": {"token": "dup1"}})
        with pytest.raises(Rejected) as refused:
            if path == "write_plain":
                svc.write_plain(body)
            elif path == "write_plain_request":
                svc.write_plain_request(b"POST /v1/AddCount HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
                                        % (len(body), body))
            else:
                svc.write_durable(REGISTRY["my_dataset"], "c", 1 if op is MutationOp.ADD else 0, op, "dup1", None)
        return refused.value.field, producer.bodies

    assert asyncio.run(scenario()) == ("idempotency_token.generation_time", [])


@pytest.mark.parametrize("into_ms_us", [0, 1, 456, 999])
def test_the_api_admits_no_time_ahead_that_the_worker_refuses_from_the_records_millisecond(
        monkeypatch: pytest.MonkeyPatch, into_ms_us: int) -> None:
    """A review: with max_clock_skew 0, AddCounts dated 0-4 ms ahead answered 200 and a third were dead-lettered,
    never counted. The API judged "ahead" against its clock in µs, the worker against the record's timestamp, in
    whole milliseconds rounded down: up to 999 µs earlier. Whatever the record's millisecond (its send comes after
    the API's judgement), a time the API admits the worker admits."""
    from control_plane import parse_namespaces
    from control_plane.admission import admission_error
    from schemas import ValidationError

    registry = parse_namespaces("namespaces:\n  tight: { counter_type: EVENTUAL, max_clock_skew: 0s, "
                                "accept_limit: 3s }\n")
    ns = registry["tight"]
    now_us = 1_795_662_001_123_000 + into_ms_us
    monkeypatch.setattr(service_module.time, "time_ns", lambda: now_us * 1000)
    svc = CounterService(registry, producer=None, signals=None, events=None, rollups=None,  # type: ignore[arg-type]
                         cache=None, counters=None)  # type: ignore[arg-type]
    admitted = []
    for ahead in range(0, 2_000, 7):
        try:
            svc.event_identity(ns, "tok", now_us + ahead)
        except (Rejected, ValidationError):
            continue
        admitted.append(now_us + ahead)
    record_ms = now_us // 1000 * 1000  # the earliest the record can be stamped: its millisecond, as Kafka keeps it
    assert admitted and record_ms + 999 - 7 < max(admitted) <= record_ms + 999  # the rest of the ms is admitted
    assert all(admission_error(t, record_ms, ns) is None for t in admitted)
