"""The tools' stop request (`counter_cli.progress.Interrupt`): SIGTERM and SIGHUP ask a job to stop after the unit in
hand, as Ctrl-C does, so it saves where it is (before: a `kill` ended `counter dlq replay` without its save)."""

from __future__ import annotations

import os
import signal

import pytest

from counter_cli.progress import Interrupt


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_asks_the_job_to_stop_and_a_second_one_stops_it_now(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    with Interrupt() as stop:
        assert not stop()
        os.kill(os.getpid(), sig)
        assert stop(), "the first signal is a request the job's loop sees"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig)
    assert signal.getsignal(sig) == before, "the previous handler is back"


def test_a_signal_ignored_before_stays_ignored() -> None:
    """A review: under `nohup` SIGHUP is ignored; a job must not take it as a stop when the terminal closes."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with Interrupt() as stop:
            os.kill(os.getpid(), signal.SIGHUP)
            assert not stop()
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
