"""`counter produce` refuses, before sending anything, the writes the pipeline would dead-letter (from a review: an
unknown or BEST_EFFORT namespace, an undeclared dimension and the README's own 2024 generation time were produced,
exit 0, and dead-lettered)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from counter_cli import common, produce_cmd
from counter_cli.main import build_parser
from tests.helpers import RecordingProducer as Recorder


@pytest.fixture(autouse=True)
def recorder(monkeypatch):
    Recorder.reset()
    monkeypatch.setattr(produce_cmd, "CounterProducer", Recorder)
    monkeypatch.setattr(common, "console", Console(stderr=True, width=1000))
    monkeypatch.delenv("COUNTER_NAMESPACES", raising=False)  # the shipped example


def produce(*argv: str) -> int:
    args = build_parser().parse_args(["produce", *argv, "--bootstrap", "127.0.0.1:9"])
    return int(args.run(args))


@pytest.mark.parametrize("argv, says", [
    (["nope", "x", "1"], "error: NAMESPACE: unknown namespace 'nope'"),
    (["my_dataset_best_effort", "x", "1"], "error: NAMESPACE: namespace 'my_dataset_best_effort' is BEST_EFFORT"),
    (["plays", "t", "1", "--dimension", "colour=red"], "error: --dimension colour: "),
    (["my_dataset", "c", "2", "--token", "some_event_id", "--generation-time", "2024-10-05T14:48:00Z"],
     "error: --generation-time: event_time 2024-10-05T14:48:00"),
    (["my_dataset", "c", "2", "--generation-time", "2099-01-01T00:00:00Z"], "max_clock_skew"),
    (["my_dataset", "c", "1", "--item", "u1"], "error: --item: "),
    (["visitors", "home", "2", "--item", "u1"], "error: DELTA: must be 1 or absent"),
    (["visitors", "home", "--item", "u1", "--item-key", "k"], "error: --item-key: "),
])
def test_a_write_the_pipeline_would_dead_letter_is_refused_naming_the_argument(argv, says, capsys):
    with pytest.raises(SystemExit) as exited:
        produce(*argv)
    assert exited.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert says in err and "(the pipeline would dead-letter this write)" in err, err
    assert Recorder.sent == []


@pytest.mark.parametrize("argv", [
    ["my_dataset", "c", "2"], ["plays", "t", "1", "--dimension", "country=US"], ["visitors", "home", "--item", "u1"],
    ["my_dataset", "c", "--clear"],
    # the --help example (`"$(date -u +%FT%TZ)"` is now)
    ["my_dataset", "counter123", "-1", "--token", "evt-42", "--generation-time", "now-placeholder"],
])
def test_writes_the_pipeline_accepts_are_produced(argv, capsys):
    from datetime import UTC, datetime

    argv = [datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if a == "now-placeholder" else a for a in argv]
    args = build_parser().parse_args(["produce", "--bootstrap", "127.0.0.1:9", *argv])
    assert args.run(args) == 0
    assert len(Recorder.sent) == 1


def test_a_file_with_lines_the_pipeline_would_dead_letter_sends_nothing_and_names_them(tmp_path: Path, capsys):
    """As for a malformed line (the existing behaviour): every bad line is listed by number and none is sent."""
    lines = [
        {"namespace": "my_dataset", "counter_name": "ok", "delta": 1},
        {"namespace": "nope", "counter_name": "x", "delta": 1},
        {"namespace": "plays", "counter_name": "t", "delta": 1, "dimensions": {"colour": "red"}},
        {"namespace": "my_dataset", "counter_name": "c", "delta": 2,
         "idempotency_token": {"token": "some_event_id", "generation_time": "2024-10-05T14:48:00Z"}},
        {"namespace": "my_dataset_best_effort", "counter_name": "x", "delta": 1},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    with pytest.raises(SystemExit) as exited:
        produce("--file", str(path))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "4 invalid line(s) (malformed, or the pipeline would dead-letter them), nothing was sent" in err
    assert f"{path}:2: field 'namespace': unknown namespace 'nope'" in err
    assert f"{path}:3: field 'dimensions.colour': " in err
    assert f"{path}:4: field 'idempotency_token.generation_time': event_time 2024-10-05T14:48:00" in err
    assert f"{path}:5: field 'namespace': namespace 'my_dataset_best_effort' is BEST_EFFORT" in err
    assert f"{path}:1:" not in err and Recorder.sent == []


def test_the_help_examples_hold_no_time_the_pipeline_refuses():
    """`counter produce --help` showed --generation-time 2024-10-05T14:48:00Z (which the pipeline dead-letters) after
    `--` (after which argparse took the options for positionals: "unrecognized arguments")."""
    assert "2024-" not in produce_cmd.EXAMPLES
    assert 'counter123 -1 --token evt-42 --generation-time "$(date -u +%FT%TZ)"' in produce_cmd.EXAMPLES


def test_file_lines_without_a_time_are_judged_at_the_time_drawn_for_them(tmp_path: Path, capsys, monkeypatch):
    """A line without a generation time is dated as it is read, after the file's start: judged against that start,
    every such line failed with max_clock_skew 0, and any file read for longer than the skew (review)."""
    times = iter(range(1_795_000_000_000_000, 1_795_000_000_000_000 + 10**12, 10**7))  # 10 s a read
    monkeypatch.setattr(produce_cmd, "now_micros", lambda: next(times))
    monkeypatch.setattr("producers.client.time.time_ns", lambda: next(times) * 1000)
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"namespace": "my_dataset", "counter_name": f"c{i}", "delta": 1}) + "\n"
                            for i in range(3)))
    assert produce("--file", str(path)) == 0, capsys.readouterr().err
    assert len(Recorder.sent) == 3


def test_a_token_without_a_generation_time_is_refused_since_a_rerun_would_count_it_again(tmp_path: Path, capsys):
    """A review: a file whose lines had tokens but no generation_time counted twice when run twice (each run drew its
    own time); the API refuses such a body with a 422. So do `counter produce --token` and a file's line."""
    with pytest.raises(SystemExit) as exited:
        produce("my_dataset", "c", "2", "--token", "evt-1")
    assert exited.value.code == 2 and "--token needs --generation-time" in capsys.readouterr().err
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"namespace": "my_dataset", "counter_name": "c", "delta": 1,
                                "idempotency_token": {"token": "t1"}}) + "\n")
    with pytest.raises(SystemExit) as exited:
        produce("--file", str(path))
    err = " ".join(capsys.readouterr().err.split())
    assert exited.value.code == 2 and "m.jsonl:1:" in err and "idempotency_token.generation_time" in err, err
    assert Recorder.sent == []


def test_a_failed_single_write_says_how_to_retry_it_once(monkeypatch, capsys):
    """A review: `error: 1 record(s) not acknowledged ...` and nothing else: the token and time the CLI drew, which a
    retry must send to be counted once, were not said."""
    from producers import DeliveryError

    def fail_flush(self: Recorder) -> None:
        raise DeliveryError("1 record(s) not acknowledged by the broker within 35.0s")

    monkeypatch.setattr(Recorder, "flush", fail_flush, raising=False)
    with pytest.raises(SystemExit) as exited:
        produce("my_dataset", "c", "2")
    err = " ".join(capsys.readouterr().err.split())
    [m] = Recorder.sent
    assert exited.value.code == 1 and f"--token {m.event_id} --generation-time 20" in err, err


@pytest.mark.parametrize("argv", [["my_dataset", "c", "1"], ["--file", "FILE"]])
def test_a_drawn_time_is_drawn_when_the_write_is_sent_not_when_it_is_read(argv, tmp_path: Path, capsys, monkeypatch):
    """A review: token-less lines were dated as the file was read, and the lines of a large file reached Kafka past a
    5 s accept_limit (194,594 of 420,000 dead-lettered); a single write was dated before a slow broker's first
    answer. Here sending comes a minute after reading: the times sent are the send's clock; a given time is kept."""
    path = tmp_path / "m.jsonl"
    given = {"token": "t-given", "generation_time": int(time.time())}
    path.write_text(json.dumps({"namespace": "my_dataset", "counter_name": "a", "delta": 1}) + "\n"
                    + json.dumps({"namespace": "my_dataset", "counter_name": "b", "delta": 1,
                                  "idempotency_token": given}) + "\n")
    late = [0]  # µs the producer's clock is ahead: a minute once the broker has answered
    monkeypatch.setattr(produce_cmd, "now_micros", lambda: time.time_ns() // 1000 + late[0])
    monkeypatch.setattr(Recorder, "ping", lambda self, timeout: late.__setitem__(0, 60_000_000))
    read = time.time_ns() // 1000
    assert produce(*[str(path) if a == "FILE" else a for a in argv]) == 0, capsys.readouterr().err
    assert Recorder.sent[0].event_time >= read + 60_000_000
    if len(Recorder.sent) > 1:
        assert Recorder.sent[1].event_time == given["generation_time"] * 1_000_000


def test_a_first_signal_in_the_final_flush_is_answered_at_once(tmp_path: Path, capfd, monkeypatch):
    """The last review: a first Ctrl-C while `counter produce` flushed (or pinged) the broker printed nothing until
    the flush ended, seconds behind a slow broker. It now says at once what it waits for; the flush goes on, and
    every mutation handed over is acknowledged, so the run ends as produced."""
    import os
    import signal

    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"namespace": "my_dataset", "counter_name": "c", "delta": 1}) + "\n")
    said: list[str] = []

    def flush(self: Recorder) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        said.append(capfd.readouterr().err)  # during the flush, before it returns
    monkeypatch.setattr(Recorder, "flush", flush, raising=False)
    assert produce("--file", str(path)) == 0
    assert len(said) == 1 and said[0].endswith(
        "stopping: waiting for the broker to acknowledge what was handed over (press Ctrl-C again to quit without "
        "waiting)\n"), said  # after the progress bar's last line
    assert "produced 1 mutation(s)" in capfd.readouterr().err


def test_the_notice_of_a_stop_never_raises_where_stderr_is_gone(monkeypatch) -> None:
    """The review of the notice: a closed terminal's SIGHUP (one of the stops) or a closed pipe made the notice's
    write raise BrokenPipeError inside the interrupted flush. The stop is still taken."""
    import os

    from counter_cli.progress import Interrupt

    def broken(_fd: int, _data: bytes) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(os, "write", broken)
    stop = Interrupt("stopping")
    stop._handle(1, None)
    assert stop()


@pytest.mark.parametrize("how", ["sigterm", "sigint_in_flush"])
def test_a_stop_signal_ends_produce_saying_what_was_handed_over(how, tmp_path: Path, capsys, monkeypatch):
    """A review: SIGTERM ended `counter produce --file` with no word (exit 143), and Ctrl-C while the producer's
    flush ran its delivery callbacks came out as a SystemError traceback (confluent-kafka swallows the
    KeyboardInterrupt raised inside a callback). Both now say how many mutations were handed over and how to rerun."""
    import os
    import signal

    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"namespace": "my_dataset", "counter_name": f"c{i}", "delta": 1}) + "\n"
                            for i in range(10)))
    if how == "sigterm":
        def send(self: Recorder, m: object) -> None:
            Recorder.sent.append(m)
            if len(Recorder.sent) == 4:
                os.kill(os.getpid(), signal.SIGTERM)
        monkeypatch.setattr(Recorder, "send", send)
    else:
        def flush(self: Recorder) -> None:  # as confluent-kafka's: an interrupt raised in its delivery callbacks
            try:  # comes out as a SystemError
                os.kill(os.getpid(), signal.SIGINT)  # the first only sets the stop flag now: the flush goes on
                os.kill(os.getpid(), signal.SIGINT)  # a second raises at once
            except KeyboardInterrupt:
                raise SystemError("<built-in method flush> returned NULL without setting an exception") from None
        monkeypatch.setattr(Recorder, "flush", flush, raising=False)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert produce("--file", str(path)) == 130
    err = " ".join(capsys.readouterr().err.split())
    handed = 4 if how == "sigterm" else 10
    assert f"interrupted after {handed:,} of 10 mutation(s) were handed to the producer" in err, err
    assert "running the file again counts its lines with a token" in err
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # restored
