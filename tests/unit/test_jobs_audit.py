"""`counter audit --resume` after a hard stop: a group of events sharing one event_time is never left half
exported, and a file of the other format (or another kind of export) is refused, not appended to."""

from __future__ import annotations

import asyncio
import json

import pytest

from counter_cli import audit_cmd
from counter_cli.main import build_parser
from jobs.audit import AuditOptions, RowWriter, audit, cut_last_group
from schemas import INT64_MAX, MICROS
from sinks import Partitioning, SqliteEventStore, SqliteRollupStore

T = 1_700_000_000 * MICROS
NAMESPACES = """namespaces:
  ev: {counter_type: EVENTUAL, accept_limit: 2s, max_clock_skew: 500ms}
"""


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def stores(tmp_path):
    part = Partitioning(4, 10, 60)
    events = SqliteEventStore(tmp_path / "events.sqlite3", lambda ns: part)
    rollups = SqliteRollupStore(tmp_path / "rollups.sqlite3")
    yield events, rollups
    run(events.close())
    run(rollups.close())


class HardStop:
    """The export file; a KeyboardInterrupt (a second Ctrl-C) after `rows` rows."""

    def __init__(self, out, rows: int) -> None:
        self.out, self.rows = out, rows

    def write(self, text: str) -> None:
        self.out.write(text)
        self.rows -= 1
        if not self.rows:
            raise KeyboardInterrupt

    def flush(self) -> None:
        self.out.flush()


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_resumed_export_redoes_the_group_a_hard_stop_cut_short(stores, tmp_path, fmt):
    events, rollups = stores
    group = [("ev", "c", T + 1, f"kafka:m:0:7:{i}", "", 1, False) for i in range(5)]  # one batch record's
    run(events.write_events([("ev", "c", T, "first", "", 1, False), *group, ("ev", "c", T + 2, "last", "", 1, False)]))
    path = tmp_path / f"audit.{fmt}"
    header = fmt == "csv"
    with path.open("a") as f, pytest.raises(KeyboardInterrupt):  # the header, "first" and 2 rows of the group
        run(audit(events, rollups, AuditOptions("ev", "c"), RowWriter(HardStop(f, 3 + header), fmt, header)))
    with path.open("a") as f:
        f.write('{"event_ti' if fmt == "jsonl" else "2023-11-14T")  # and a torn line
    resumed = AuditOptions("ev", "c").resumed(path, fmt)
    assert (resumed.after_us, resumed.start_total) == (T, 1)  # after "first", from its total
    assert len(path.read_text().splitlines()) == 1 + header  # the group's rows and the torn line are cut
    with path.open("a") as f:
        run(audit(events, rollups, resumed, RowWriter(f, fmt, False)))
    lines = path.read_text().splitlines()[header:]
    totals = [json.loads(line)["running_total"] for line in lines] if fmt == "jsonl" else \
        [int(line.rsplit(",", 1)[1]) for line in lines]
    assert totals == list(range(1, 8))


def test_an_export_that_is_one_group_starts_over(stores, tmp_path):
    events, rollups = stores
    run(events.write_events([("ev", "c", T, f"t{i}", "", 1, False) for i in range(3)]))
    path = tmp_path / "audit.csv"
    with path.open("a") as f, pytest.raises(KeyboardInterrupt):
        run(audit(events, rollups, AuditOptions("ev", "c"), RowWriter(HardStop(f, 3), "csv", True)))
    options = AuditOptions("ev", "c", after_us=5)
    assert options.resumed(path, "csv") is options
    assert path.read_text() == "event_time,event_time_us,op,token,item_key,delta,counted,running_total\n"
    assert cut_last_group(path, "csv") is None and path.read_text().count("\n") == 1


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    (tmp_path / "namespaces.yaml").write_text(NAMESPACES)
    monkeypatch.setenv("COUNTER_NAMESPACES", str(tmp_path / "namespaces.yaml"))
    (tmp_path / "rollups.sqlite3").touch()  # a store there: an audit refuses a directory without one
    return tmp_path


def _audit(tmp_path, *extra: str) -> int:
    return audit_cmd.run(build_parser().parse_args(["audit", "ev", "c", "--data-dir", str(tmp_path), *extra]))


@pytest.mark.parametrize(("content", "fmt", "found"), [
    ('{"event_time_us": 1, "running_total": 1}\n', "csv", "jsonl"),
    ("event_time,event_time_us,op,token,item_key,delta,counted,running_total\nx,1,add,t,,1,true,1\n", "jsonl", "csv"),
])
def test_resume_refuses_a_file_of_the_other_format(cli_env, capsys, content, fmt, found):
    out = cli_env / "export"
    out.write_text(content)
    with pytest.raises(SystemExit) as exited:
        _audit(cli_env, "--output", str(out), "--resume", "--format", fmt)
    assert exited.value.code == 2 and out.read_text() == content
    err = " ".join(capsys.readouterr().err.split())
    assert f"holds a {found} export, not {fmt}: resume it with --format {found}, or give another --output" in err


def test_resume_refuses_another_kind_of_export(cli_env, capsys):
    out = cli_env / "series.jsonl"
    content = '{"bucket_start_us": 0, "running_total": 3}\n'
    out.write_text(content)
    with pytest.raises(SystemExit) as exited:
        _audit(cli_env, "--output", str(out), "--resume")
    assert exited.value.code == 2 and out.read_text() == content
    err = " ".join(capsys.readouterr().err.split())
    assert "is not a jsonl event export (no --by) this command can continue" in err


def test_after_retention_the_running_total_is_compared_only_from_a_clear_after_the_cut(stores):
    """Retention deleted the events before the cut, which the stored count includes: `--from` after the cut summed
    the total before it from the events kept, and reported a right count of 30 as differing (11, a review). It is
    not compared then; a clear after the cut resets the total, and from there the comparison holds."""
    from sinks import dropped_key

    events, rollups = stores
    cut = T + 10 * MICROS
    run(events.write_events([("ev", "c", T + 11 * MICROS, "kept", "", 11, False)]))  # 19 before the cut: deleted
    run(rollups.write_rollup("ev", "c", 30, T + 20 * MICROS))
    run(rollups.set_watermarks(dropped_key("ev"), {0: cut}))
    for after in (0, cut + MICROS):
        result = run(audit(events, rollups, AuditOptions("ev", "c", after, T + 30 * MICROS), lambda rows: None))
        assert result.at_rollup is None and "retention deleted the events before" in (result.not_compared or "")
    run(events.write_events([("ev", "c", T + 12 * MICROS, "clear", "", 0, True),
                             ("ev", "c", T + 13 * MICROS, "after", "", 4, False)]))
    run(rollups.write_rollup("ev", "c", 4, T + 20 * MICROS))
    result = run(audit(events, rollups, AuditOptions("ev", "c", 0, T + 30 * MICROS), lambda rows: None))
    assert (result.at_rollup, result.not_compared) == (4, None)  # checkable: the clear is after the cut


def test_a_counter_whose_sum_left_the_int64_range_is_not_compared(stores):
    """Its stored count saturated in a rollup and later deltas applied to the bound, so it depends on when the
    rollups ran (README): the audit said DIFFERS (run counter recount), exit 1, for a count that was as documented
    (a new user's walkthrough: MAX, +5, -10 stored MAX-10 against a running total of MAX-5)."""
    events, rollups = stores
    run(events.write_events([("ev", "sat", T, "a", "", INT64_MAX, False), ("ev", "sat", T + 1, "b", "", 5, False),
                             ("ev", "sat", T + 2, "c", "", -10, False),
                             ("ev", "back", T, "a", "", INT64_MAX, False), ("ev", "back", T + 1, "b", "", 5, False),
                             ("ev", "back", T + 2, "c", "", 0, True), ("ev", "back", T + 3, "d", "", 7, False)]))
    run(rollups.write_rollup("ev", "sat", INT64_MAX - 10, T + 2))
    run(rollups.write_rollup("ev", "back", 7, T + 3))
    result = run(audit(events, rollups, AuditOptions("ev", "sat"), lambda rows: None))
    assert result.at_rollup is None and result.tally.total == INT64_MAX - 5
    assert result.not_compared is not None and "left the int64 range at" in result.not_compared
    result = run(audit(events, rollups, AuditOptions("ev", "back"), lambda rows: None))  # a clear after: checked
    assert (result.at_rollup, result.not_compared) == (7, None)
