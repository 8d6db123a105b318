"""`jobs.dlq` and `counter dlq` with the producer faked: re-submission is known by the source mutation, not the DLQ
position (duplicates, positions a restarted broker reuses, progress files of the old format), and every
acknowledgement is recorded however long the broker takes."""

from __future__ import annotations

import json
import time

import pytest

import jobs.dlq as dlq
from counter_cli import dlq_cmd
from counter_cli.main import build_parser
from schemas import MICROS
from schemas.dead_letter import DeadLetter, DeadRecord, parse_headers

NOW_US = time.time_ns() // 1000


class FakeProducer:
    """Acknowledges everything at the first flush after `slow_flushes` flushes that time out (return the queue
    length); `never_settles` keeps every record queued."""

    produced: list[bytes] = []
    slow_flushes = 0
    never_settles = False

    def __init__(self, conf: dict) -> None:
        self.queue: list = []

    def produce(self, topic, key=None, value=None, on_delivery=None, partition=None, headers=None) -> None:
        FakeProducer.produced.append(value)
        self.queue.append(on_delivery)

    def flush(self, timeout: float) -> int:
        if FakeProducer.never_settles:
            return len(self.queue)
        if FakeProducer.slow_flushes:
            FakeProducer.slow_flushes -= 1
            return len(self.queue)
        for on_delivery in self.queue:
            on_delivery(None, None)
        self.queue = []
        return 0


@pytest.fixture(autouse=True)
def producer(monkeypatch):
    monkeypatch.setattr(dlq, "Producer", FakeProducer)
    monkeypatch.setattr(dlq, "partition_count", lambda bootstrap, topic, **_config: 1)
    monkeypatch.setattr(dlq, "_ends", lambda bootstrap, topic, partitions, security: {0: 0})
    monkeypatch.setattr(FakeProducer, "produced", [])
    monkeypatch.setattr(FakeProducer, "slow_flushes", 0)
    monkeypatch.setattr(FakeProducer, "never_settles", False)


def dead(counter: str = "c", *, source_offset: int = 42, dlq_offset: int = 0, source_us: int = NOW_US,
         dead_us: int = NOW_US, token: bool = False) -> DeadRecord:
    """A dead letter of an unknown namespace's mutation (token-less JSON unless `token`)."""
    mutation: dict = {"namespace": "newns", "counter_name": counter, "delta": 1}
    if token:
        mutation["idempotency_token"] = {"token": counter, "generation_time": source_us}
    key, value, headers = DeadLetter(b"newns:" + counter.encode(), json.dumps(mutation).encode(),
                                     "unknown namespace 'newns'", "counter-mutations", 0, source_offset,
                                     source_us).record()
    return DeadRecord(0, dlq_offset, dead_us, key, value, parse_headers(headers))


def test_the_identity_is_the_source_mutation_not_the_dlq_position():
    one, again = dead(dlq_offset=0), dead(dlq_offset=7)  # one source record dead-lettered twice
    assert one.identity == again.identity and one.position != again.position
    assert dead("other").identity != one.identity  # another mutation of the same batch record
    assert dead(source_us=NOW_US + 1).identity != one.identity  # a restarted broker's record at the same offset


def test_a_source_mutation_dead_lettered_twice_is_resubmitted_once(tmp_path):
    state = tmp_path / "dlq.json"
    result = dlq.resubmit("fake:9092", "counter-mutations", [dead(dlq_offset=0), dead(dlq_offset=1)], state=state)
    assert (result.done, result.errors, len(FakeProducer.produced)) == (1, [], 1)
    todo, already, duplicates = dlq.pending([dead(dlq_offset=0), dead(dlq_offset=1)], dlq.SentLog(state))
    assert (todo, already, duplicates) == ([], 1, 1)
    todo, already, duplicates = dlq.pending([dead(dlq_offset=0), dead(dlq_offset=1)], dlq.SentLog(state), force=True)
    assert (len(todo), already, duplicates) == (1, 0, 1)  # --force re-sends, still once


def fixed_cause(tmp_path, monkeypatch) -> None:
    """The namespace the dead letters of `dead` name, added: the cause fixed, as before a replay."""
    namespaces = tmp_path / "namespaces.yaml"
    namespaces.write_text("namespaces:\n  newns: { counter_type: EVENTUAL }\n")
    monkeypatch.setenv("COUNTER_NAMESPACES", str(namespaces))


def test_a_new_dead_letter_at_a_reused_dlq_position_is_resubmitted(tmp_path, monkeypatch):
    """The local broker keeps topics in memory: after a restart the DLQ's offsets start at 0 again."""
    fixed_cause(tmp_path, monkeypatch)
    args = build_parser().parse_args(["dlq", "replay", "--bootstrap", "fake:9092", "--data-dir", str(tmp_path)])
    for counter, source_offset in (("first", 10), ("second", 99)):
        monkeypatch.setattr(dlq_cmd, "_read", lambda a, s, b, t, c=counter, o=source_offset: [
            dead(c, source_offset=o, dlq_offset=0, token=True)])
        assert dlq_cmd.run_replay(args) == 0
    assert [json.loads(v)["counter_name"] for v in FakeProducer.produced] == ["first", "second"]


def test_a_dead_letter_whose_cause_is_still_there_is_left_out_saying_why(tmp_path, monkeypatch, capsys):
    """A review: a dead letter of a namespace still not configured was re-submitted, and dead-lettered again, with
    no word from the dry run. Now it is left out, named with the reason the namespaces give; fixed, it is sent."""
    monkeypatch.setenv("COUNTER_NAMESPACES", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text("namespaces:\n  other: { counter_type: EVENTUAL }\n")
    monkeypatch.setattr(dlq_cmd, "_read", lambda a, s, b, t: [dead("first", token=True)])
    for dry in (["--dry-run"], []):
        args = build_parser().parse_args(["dlq", "replay", "--bootstrap", "fake:9092", "--data-dir", str(tmp_path),
                                          *dry])
        assert dlq_cmd.run_replay(args) == 0
        said = " ".join("".join(capsys.readouterr()).split())
        assert ("1 dead letter(s) the namespaces still refuse (first: 0:0, field 'namespace': unknown namespace "
                "'newns'") in said and "would be dead-lettered again" in said, said
    assert FakeProducer.produced == []
    fixed_cause(tmp_path, monkeypatch)
    assert dlq_cmd.run_replay(build_parser().parse_args(["dlq", "replay", "--bootstrap", "fake:9092",
                                                         "--data-dir", str(tmp_path)])) == 0
    assert [json.loads(v)["counter_name"] for v in FakeProducer.produced] == ["first"]


def test_a_progress_file_keyed_by_dlq_position_still_marks_what_it_sent(tmp_path):
    """Version 1 files name DLQ positions: an entry marks the record there only if that record was dead-lettered
    before the entry was written (a later one took a reused position)."""
    state = tmp_path / "dlq.json"
    at = NOW_US - 60 * MICROS
    state.write_text(json.dumps({"resubmitted": {"0:0": {"at": dlq.iso(at), "to": "counter-mutations",
                                                         "reason": "unknown namespace 'newns'"}}}))
    sent = dlq.SentLog(state)
    old, new = dead(dead_us=at - MICROS), dead("new", dead_us=at + 5 * MICROS)
    assert old in sent and new not in sent
    result = dlq.resubmit("fake:9092", "counter-mutations", [old, new], state=state)
    assert result.done == 1 and [json.loads(v)["counter_name"] for v in FakeProducer.produced] == ["new"]
    saved = json.loads(state.read_text())
    assert saved["version"] == dlq.SENT_VERSION and list(saved["resubmitted"]) == [new.identity]
    assert "0:0" in saved["by_dlq_position"] and old in dlq.SentLog(state)


def test_records_acknowledged_after_a_slow_flush_are_all_recorded(tmp_path):
    state = tmp_path / "dlq.json"
    FakeProducer.slow_flushes = 1  # the first flush times out with the whole chunk still queued
    records = [dead(f"c{i}", dlq_offset=i) for i in range(dlq.CHUNK + 1)]  # two chunks
    result = dlq.resubmit("fake:9092", "counter-mutations", records, state=state)
    assert (result.done, result.errors) == (dlq.CHUNK + 1, [])
    assert all(r in dlq.SentLog(state) for r in records)


def test_records_never_acknowledged_are_an_error_and_the_run_stops(tmp_path, monkeypatch):
    monkeypatch.setattr(dlq, "SETTLE_S", 0)
    FakeProducer.never_settles = True
    records = [dead(f"c{i}", dlq_offset=i) for i in range(dlq.CHUNK + 1)]
    result = dlq.resubmit("fake:9092", "counter-mutations", records, state=tmp_path / "dlq.json")
    assert result.done == 0 and len(FakeProducer.produced) == dlq.CHUNK  # the second chunk is not sent
    assert result.errors == [f"{dlq.CHUNK} record(s) neither acknowledged nor failed after 0s: the next run first "
                             "looks for them in the topic, and re-sends those it does not find"]
    left = dlq.SentLog(tmp_path / "dlq.json")
    assert not left.entries and len(left.in_flight["entries"]) == dlq.CHUNK, "in flight, for the next run to find"


def test_a_dead_letter_is_refused_again_only_when_every_mutation_of_it_would_be(tmp_path) -> None:
    """A record the worker dead-lettered whole may hold mutations it would now count: re-sent, those count and the
    refused ones are dead-lettered again, alone. Left out only when none would count (a review)."""
    from control_plane import parse_namespaces

    registry = parse_namespaces("namespaces:\n  newns: { counter_type: EVENTUAL }\n")

    def record(*namespaces: str) -> DeadRecord:
        value = json.dumps([{"namespace": ns, "counter_name": "c", "delta": 1} for ns in namespaces]).encode()
        return DeadRecord(0, 0, NOW_US, None, value, {"dlq.reason": "record timestamp"})

    assert dlq.refusal(record("gone", "newns"), registry) is None
    assert dlq.refusal(record("gone", "gone2"), registry) == (
        "field 'namespace': unknown namespace 'gone' (configured: newns)")
    assert dlq.refusal(DeadRecord(0, 0, NOW_US, None, b"\xff", {}), registry) is None  # undecodable: the worker's


def item(index: int, *, dlq_offset: int = 0) -> DeadRecord:
    """One token-less item of a JSON array record, dead-lettered alone with its index (as the worker does)."""
    value = json.dumps({"namespace": "newns", "counter_name": "c", "delta": 2}).encode()
    key, value, headers = DeadLetter(b"newns:c", value, "unknown namespace 'newns'", "counter-mutations", 0, 42,
                                     NOW_US, index=index).record()
    return DeadRecord(0, dlq_offset, NOW_US, key, value, parse_headers(headers))


def test_equal_items_of_one_record_are_two_mutations_and_a_legacy_entry_still_marks_them(tmp_path):
    """A review: two equal token-less items of one JSON array (same counter, same delta) shared an identity, so
    `counter dlq replay` re-sent one and called the other a duplicate; the worker counts both (its identity of a
    token-less item holds the index). A second dead letter of the same item is still a duplicate."""
    first, second, again = item(3), item(4), item(3, dlq_offset=9)
    assert first.value == second.value and first.identity != second.identity and first.identity == again.identity
    todo, already, duplicates = dlq.pending([first, second, again], dlq.SentLog(tmp_path / "none.json"))
    assert todo == [first, second] and (already, duplicates) == (0, 1)

    legacy = tmp_path / "legacy.json"  # written by the version keying items without their index
    legacy.write_text(json.dumps({"version": dlq.SENT_VERSION, "resubmitted": {first.legacy_identity: {
        "at": "2026-11-27T00:00:00Z", "to": "counter-mutations", "reason": "?", "position": "0:0"}}}))
    todo, already, _ = dlq.pending([first, second], dlq.SentLog(legacy))
    assert todo == [] and already == 2  # never re-sent: one of them may have counted already
    assert dead().identity == dead().legacy_identity  # a dead letter from before dlq.index keeps its identity


def test_ctrl_c_before_anything_is_sent_says_so_and_exits_130(tmp_path, monkeypatch, capsys):
    """A review: Ctrl-C while `counter dlq replay` read the DLQ or checked the store ended in a KeyboardInterrupt
    traceback (killed by SIGINT) instead of a message."""
    fixed_cause(tmp_path, monkeypatch)
    args = build_parser().parse_args(["dlq", "replay", "--bootstrap", "fake:9092", "--data-dir", str(tmp_path)])

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(dlq_cmd, "read_dead_letters", interrupted)  # while reading the DLQ
    with pytest.raises(SystemExit) as exited:
        dlq_cmd.run_replay(args)
    assert exited.value.code == 130
    assert "interrupted while reading counter-mutations-dlq: nothing was sent" in " ".join(
        capsys.readouterr().err.split())

    monkeypatch.setattr(dlq_cmd, "_read", lambda a, s, b, t: [dead("first", token=True)])
    monkeypatch.setattr(dlq_cmd, "stored_originals", interrupted)  # while asking the store
    assert dlq_cmd.run_replay(args) == 130
    assert "interrupted before any dead letter was re-submitted: nothing was sent" in " ".join(
        capsys.readouterr().err.split())
    assert FakeProducer.produced == []
