"""counter_cli.common.fail: the one way the CLI reports an error; the verbs' failures that must use it."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest
from confluent_kafka import KafkaError, KafkaException
from rich.console import Console

from control_plane import parse_namespaces
from counter_cli import common, dlq_cmd, recount_cmd
from counter_cli.main import build_parser
from schemas.dead_letter import DeadRecord


def test_fail_prints_the_message_unwrapped_and_unparsed_and_exits_with_the_code(monkeypatch, capsys):
    monkeypatch.setattr(common, "console", Console(stderr=True, width=40))
    path = "/tmp/" + "a-long-directory-name/" * 6 + "bad.jsonl"
    with pytest.raises(SystemExit) as exited:
        common.fail(f"{path}:2: field [delta] must be an integer", code=3)
    assert exited.value.code == 3
    err = capsys.readouterr().err
    assert err == f"error: {path}:2: field [delta] must be an integer\n"  # one line, brackets kept


# -- a broker that cannot be reached: one clear line and exit 1, never a traceback ---------------------------------

UNREACHABLE = KafkaException(KafkaError(KafkaError._TRANSPORT,
                                        "Failed to get metadata: Local: Broker transport failure"))


def _unreachable(*_args: object, **_kwargs: object) -> NoReturn:
    raise UNREACHABLE


def _cli(tmp_path, *argv: str) -> argparse.Namespace:
    (tmp_path / "rollups.sqlite3").touch()  # a store there: jobs refuse a directory without one
    return build_parser().parse_args([*argv, "--bootstrap", "127.0.0.1:1", "--data-dir", str(tmp_path)])


def _broker_error(capsys) -> str:
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err and "KafkaError{" not in err
    return err


def test_recount_without_a_broker_fails_with_a_clear_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(recount_cmd, "open_runtime", _unreachable)
    assert recount_cmd.run(_cli(tmp_path, "recount", "ns", "--all")) == 1
    assert ("error: Kafka at 127.0.0.1:1: Failed to get metadata: Local: Broker transport failure (is the broker "
            "running? `counter up` starts one)") in _broker_error(capsys)


@pytest.mark.parametrize("verb", ["list", "replay"])
def test_dlq_without_a_broker_fails_with_a_clear_message(tmp_path, monkeypatch, capsys, verb):
    monkeypatch.setattr(dlq_cmd, "read_dead_letters", _unreachable)
    args = _cli(tmp_path, "dlq", verb)
    with pytest.raises(SystemExit) as exited:
        args.run(args)
    assert exited.value.code == 1
    assert "error: Kafka at 127.0.0.1:1: Failed to get metadata" in _broker_error(capsys)


def test_dlq_replay_fails_clearly_when_the_broker_goes_away_while_resubmitting(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(dlq_cmd, "_read", lambda *_: [DeadRecord(0, 0, 1, b"k", b"{}", {})])
    registry = parse_namespaces({"namespaces": {"ns": {"counter_type": "EVENTUAL"}}})
    monkeypatch.setattr(dlq_cmd, "namespaces_or_exit", lambda settings: (None, registry))
    monkeypatch.setattr(dlq_cmd, "resubmit", _unreachable)
    with pytest.raises(SystemExit) as exited:
        dlq_cmd.run_replay(_cli(tmp_path, "dlq", "replay"))
    assert exited.value.code == 1 and "error: Kafka at 127.0.0.1:1" in _broker_error(capsys)


def test_dlq_list_limit_must_not_be_negative(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        dlq_cmd.run_list(_cli(tmp_path, "dlq", "list", "--limit", "-1"))
    assert exited.value.code == 2 and "error: --limit must be >= 0 (0 shows all)" in capsys.readouterr().err


def test_an_endpoints_file_that_outlived_its_counter_up_is_not_trusted(tmp_path, monkeypatch):
    """After a kill -9 of `counter up` its endpoints file stays: the other commands must not take its broker (from a
    review); the live supervisor's file is read as before."""
    import json
    import os
    import subprocess
    import sys

    from streams.settings import Settings

    settings = Settings(data_dir=tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for pid, trusted in ((gone.pid, False), (os.getpid(), True)):
        written = {"kafka_bootstrap": "127.0.0.1:9", "supervisor_pid": pid}
        settings.endpoints_path.write_text(json.dumps(written))
        assert common.read_endpoints(settings) == (written if trusted else {})


def test_dlq_list_summary_counts_dead_letters_by_reason_kind(tmp_path, monkeypatch, capsys):
    """The summary grouped reasons by their first 40 characters before a ':', so each rejected event time was a
    kind of its own, cut mid-number ("1 event_time 1728139680000000 is 67583448.", from a review)."""
    from schemas.dead_letter import REASON

    late = ("event_time 1728139680000000 is {}s before the record reached Kafka; namespace 'my_dataset' accepts at "
            "most accept_limit=5.0s")
    reasons = [late.format("67583448.125"), late.format("67583475.5"),
               "field 'dimensions.colour': namespace 'plays' does not declare dimension 'colour'",
               # admission's reasons as they now read (RFC 3339 times, long gaps in days)
               "event_time 2024-10-05T14:48:00.000000Z is 67584850.725s (782.2 days) before the record reached Kafka "
               "(2026-11-26T20:22:10.724700Z); namespace 'my_dataset' accepts at most accept_limit=5.0s",
               "event_time 2026-11-26T20:22:00Z is 10.5s before the record reached Kafka (2026-11-26T20:22:10.5Z); "
               "namespace 'my_dataset' accepts at most accept_limit=5.0s"]
    records = [DeadRecord(0, i, 1, b"k", b"{}", {REASON: reason}) for i, reason in enumerate(reasons)]
    monkeypatch.setattr(dlq_cmd, "_read", lambda *_: records)
    monkeypatch.setattr(dlq_cmd, "console", Console(stderr=True, width=400))
    assert dlq_cmd.run_list(_cli(tmp_path, "dlq", "list")) == 0
    err = capsys.readouterr().err
    assert ("5 dead letter(s) in counter-mutations-dlq matching (2 event_time N is Ns before the record reached "
            "Kafka, 2 event_time T is Ns before the record reached Kafka, 1 field 'dimensions.colour'); 0 already "
            "resubmitted") in err, err


def test_a_reason_kind_keeps_the_numbers_of_quoted_names() -> None:
    """'nope2' became 'nopeN', a namespace that does not exist, and '..._v2' and '..._v3' one kind (review)."""
    from counter_cli.dlq_cmd import reason_kind

    assert reason_kind("unknown namespace 'nope2'") == "unknown namespace 'nope2'"
    assert reason_kind("unknown namespace 'ns_v2'") != reason_kind("unknown namespace 'ns_v3'")
    assert reason_kind("event_time 2024-10-05T14:48:00.000000Z is 67583910.849s (782.2 days) before the record "
                       "reached Kafka (2026-11-26T20:06:30.849211Z); namespace 'my_dataset' accepts at most "
                       "accept_limit=5.0s") == "event_time T is Ns before the record reached Kafka"


def test_a_store_file_that_cannot_be_opened_is_one_clear_line_and_exit_1(tmp_path, monkeypatch, capsys):
    """`counter audit` on a data directory it cannot write (a read-only copy: SQLite keeps each file's WAL index beside
    it) ended in a traceback (a review); a store SQLite cannot open, here a directory in a file's place, stands in."""
    from counter_cli.main import main

    monkeypatch.setenv("COUNTER_NAMESPACES", str(Path(__file__).parents[1] / "data" / "api_namespaces.yaml"))
    (tmp_path / "events.sqlite3").mkdir()
    (tmp_path / "rollups.sqlite3").touch()
    with pytest.raises(SystemExit) as exited:
        main(["audit", "my_dataset", "c", "--data-dir", str(tmp_path)])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "the SQLite store in the data directory" in err, err
    assert "unable to open database file (the data directory must be writable" in err, err


def test_the_same_recount_twice_at_once_is_refused_naming_its_lock(tmp_path, monkeypatch, capsys):
    """Two identical recounts shared one progress file, and the first to end deleted it (a review)."""
    from jobs.recount import RecountOptions
    from jobs.state import exclusive, lock_beside

    monkeypatch.setattr(recount_cmd, "open_runtime", _unreachable)  # never reached: the lock comes first
    state = RecountOptions(namespace="ns", all=True).state_path(tmp_path)
    with exclusive(lock_beside(state)):
        assert recount_cmd.run(_cli(tmp_path, "recount", "ns", "--all")) == 2
    out = capsys.readouterr()
    assert "the same recount is running already" in out.out + out.err


def test_jobs_that_read_or_correct_a_store_refuse_a_directory_without_one(tmp_path, monkeypatch, capsys):
    """`counter audit` or `recount --data-dir <mistyped>` made an empty store there, read it, and exited 0 (a review);
    `produce --file` of a file that is not UTF-8, and `audit --output` into a missing directory, ended in a
    traceback."""
    from counter_cli.main import main

    monkeypatch.setenv("COUNTER_NAMESPACES", str(Path(__file__).parents[1] / "data" / "api_namespaces.yaml"))
    missing = tmp_path / "mistyped"
    for argv in (["audit", "my_dataset", "c", "--data-dir", str(missing)],
                 ["recount", "my_dataset", "--all", "--data-dir", str(missing), "--bootstrap", "127.0.0.1:1"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        assert f"error: no store in {missing} (no rollups.sqlite3; nothing was created)" in capsys.readouterr().err
        assert not missing.exists()

    (tmp_path / "rollups.sqlite3").touch()
    with pytest.raises(SystemExit) as exited:
        main(["audit", "my_dataset", "c", "--data-dir", str(tmp_path), "--output", str(missing / "x.jsonl")])
    assert exited.value.code == 2
    assert f"error: --output {missing / 'x.jsonl'}: No such file or directory" in capsys.readouterr().err

    lines = tmp_path / "writes.jsonl"
    lines.write_bytes(b'{"namespace": "my_dataset", "counter_name": "a", "delta": 1}\n\xff\xfe\n')
    with pytest.raises(SystemExit) as exited:
        main(["produce", "--file", str(lines), "--bootstrap", "127.0.0.1:1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {lines}: line 2 is not UTF-8" in err and "nothing was sent" in err and "Traceback" not in err


def test_output_cut_short_by_its_reader_ends_quietly() -> None:
    """A review: `counter recount --format jsonl | head` ended in a BrokenPipeError traceback. A verb whose reader
    leaves now exits 141 (128 + SIGPIPE, as a shell reports it) with nothing on stderr."""
    verb = ("import sys, counter_cli.main as m\n"
            "class Args:\n"
            "    def run(self, args):\n"
            "        for _ in range(200_000):\n"
            "            print('{\"counter\": \"c\", \"count\": 1}')\n"
            "m.build_parser = lambda: type('P', (), {'parse_args': lambda self, argv: Args()})()\n"
            "sys.exit(m.main([]))\n")
    child = subprocess.Popen([sys.executable, "-c", verb], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.readline()  # as `head -1`: one line, then gone
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=30) == 141 and err == "", err
