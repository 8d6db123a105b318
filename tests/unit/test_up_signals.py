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
