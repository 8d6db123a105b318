"""counter_cli.up_cmd.StopSignals: a Ctrl-C while starting stops `counter up` with 128 + the signal."""

from __future__ import annotations

import contextlib
import signal

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
