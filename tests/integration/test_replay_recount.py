"""`counter replay`, `recount`, `audit` and `dlq` as a user runs them, against a real pipeline.

Real broker, real memcached, SQLite files, a real worker process; the verbs run as `python -m counter_cli.main`
subprocesses with the pipeline's COUNTER_* environment. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml

from producers import CounterProducer
from schemas import MAX_EVENT_TIME, Mutation, MutationOp
from sinks import Partitioning, SqliteEventStore, SqliteRollupStore, open_cache
from tests.helpers import Sync, make_topic, read_all, wait_for
from tests.pipeline_harness import NAMESPACES, Event, PipelineEnv, oracle

pytestmark = pytest.mark.integration

NS = "my_dataset"
COUNTER = [sys.executable, "-m", "counter_cli.main"]


def cli(env: PipelineEnv, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([*COUNTER, *args], env=_env(env), capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, f"counter {' '.join(args)} -> {result.returncode}\n{result.stderr}"
    return result


def _env(env: PipelineEnv) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("COUNTER_")}
    return {**base, **env.env(), "COLUMNS": "200"}


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def now_us() -> int:
    return time.time_ns() // 1000


def events_now(rng: random.Random, counters: int, n: int, clear_ratio: float = 0.0, prefix: str = "c") -> list[Event]:
    out = []
    for i in range(n):
        counter = f"{prefix}{rng.randrange(counters)}"
        if rng.random() < clear_ratio:
            out.append(Event(counter, now_us() + i, f"clr-{i}-{rng.random()}", 0, True))
        else:
            out.append(Event(counter, now_us() + i, f"tok-{i}-{rng.random()}", rng.randint(-20, 100)))
    return out


def as_mutation(e: Event, ns: str = NS) -> Mutation:
    return Mutation(ns, e.counter, e.delta, e.event_time, e.token, "", MutationOp.CLEAR if e.clear else MutationOp.ADD)


def produce(env: PipelineEnv, events: list[Event], *, topic: str | None = None, batch_size: int = 1,
            ns: str = NS) -> None:
    with CounterProducer(env.bootstrap, topic=topic or env.mutations_topic, batch_size=batch_size) as producer:
        for e in events:
            producer.send(as_mutation(e, ns))


def converge(env: PipelineEnv, expected: dict[str, int], timeout: float = 45) -> None:
    wait_for(lambda: env.converged(NS, expected), timeout,
             message=lambda: f"convergence; mismatches {env.mismatches(NS, expected)}")


def counts(env: PipelineEnv, counters) -> dict[str, int | None]:
    states = env.rollups([(NS, c) for c in counters])
    return {c: (s.count if (s := states.get((NS, c))) else None) for c in counters}


def event_rows(env: PipelineEnv) -> list[tuple]:
    """Every stored event row of the pipeline's event store (all slice tables)."""
    with sqlite3.connect(env.data_dir / "events.sqlite3") as conn:
        tables = [t for (t,) in conn.execute("SELECT table_name FROM event_slices")]
        rows = []
        for t in tables:
            rows += conn.execute(
                f'SELECT namespace, counter, event_time, event_id, delta, is_clear FROM "{t}"').fetchall()
    return rows


def delete_events(env: PipelineEnv, tokens: set[str]) -> int:
    with sqlite3.connect(env.data_dir / "events.sqlite3") as conn:
        tables = [t for (t,) in conn.execute("SELECT table_name FROM event_slices")]
        deleted = 0
        for t in tables:
            for token in tokens:
                deleted += conn.execute(f'DELETE FROM "{t}" WHERE event_id = ?', (token,)).rowcount
    return deleted


def delete_rollups(env: PipelineEnv, namespace: str) -> int:
    async def run() -> int:
        store = SqliteRollupStore(env.data_dir / "rollups.sqlite3")
        try:
            return await store.delete(namespace)
        finally:
            await store.close()
    return asyncio.run(run())


def stored_total(env: PipelineEnv, namespace: str, counter: str) -> int:
    """The counter's value over every stored event (what an ACCURATE read converges to)."""
    async def run() -> int:
        store = SqliteEventStore(env.data_dir / "events.sqlite3", lambda ns: Partitioning(4, 10, 60))
        try:
            agg = await store.aggregate(namespace, counter, 0, MAX_EVENT_TIME)
            return agg.delta
        finally:
            await store.close()
    return asyncio.run(run())


def test_recount_restores_deleted_rollups_after_dry_run_reports_the_drift(pipeline):
    worker = pipeline.start_worker()
    events = events_now(random.Random(3), 25, 600, clear_ratio=0.05)
    produce(pipeline, events, batch_size=20)
    expected = oracle(events)
    converge(pipeline, expected)
    # Stopped, so no rollup signal still queued for it can repair a row behind the test's back; the recount
    # works from the persist watermarks the worker stored (they stay valid: everything before them is stored).
    worker.stop()
    assert delete_rollups(pipeline, NS) == len(expected)

    dry = cli(pipeline, "recount", NS, "--all", "--dry-run", "--format", "jsonl")
    report = {r["counter"]: r for r in jsonl(dry.stdout)}
    assert set(report) == set(expected)
    for c, n in expected.items():
        r = report[c]
        assert (r["status"], r["stored"], r["recomputed"], r["drift"], r["action"]) == ("missing", None, n, -n,
                                                                                        "dry-run"), r
    assert "dry run: nothing written" in dry.stderr
    assert counts(pipeline, expected) == dict.fromkeys(expected)  # nothing written

    fixed = cli(pipeline, "recount", NS, "--all")
    assert f"recounted {len(expected)} counters in" in fixed.stderr, fixed.stderr
    converge(pipeline, expected, timeout=5)
    cache = Sync(open_cache(f"memcached://{pipeline.memcached}", key_prefix=pipeline.cache_prefix()))
    try:
        states = pipeline.rollups([(NS, c) for c in expected])
        for c, n in expected.items():
            assert cache.get(NS, c) == (n, states[(NS, c)].rollup_ts)
    finally:
        cache.close()

    again = cli(pipeline, "recount", NS, "--all", "--dry-run", "--format", "jsonl")
    assert {r["status"] for r in jsonl(again.stdout)} == {"ok"}
    assert all(r["drift"] == 0 for r in jsonl(again.stdout))


def test_replaying_the_whole_topic_three_times_changes_no_count(pipeline):
    pipeline.start_worker()
    rng = random.Random(5)
    events = events_now(rng, 20, 400, clear_ratio=0.03)
    produce(pipeline, events[:200])
    produce(pipeline, events[200:], batch_size=25)
    # Token-less JSON records: their Kafka position is their identity, stable across replays of the topic.
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": pipeline.bootstrap})
    for _ in range(30):
        plain.produce(pipeline.mutations_topic, json.dumps({"namespace": NS, "counter_name": "json", "delta": 3}),
                      key=f"{NS}:json".encode())
    assert plain.flush(20) == 0
    expected = {**oracle(events), "json": 90}
    converge(pipeline, expected)
    rows_before = sorted(event_rows(pipeline))

    for _ in range(3):
        out = cli(pipeline, "replay", "--from", "earliest", "--restart", "--json")
        (summary,) = jsonl(out.stdout)
        assert summary["finished"] and summary["new_events"] == 0 and summary["recounted"] == 0, summary
        assert summary["records"] >= 200 + 30 and summary["events"] == 400 + 30, summary
    assert sorted(event_rows(pipeline)) == rows_before
    converge(pipeline, expected, timeout=10)  # re-signalled and rolled up again: still exact

    # The same replay run again continues after its end: nothing new to read.
    out = cli(pipeline, "replay", "--json")
    (summary,) = jsonl(out.stdout)
    assert summary["events"] == 0 and summary["finished"], summary
    # Once it finished, --from, or other options, start a new replay (a review: --from was ignored, and other
    # options were refused as a replay to "resume")
    for extra in ([], ["--namespace", NS]):
        out = cli(pipeline, "replay", "--from", "earliest", *extra, "--json")
        (summary,) = jsonl(out.stdout)
        assert summary["finished"] and summary["events"] == 400 + 30 and summary["new_events"] == 0, summary


def test_events_deleted_from_the_store_are_restored_by_a_replay_from_earliest(pipeline):
    pipeline.start_worker()
    rng = random.Random(9)
    events = events_now(rng, 15, 500, clear_ratio=0.02)
    produce(pipeline, events, batch_size=10)
    expected = oracle(events)
    converge(pipeline, expected)

    adds = [e for e in events if not e.clear]
    lost = {e.token for e in rng.sample(adds, 120)}
    assert delete_events(pipeline, lost) == 120
    # A recount now believes the damaged store: counts become wrong (the events are really gone).
    cli(pipeline, "recount", NS, "--all")
    damaged = counts(pipeline, expected)
    assert damaged != expected

    out = cli(pipeline, "replay", "--from", "earliest", "--json")
    (summary,) = jsonl(out.stdout)
    assert summary["new_events"] == 120 and summary["restored_late_events"] == 120, summary
    assert summary["recounted"] >= 1 and not summary["recount_pending"], summary
    converge(pipeline, expected, timeout=15)
    assert len(event_rows(pipeline)) == len({(e.counter, e.event_time, e.token) for e in events})


def test_audit_sums_to_the_count_and_lists_clears_in_order(pipeline):
    pipeline.start_worker()
    t0 = now_us()
    evs = [Event("aud", t0 + 1000, "a1", 5), Event("aud", t0 + 2000, "a2", 7), Event("aud", t0 + 3000, "clr1", 0, True),
           Event("aud", t0 + 3000, "a3-tied", 100),  # same time as the clear: the clear wins the tie
           Event("aud", t0 + 4000, "a4", -2), Event("aud", t0 + 5000, "a5", 11),
           Event("aud", t0 + 6000, "clr2", 0, True), Event("aud", t0 + 7000, "a6", 4), Event("aud", t0 + 8000, "a7", 3)]
    produce(pipeline, list(reversed(evs)))  # order of arrival must not matter
    expected = oracle(evs)
    assert expected == {"aud": 7}
    converge(pipeline, expected)

    out = cli(pipeline, "audit", NS, "aud")
    rows = jsonl(out.stdout)
    assert [r["token"] for r in rows] == ["a1", "a2", "clr1", "a3-tied", "a4", "a5", "clr2", "a6", "a7"]
    assert [r["event_time_us"] for r in rows] == sorted(r["event_time_us"] for r in rows)
    assert [r["running_total"] for r in rows] == [5, 12, 0, 0, -2, 9, 0, 4, 7]
    assert [r["op"] for r in rows if r["op"] == "clear"] == ["clear", "clear"]
    assert next(r for r in rows if r["token"] == "a3-tied")["counted"] is False
    last_clear = max(i for i, r in enumerate(rows) if r["op"] == "clear")
    assert sum(r["delta"] for r in rows[last_clear + 1:] if r["counted"]) == rows[-1]["running_total"] == 7
    assert "matches" in out.stderr

    as_csv = cli(pipeline, "audit", NS, "aud", "--format", "csv")
    table = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [int(r["running_total"]) for r in table] == [5, 12, 0, 0, -2, 9, 0, 4, 7]
    assert table[2]["op"] == "clear" and table[3]["counted"] == "false"

    # A window: the running total starts at the count before --from, so it is still the real count.
    window = jsonl(cli(pipeline, "audit", NS, "aud", "--from", str(t0 + 4000), "--to", str(t0 + 7000)).stdout)
    assert [r["token"] for r in window] == ["a4", "a5", "clr2", "a6"]
    assert [r["running_total"] for r in window] == [-2, 9, 0, 4]

    # Resume: an export cut after some rows continues where it stopped.
    path = pipeline.data_dir / "audit.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows[:4]) + "\n" + '{"torn')
    cli(pipeline, "audit", NS, "aud", "--output", str(path), "--resume")
    assert [r["token"] for r in jsonl(path.read_text())] == [r["token"] for r in rows]
    assert jsonl(path.read_text())[-1]["running_total"] == 7


# The fix needs a worker restart; short group timeouts let its successor take the partitions over quickly.
FAST_GROUP = {"COUNTER_GROUP_SESSION_TIMEOUT_S": "2", "COUNTER_GROUP_REBALANCE_TIMEOUT_S": "1"}


def add_namespaces(pipeline: PipelineEnv, worker, tmp_path, added: dict[str, dict]) -> None:
    """The fix of an unknown namespace's dead letters: the namespaces added to the file, the worker restarted on it
    (and the CLI pointed at it)."""
    config = yaml.safe_load(NAMESPACES.read_text())
    config["namespaces"].update(added)
    fixed_file = tmp_path / "namespaces.yaml"
    fixed_file.write_text(yaml.safe_dump(config))
    worker.stop()
    pipeline.namespaces = fixed_file
    pipeline.stack.start_worker(COUNTER_NAMESPACES=str(fixed_file), **FAST_GROUP)


def test_a_dead_letter_resubmitted_after_its_cause_is_fixed_is_counted_once(pipeline, tmp_path):
    worker = pipeline.stack.start_worker(**FAST_GROUP)
    late_ns = "added_later"
    rng = random.Random(13)
    tokened = events_now(rng, 3, 40, prefix="t")
    produce(pipeline, tokened, ns=late_ns, batch_size=8)  # batch records: each rejected mutation on its own
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": pipeline.bootstrap})
    for _ in range(5):  # token-less JSON: identity = its (new) Kafka position
        plain.produce(pipeline.mutations_topic, json.dumps({"namespace": late_ns, "counter_name": "json", "delta": 2}),
                      key=f"{late_ns}:json".encode())
    # token-less items of a JSON array, in a namespace added later with a short accept_limit (a review: each was
    # dead-lettered with its record's time as its identity, and refused again when re-sent after accept_limit)
    short_ns = "added_later_short"
    plain.produce(pipeline.mutations_topic, json.dumps([{"namespace": short_ns, "counter_name": "arr", "delta": d}
                                                        for d in (1, 2, 4)]))
    assert plain.flush(20) == 0
    produced = time.monotonic()

    def listed():
        out = cli(pipeline, "dlq", "list", "--format", "jsonl")
        rows = jsonl(out.stdout)
        return rows if len(rows) >= 48 else None

    dead = wait_for(listed, 30, interval=0.5, message="48 dead letters")
    assert len(dead) == 48 and all("unknown namespace 'added_later" in r["reason"] for r in dead)
    assert all(r["source_topic"] == pipeline.mutations_topic and r["source_offset"] is not None for r in dead)
    table = cli(pipeline, "dlq", "list", "--reason", "unknown namespace").stdout
    assert len(table.splitlines()) == 48 and "added_later:json +2 token=(no token)" in table
    assert "added_later_short:arr +4 token=(no token)" in table, table

    # The fix: the namespaces are added (accept_limit long enough for the tokened events' age; the array's items'
    # shorter than their age at the replay) and workers restart.
    add_namespaces(pipeline, worker, tmp_path, {late_ns: {"counter_type": "EVENTUAL", "accept_limit": "1h"},
                                                 short_ns: {"counter_type": "EVENTUAL", "accept_limit": "2s"}})
    wait_for(lambda: time.monotonic() > produced + 3, 10, message="the array's items older than accept_limit")

    first = cli(pipeline, "dlq", "replay", "--reason", "unknown namespace")
    assert "re-submitted 48 dead letter(s)" in first.stderr, first.stderr
    expected = {**oracle(tokened), "json": 10}
    wait_for(lambda: all(stored_total(pipeline, late_ns, c) == n for c, n in expected.items())
             and stored_total(pipeline, short_ns, "arr") == 7, 30,
             message=lambda: f"{ {c: stored_total(pipeline, late_ns, c) for c in expected} } != {expected}, "
                             f"arr {stored_total(pipeline, short_ns, 'arr')} != 7")

    def records_of_late_ns() -> int:
        return sum(late_ns.encode() in r.value for r in read_all(pipeline.bootstrap, pipeline.mutations_topic))

    before = records_of_late_ns()
    second = cli(pipeline, "dlq", "replay", "--reason", "unknown namespace")
    assert "re-submitted 0 dead letter(s)" in second.stderr and "48 skipped" in second.stderr, second.stderr
    assert "[resubmitted]" in cli(pipeline, "dlq", "list").stdout
    assert records_of_late_ns() == before  # the second run re-sent nothing
    assert {c: stored_total(pipeline, late_ns, c) for c in expected} == expected
    audit = jsonl(cli(pipeline, "audit", late_ns, "json").stdout)
    assert len(audit) == 5 and audit[-1]["running_total"] == 10
    # The README's next step for the tokened ones: a replay of the source records. It stores them (they are older
    # than accept_limit for a re-sent copy) and leaves out the token-less ones re-sent above: a review counted
    # those twice (30 became 65).
    replayed = cli(pipeline, "replay", "--from", "earliest", "--name", "after-dlq")
    assert "left out 8 token-less mutation(s) `counter dlq replay` re-sent" in replayed.stderr, replayed.stderr
    assert {c: stored_total(pipeline, late_ns, c) for c in expected} == expected
    assert stored_total(pipeline, short_ns, "arr") == 7


def test_a_replay_then_a_dlq_replay_counts_a_token_less_dead_letter_once(pipeline, tmp_path):
    """The other order: `counter replay` stores a dead-lettered token-less record as its source's event once its
    namespace is known, and `counter dlq replay` then leaves its dead letter out (re-sent, it would count again)."""
    worker = pipeline.stack.start_worker(**FAST_GROUP)
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": pipeline.bootstrap})
    for _ in range(3):
        plain.produce(pipeline.mutations_topic, json.dumps({"namespace": "later", "counter_name": "j", "delta": 10}))
    plain.produce(pipeline.mutations_topic, json.dumps([{"namespace": "later", "counter_name": "a", "delta": 1},
                                                        {"namespace": NS, "counter_name": "a", "delta": 1}]))
    assert plain.flush(20) == 0
    wait_for(lambda: len(jsonl(cli(pipeline, "dlq", "list", "--format", "jsonl").stdout)) >= 4, 30, interval=0.5,
             message="four dead letters")
    add_namespaces(pipeline, worker, tmp_path, {"later": {"counter_type": "EVENTUAL", "accept_limit": "1h"}})
    cli(pipeline, "replay", "--from", "earliest")
    assert (stored_total(pipeline, "later", "j"), stored_total(pipeline, "later", "a")) == (30, 1)
    resent = cli(pipeline, "dlq", "replay")
    assert "4 token-less dead letter(s) are counted already" in resent.stdout + resent.stderr, resent.stderr
    assert "re-submitted 0 dead letter(s)" in resent.stderr, resent.stderr
    assert (stored_total(pipeline, "later", "j"), stored_total(pipeline, "later", "a")) == (30, 1)


def dead_letters_then_dry_run(pipeline, letters: list, said: str) -> str:
    """Produce the dead letters to the DLQ as the worker does; `counter dlq replay --dry-run`'s messages once they
    say `said` (the DLQ read to its end)."""
    from confluent_kafka import Producer

    dlq = Producer({"bootstrap.servers": pipeline.bootstrap, "message.max.bytes": 1 << 20})
    for key, value, headers in (d.record() for d in letters):
        dlq.produce(pipeline.dlq_topic, value, key, headers=headers)
    assert dlq.flush(20) == 0

    def dry_run() -> str | None:
        out = cli(pipeline, "dlq", "replay", "--dry-run").stderr
        return out if said in out else None

    return wait_for(dry_run, 30, interval=0.5, message=f"the dry run to say {said!r}")


def test_a_dead_letter_cut_to_fit_the_dlq_is_not_resubmitted(pipeline):
    """A bad record too large for a DLQ record next to its headers is dead-lettered with only the start of its value
    (`dlq.truncated`, schemas.dead_letter). Re-submitting that start would only dead-letter it again as
    undecodable: `counter dlq replay` leaves it out and says where the whole record is."""
    from schemas.dead_letter import DeadLetter

    whole = b'{"namespace": "my_dataset", "counter_name": "c", "delta": "' + b"9" * 1_100_000 + b'"}'
    cut = DeadLetter(None, whole, "field 'delta': not an integer", pipeline.mutations_topic, 3, 42, now_us())
    fine = DeadLetter(None, b"{}", "field 'namespace': missing", pipeline.mutations_topic, 3, 43, now_us())
    out = dead_letters_then_dry_run(pipeline, [cut, fine], "would re-submit 1 ")
    assert "1 dead letter(s) too large for the DLQ" in out and f"{pipeline.mutations_topic}[3]@42" in out, out


def test_a_dead_letter_holding_its_whole_batch_record_is_not_resubmitted(pipeline):
    """A rejected mutation that cannot be encoded alone is dead-lettered as its whole batch record (marked
    `dlq.whole_record`): its neighbours were counted, so `counter dlq replay` leaves it out and says why."""
    from schemas.dead_letter import DeadLetter

    record = b'[{"namespace": "my_dataset", "counter_name": "c", "delta": 1}, {"namespace": "my_dataset"}]'
    whole = DeadLetter(None, record, "no time", pipeline.mutations_topic, 2, 77, now_us(), whole_record_of=1)
    fine = DeadLetter(None, b"{}", "field 'namespace': missing", pipeline.mutations_topic, 2, 78, now_us())
    out = dead_letters_then_dry_run(pipeline, [whole, fine], "hold the whole batch record")
    assert f"mutation 1 of the record at {pipeline.mutations_topic}[2]@77" in out, out


def test_a_dead_letter_without_a_mutation_is_not_resubmitted(pipeline):
    """A heartbeat refused for its timestamp (agents.persist) is dead-lettered with its empty value. Re-sent, it
    would be an empty record without the heartbeat header, dead-lettered again: `counter dlq replay` leaves it out."""
    from schemas.dead_letter import DeadLetter

    heartbeat = DeadLetter(None, b"", "heartbeat (header counter.heartbeat) stamped 1 ms ahead: not taken as a "
                           "heartbeat", pipeline.mutations_topic, 1, 5, now_us())
    fine = DeadLetter(None, b"{}", "field 'namespace': missing", pipeline.mutations_topic, 1, 6, now_us())
    out = dead_letters_then_dry_run(pipeline, [heartbeat, fine], "would re-submit 1 ")
    assert "1 dead letter(s) carry no mutation (first: " in out, out
    assert f"from {pipeline.mutations_topic}[1]@5: heartbeat (header counter.heartbeat)" in out, out


def test_an_interrupted_replay_resumes_and_ends_exact(pipeline):
    pipeline.start_worker()
    backup = f"{pipeline.prefix}-restored"
    make_topic(pipeline.bootstrap, backup, partitions=4)
    rng = random.Random(17)
    events: list[Event] = []
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": pipeline.bootstrap})
    for p in range(4):  # rejected by the first run: the resumed summary still tells them by kind (a review: "()")
        plain.produce(backup, json.dumps({"namespace": "nope", "counter_name": "x", "delta": 1}), partition=p)
    assert plain.flush(20) == 0
    with CounterProducer(pipeline.bootstrap, topic=backup) as producer:  # 20k small records, current times
        for i in range(20_000):
            e = Event(f"r{rng.randrange(150)}", now_us(), f"bk-{i}", rng.randint(-5, 20))
            events.append(e)
            producer.send(as_mutation(e))
    expected = oracle(events)
    state_file = pipeline.data_dir / "replay" / "restore.json"
    args = ["replay", "--topic", backup, "--from", "earliest", "--name", "restore", "--batch-size", "250", "--json"]
    proc = subprocess.Popen([*COUNTER, *args], env=_env(pipeline), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        def progressed() -> bool:
            state = json.loads(state_file.read_text()) if state_file.exists() else {}
            totals = state.get("totals", {})
            return (totals.get("records", 0) >= 2_000 and totals.get("rejected", 0) >= 4) or proc.poll() is not None

        wait_for(progressed, 60, interval=0.02, message="replay progress")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted at" in err and "run the same command again to resume" in err
    (partial,) = jsonl(out)
    assert not partial["finished"] and 0 < partial["records"] < 20_004, partial
    assert partial["rejected_by_kind"] == {"unknown_namespace": 4}, partial

    done = cli(pipeline, *args)
    (summary,) = jsonl(done.stdout)
    assert summary["finished"] and summary["records"] == 20_004, summary
    assert summary["events"] == 20_000 and summary["rejected"] == 4, summary
    assert summary["rejected_by_kind"] == {"unknown_namespace": 4}, summary
    assert "resuming" in done.stderr
    converge(pipeline, expected, timeout=30)


def test_a_recount_after_retention_dropped_older_events_keeps_the_count(pipeline, tmp_path):
    """A review: once the worker's retention had dropped a counter's older events, `counter recount --all` (the
    README's fix-everything, and what `counter audit` advised) recomputed the total from the events still stored:
    110 became 10. It now takes the stored count as of where retention may have deleted events, and checks after."""
    config = yaml.safe_load(NAMESPACES.read_text())
    config["namespaces"]["short"] = {
        "counter_type": "EVENTUAL", "accept_limit": "1s",
        "time_partition": {"buckets_per_id": 1, "seconds_per_bucket": 1, "seconds_per_slice": 2},
        "retention": {"close_after": "2s", "delete_after": "4s"},
        "windows": {"granularities": []}}  # a delete_after under a minute needs no minute buckets (schema)
    short_file = tmp_path / "namespaces.yaml"
    short_file.write_text(yaml.safe_dump(config))
    pipeline.namespaces = short_file  # the worker's and the CLI's
    pipeline.stack.env["COUNTER_NAMESPACES"] = str(short_file)
    pipeline.stack.start_worker(COUNTER_RETENTION_INTERVAL_S="1")
    first = [Event("r", now_us() + i, f"old-{i}", 1) for i in range(100)]
    produce(pipeline, [*first], ns="short")

    def total(counter: str) -> int | None:
        state = pipeline.rollups([("short", counter)]).get(("short", counter))
        return None if state is None or state.rollup_ts < state.last_write_ts else state.count

    wait_for(lambda: total("r") == 100, 45, message=lambda: f"100 counted, have {total('r')}")
    # a slice is dropped once past delete_after and rolled past: the next writes move the rollup beyond it
    wait_for(lambda: now_us() > first[-1].event_time + 7_000_000, 20, message="the first events past delete_after")
    produce(pipeline, [Event("r", now_us() + i, f"new-{i}", 1) for i in range(10)], ns="short")
    wait_for(lambda: total("r") == 110, 45, message=lambda: f"110 counted, have {total('r')}")
    wait_for(lambda: not any(row[3].startswith("old-") for row in event_rows(pipeline)), 60,
             message="retention dropping the first events")
    recounted = cli(pipeline, "recount", "short", "--all")
    assert "1 ok, 0 drifted" in recounted.stderr, recounted.stderr
    # --all finds counters by their events: it says so, as a counter whose events were all deleted is not listed
    assert "retention deleted events up to" in recounted.stderr and "is not listed" in recounted.stderr, \
        recounted.stderr
    assert total("r") == 110
    audited = cli(pipeline, "audit", "short", "r", "--format", "csv", check=False)  # it said DIFFERS, exit 1
    assert audited.returncode == 0 and "not compared: retention deleted the events before" in audited.stderr, \
        audited.stderr
