"""counter_cli.up_cmd.StopSignals: a Ctrl-C while starting stops `counter up` with 128 + the signal; while stopping
the first kills everything and any further one is noted, never raised."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

import pytest

from counter_cli.up_cmd import Interrupted, StopSignals


def test_a_signal_while_starting_whose_exception_was_lost_interrupts_once_started():
    signals = StopSignals()
    with contextlib.suppress(Interrupted):  # as in an at-fork hook, where Python prints it and goes on
        signals._handle(signal.SIGINT, None)
    with pytest.raises(Interrupted) as raised:
        signals.running()
    assert raised.value.signum == signal.SIGINT


def test_once_running_a_signal_asks_to_stop_without_raising():
    signals = StopSignals()
    signals.running()
    signals._handle(signal.SIGTERM, None)
    assert signals.requested.is_set() and signals.received == signal.SIGTERM


def test_a_closed_terminal_stops_counter_up_as_ctrl_c_does():
    """SIGHUP's default ended `counter up` at once, without the drain (from a review): it is handled like SIGTERM."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signals = StopSignals()
    try:
        signals.install()
        assert signal.getsignal(signal.SIGHUP) == signals._handle
        signals.running()
        signal.raise_signal(signal.SIGHUP)
        assert signals.requested.is_set() and signals.received == signal.SIGHUP
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_bad_data_directory_or_a_taken_port_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    import socket

    from counter_cli.main import build_parser
    from counter_cli.up_cmd import run

    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("COUNTER_DATA_DIR", str(afile))
    with pytest.raises(SystemExit) as exited:
        run(build_parser().parse_args(["up", "--no-compile"]))
    assert exited.value.code == 1 and "COUNTER_DATA_DIR" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("COUNTER_DATA_DIR", str(tmp_path / "data"))
        monkeypatch.setenv("COUNTER_API_PORT", str(taken.getsockname()[1]))
        with pytest.raises(SystemExit) as exited:
            run(build_parser().parse_args(["up", "--no-compile"]))
    err = capsys.readouterr().err
    assert exited.value.code == 1 and "COUNTER_API_PORT" in err and "in use" in err, err


def test_while_stopping_one_signal_interrupts_and_any_further_one_is_noted_once_never_raised(capfd):
    """A third Ctrl-C raised out of the code killing the children after the second: a traceback, children left."""
    signals = StopSignals()
    signals.running()
    signals._handle(signal.SIGINT, None)  # asks for the stop
    assert signals.stopping()
    with pytest.raises(Interrupted) as raised:
        signals._handle(signal.SIGTERM, None)  # kills everything
    assert raised.value.signum == signal.SIGTERM
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGINT):
        signals._handle(sig, None)
    assert capfd.readouterr().err == "SIGHUP received again: stopping already, exiting once the children are gone\n"


def test_a_second_signal_before_the_stop_begins_makes_it_kill_at_once():
    """Ctrl-C twice in a row, the second before the stop armed itself: the stop does not wait for the drain."""
    signals = StopSignals()
    signals.running()
    signals._handle(signal.SIGINT, None)
    signals._handle(signal.SIGINT, None)
    assert not signals.stopping()
    signals._handle(signal.SIGINT, None)  # not raised: killing is under way


def test_a_stop_no_signal_asked_for_is_interrupted_by_the_first():
    """The broker died: the stop is `counter up`'s own, and the first Ctrl-C during it kills everything."""
    signals = StopSignals()
    signals.running()
    assert signals.stopping()
    with pytest.raises(Interrupted):
        signals._handle(signal.SIGINT, None)


def test_a_signal_landing_inside_the_supervision_loops_wait_does_not_block_counter_up():
    """A handler runs in the main thread between any two bytecodes. The loop waited on a threading.Event, whose wait
    and set take its lock: a signal landing while the wait held it (or while a previous handler's set did) blocked
    `counter up` for good, children and all (two signals in a row, from `pkill` and `timeout`). Here a handler runs
    at every line of the wait, as a signal may; the wait must return and see the stop."""
    signals = StopSignals()
    signals.running()
    wait_code = type(signals.requested).wait.__code__

    def every_line(frame, event, arg):
        if event == "line":
            signals._handle(signal.SIGTERM, None)
        return every_line

    def tracer(frame, event, arg):
        return every_line if frame.f_code is wait_code else None

    outcome: list[bool] = []

    def loop() -> None:
        sys.settrace(tracer)
        try:
            outcome.append(signals.requested.wait(0.01))
        finally:
            sys.settrace(None)

    waiting = threading.Thread(target=loop, daemon=True)
    waiting.start()
    waiting.join(5)
    assert not waiting.is_alive(), "a handler blocked inside the loop's wait"
    assert outcome == [True] and signals.count >= 1 and signals.received == signal.SIGTERM
