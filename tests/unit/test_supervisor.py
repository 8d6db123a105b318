"""Supervision of child processes with real (tiny) children: restarts with backoff, fatal deaths, process
groups, and children that die with their parent (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra import parent_death
from infra.process import ManagedProcess, proc_stat
from infra.supervisor import Backoff, Supervisor
from tests.helpers import gone, wait_for

SLEEPER = [sys.executable, "-c", "import time; print('hello from the child', flush=True); time.sleep(60)"]


class Sleeper(ManagedProcess):
    """A child without a port: ready while it runs, unless told it never gets ready."""

    def __init__(self, tmp_path: Path, argv: list[str] | None = None, *, becomes_ready: bool = True) -> None:
        super().__init__(argv or SLEEPER, host="127.0.0.1", port=0, log_path=tmp_path / "sleeper.log",
                         name="sleeper")
        self.becomes_ready = becomes_ready

    def ready(self) -> bool:
        return self.becomes_ready and self.running()


class Events:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __call__(self, level: str, message: str) -> None:
        self.lines.append((level, message))

    def text(self) -> str:
        return "\n".join(message for _, message in self.lines)


def test_backoff_doubles_up_to_the_cap_and_resets():
    backoff = Backoff(initial_s=0.5, max_s=30.0)
    assert [backoff.next_delay() for _ in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    backoff.reset()
    assert backoff.next_delay() == 0.5


def test_a_killed_child_is_restarted_and_reported(tmp_path):
    events, changes = Events(), []
    child = Sleeper(tmp_path).start(timeout=10)
    supervisor = Supervisor(events, on_change=lambda: changes.append(child.pid),
                            backoff=lambda: Backoff(initial_s=0.05, stable_s=3600))
    supervisor.watch(child, restart=True)
    first = child.pid
    try:
        wait_for(lambda: "hello from the child" in child.log_tail(), 10, message="child's first log line")
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: supervisor.tick() is None and child.pid not in (None, first)
                 and supervisor.watched[0].state.value == "up", 10, message=events.text)
    finally:
        child.stop()
    text = events.text()
    assert f"sleeper (pid {first}) died: killed by SIGKILL" in text
    assert "hello from the child" in text  # the log tail
    assert "restarting sleeper in 0.1s" in text or "restarting sleeper in 0.0s" in text
    assert "is up again" in text
    assert changes[0] is None and changes[-1] not in (None, first)  # down, then the new pid


def test_a_death_report_quotes_the_lines_of_the_run_that_died_only(tmp_path):
    """The log goes on across runs; the report of a death quoted an earlier run's last lines when this one had
    written fewer (a review saw another pid's `database is locked` under a frozen worker's death)."""
    (tmp_path / "sleeper.log").write_text("an earlier run's line\n" * 30)
    child = Sleeper(tmp_path).start(timeout=10)
    try:
        wait_for(lambda: "hello from the child" in child.log_tail(), 10, message="child's first log line")
        assert child.log_tail() == "hello from the child"
    finally:
        child.stop()


def test_backoff_grows_while_a_child_keeps_failing(tmp_path):
    events = Events()
    child = Sleeper(tmp_path, [sys.executable, "-c", "import sys; print('bad config'); sys.exit(3)"])
    child.spawn()
    supervisor = Supervisor(events, backoff=lambda: Backoff(initial_s=0.05, max_s=0.2, stable_s=3600))
    supervisor.watch(child, restart=True, ready_timeout_s=5, ready=False)
    wait_for(lambda: supervisor.tick() is None and supervisor.watched[0].restarts >= 4, 20, message=events.text)
    child.stop()
    delays = [line.rsplit(" in ", 1)[1] for _, line in events.lines if "restarting sleeper in" in line]
    assert delays[:4] == ["0.1s", "0.1s", "0.2s", "0.2s"]  # 0.05, 0.1, 0.2 (capped), 0.2, rounded
    assert "exit code 3" in events.text() and "bad config" in events.text()


def test_a_child_that_never_gets_ready_is_killed_and_retried(tmp_path):
    events = Events()
    child = Sleeper(tmp_path, becomes_ready=False)
    child.spawn()
    supervisor = Supervisor(events, backoff=lambda: Backoff(initial_s=0.05, stable_s=3600))
    supervisor.watch(child, restart=True, ready_timeout_s=0.3, ready=False)
    first = child.pid
    try:
        wait_for(lambda: supervisor.tick() is None and child.pid not in (None, first), 10, message=events.text)
    finally:
        child.stop()
    assert "did not become ready within 0.3s; killing it" in events.text()
    assert gone(first)


def test_a_fatal_death_is_returned_with_its_consequence(tmp_path):
    events = Events()
    child = Sleeper(tmp_path).start(timeout=10)
    supervisor = Supervisor(events)
    supervisor.watch(child, restart=False, consequence="its data was in memory")
    assert supervisor.tick() is None
    os.kill(child.pid, signal.SIGTERM)
    assert wait_for(supervisor.tick, 10) is child
    assert child.pid is None
    assert "killed by SIGTERM" in events.text() and "its data was in memory" in events.text()
    assert "restarting" not in events.text()


def test_what_a_dead_child_left_in_its_process_group_is_killed(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    child = Sleeper(tmp_path, ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]).start(timeout=10)
    grandchild = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10))
    supervisor = Supervisor(Events(), backoff=lambda: Backoff(initial_s=60))
    supervisor.watch(child, restart=True)
    os.kill(child.pid, signal.SIGKILL)
    wait_for(lambda: supervisor.tick() is None and child.pid is None, 10)
    wait_for(lambda: gone(grandchild), 5, message="the orphaned grandchild was not killed")


DIES_WITH_PARENT = textwrap.dedent("""
    import signal, sys, time
    from pathlib import Path
    from infra.process import ManagedProcess
    death_signal = None if sys.argv[2] == "none" else signal.SIGKILL
    child = ManagedProcess(["sleep", "60"], host="127.0.0.1", port=0, log_path=Path(sys.argv[1]) / "sleep.log",
                           death_signal=death_signal).spawn()
    print(child.pid, flush=True)
    time.sleep(60)
""")


@pytest.mark.skipif(not parent_death.supported(), reason="PR_SET_PDEATHSIG is Linux-only")
@pytest.mark.parametrize("death_signal", ["sigkill", "none"])
def test_children_die_with_a_killed_parent(tmp_path, death_signal):
    parent = subprocess.Popen([sys.executable, "-c", DIES_WITH_PARENT, str(tmp_path), death_signal],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    child = int(parent.stdout.readline())
    assert not gone(child)
    parent.kill()
    parent.wait(10)
    try:
        if death_signal == "sigkill":
            wait_for(lambda: gone(child), 5, message=f"child {child} outlived its killed parent")
        else:  # the control: without PR_SET_PDEATHSIG the orphan lives on, so the check above means something
            with pytest.raises(AssertionError):
                wait_for(lambda: gone(child), 1)
    finally:
        if not gone(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not parent_death.supported(), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_child_whose_parent_died_before_prctl_exits_at_once():
    # The preexec function remembers the pid of the process that made it; run it in a grandchild, whose
    # parent is another process: exactly what a child sees when its real parent died before prctl ran.
    script = textwrap.dedent("""
        import os, sys
        from infra.parent_death import EXIT_PARENT_GONE, die_with_this_process
        preexec = die_with_this_process()
        child = os.fork()
        if child == 0:
            grandchild = os.fork()
            if grandchild == 0:
                preexec()
                os._exit(0)
            _, status = os.waitpid(grandchild, 0)
            os._exit(0 if os.waitstatus_to_exitcode(status) == EXIT_PARENT_GONE else 1)
        _, status = os.waitpid(child, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[2], timeout=30)
    assert result.returncode == 0


def state(pid: int) -> str:
    fields = proc_stat(pid)
    assert fields is not None, f"pid {pid} is gone"
    return fields[0]


def test_pause_returns_once_the_child_is_stopped_and_resume_wakes_it(tmp_path):
    """SIGSTOP is delivered asynchronously: pause() waits until the kernel reports the child stopped, so a
    request sent right after it cannot be answered by the 'paused' process (a flaky hung-memcached test)."""
    child = Sleeper(tmp_path).start(timeout=10)
    try:
        for _ in range(20):
            child.pause()
            assert state(child.pid) in ("T", "t")  # at once, no waiting here
            child.resume()
            wait_for(lambda: state(child.pid) not in ("T", "t"), 5, message="the child to run again")
    finally:
        child.stop()


def test_a_child_that_finds_its_port_taken_is_told_so(tmp_path):
    """A review: a second stack's worker took port 6066 after `counter up` had checked it; the worker died with an
    `address already in use` traceback at every restart, and nothing said what to do."""
    events = Events()  # the child dies as the worker's web server does when its port is taken
    fails = [sys.executable, "-c", "raise OSError(98, \"error while attempting to bind on address ('127.0.0.1', "
             "6066): address already in use\")"]
    child = Sleeper(tmp_path, fails)
    child.spawn()
    supervisor = Supervisor(events, backoff=lambda: Backoff(initial_s=0.05, stable_s=3600))
    supervisor.watch(child, restart=True, ready_timeout_s=5, ready=False)
    wait_for(lambda: supervisor.tick() is None and supervisor.watched[0].restarts >= 1, 20, message=events.text)
    child.stop()
    assert "sleeper's port 0 is held by another process: stop that one, or give this sleeper another port" in \
        events.text(), events.text()
