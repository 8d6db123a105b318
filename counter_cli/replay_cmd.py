"""`counter replay`: re-read a mutations topic through the persist path (run by `python -m agents.replay`).

This module owns what the CLI must know without importing `agents`: the arguments (so `counter replay
--help` works in the CLI process), the `--from`/`--to` position syntax, and the rule that decides when a
partition has been read to its end (`PartitionEnds`, also used by `counter dlq`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from counter_cli.common import add_verb, fail, resolve_bootstrap, settings_or_exit, standalone_parser
from schemas import MICROS, ValidationError, parse_generation_time

DESCRIPTION = """\
Re-read the mutations topic (or --topic, e.g. a copy restored from a backup) with the replay's own consumer
group and feed every record through the same persist path as the worker: decode, admission, idempotent event
write, last_write_ts, rollup signal. Idempotency makes any replay safe: what is already stored is stored
once, so counts never grow from replaying it; events missing from the store (lost, deleted) are restored.

Admission judges each event against its record's own Kafka timestamp, exactly as the first time, so a
replay admits and rejects the same mutations (rejections are summarised, not re-dead-lettered unless
--dead-letter). Touched counters are signalled to the rollups topic so a running worker rolls them up. A
restored event older than the immutable-window boundary may lie inside a window that was already rolled
up, where rollups never look again: the replay recounts those counters itself at the end (the same logic
as `counter recount`), so restored counts are exact.

Interrupt it (Ctrl-C) at any time: the current batch is finished (or, on a second Ctrl-C, abandoned:
re-processing it is harmless), offsets are committed to the consumer group after every persisted batch,
and running the same command again resumes where it stopped (--restart starts over). A finished replay
run again replays only what arrived since."""

EPILOG = """\
examples:
  counter replay --from earliest                          # the whole counter-mutations topic
  counter replay --from 2024-10-05T14:00:00Z --to 2024-10-05T15:00:00Z --namespace my_dataset
  counter replay --from 0:1200,3:88 --counter counter123 --namespace my_dataset
  counter replay --topic counter-mutations-restored --from earliest --name restore-2024-10-05
  counter replay --from earliest --restart                # forget saved progress, start over

positions:
  --from earliest | ISO-8601 time (records appended at or after it) | P:O[,P:O...] (partition:offset;
         partitions not listed are not replayed)
  --to   ISO-8601 time (stop at the first record appended after it) | P:O[,P:O...] (stop before offset O;
         partitions not listed are read to their end). Default: the end of each partition when the
         replay starts.

Token-less JSON records are identified by their Kafka position (topic, partition, offset): replay them
from the topic they were first consumed from (or pass --as-topic with that name) and from identical
offsets, or they count again. Every other mutation carries its idempotency token and is always safe.
Progress state: the consumer group --name (offsets) and <COUNTER_DATA_DIR>/replay/<name>.json.
Exit status: 0 done, 1 error, 130 interrupted (run again to resume)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="start", default=None, metavar="POS",
                   help="earliest | ISO time | P:O,... (required unless resuming a replay of the same --name)")
    p.add_argument("--to", dest="end", default=None, metavar="POS",
                   help="ISO time | P:O,... (default: each partition's end when the replay starts)")
    p.add_argument("--topic", help="topic to read (default COUNTER_MUTATIONS_TOPIC, counter-mutations)")
    p.add_argument("--namespace", help="replay only this namespace's mutations")
    p.add_argument("--counter", action="append", default=[], metavar="C",
                   help="replay only this counter (repeatable; needs --namespace)")
    p.add_argument("--name", help="replay name = consumer group keeping its progress (default replay-<topic>)")
    p.add_argument("--restart", action="store_true", help="ignore saved progress of --name and start at --from")
    p.add_argument("--as-topic", metavar="TOPIC",
                   help="topic name used in the identity of token-less JSON records (default: --topic)")
    p.add_argument("--dead-letter", action="store_true",
                   help="send rejected records to the DLQ again (default: only count them; the worker "
                        "dead-lettered them when it first read them)")
    p.add_argument("--batch-size", type=int, default=2000, help="records per persisted batch (default 2000)")
    p.add_argument("--no-recount", action="store_true",
                   help="do not recount counters whose restored events lie in rolled-up windows; list them")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default COUNTER_KAFKA_BOOTSTRAP or counter up's)")
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR")


def build_parser(prog: str = "counter replay") -> argparse.ArgumentParser:
    return standalone_parser(prog, description=DESCRIPTION, epilog=EPILOG, add_arguments=add_arguments)


def register(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "replay", help="re-read a mutations topic through the persist path (safe: idempotent)",
             description=DESCRIPTION, epilog=EPILOG,
             add_arguments=add_arguments, run=run)


def check(args: argparse.Namespace) -> None:
    """Argument errors the CLI reports before starting anything."""
    if args.counter and not args.namespace:
        fail("--counter needs --namespace")
    if args.dead_letter and (args.namespace or args.counter):
        fail("--dead-letter replays every rejection; it cannot be combined with --namespace/--counter")
    if args.batch_size < 1:
        fail("--batch-size must be >= 1")
    for flag, value in (("--from", args.start), ("--to", args.end)):
        if value is not None:
            try:
                parse_position(value, allow_earliest=flag == "--from")
            except ValueError as exc:
                fail(f"{flag}: {exc}")


def run(args: argparse.Namespace) -> int:
    check(args)
    settings = settings_or_exit(data_dir=args.data_dir)
    env = dict(os.environ, COUNTER_KAFKA_BOOTSTRAP=resolve_bootstrap(settings, args.bootstrap))
    if args.data_dir is not None:
        env["COUNTER_DATA_DIR"] = str(args.data_dir)
    # The persist path lives in `agents`, which the CLI never imports: the replay is its own process image.
    os.execve(sys.executable, [sys.executable, "-m", "agents.replay", *argv_of(build_parser(), args)], env)
    return 0  # pragma: no cover


def argv_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The command line that makes `parser` parse back to `args` (options first, then `--` positionals)."""
    options: list[str] = []
    positionals: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not hasattr(args, action.dest):
            continue
        value = getattr(args, action.dest)
        if not action.option_strings:
            if value is None:
                continue
            positionals += [str(v) for v in value] if isinstance(value, list) else [str(value)]
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            options += [flag] if value else []
        elif isinstance(action, argparse._AppendAction):  # flag=value: values may start with '-'
            options += [f"{flag}={v}" for v in value or []]
        elif value is not None and value != action.default:
            options.append(f"{flag}={value}")
    return options + (["--", *positionals] if positionals else [])


# -- positions -----------------------------------------------------------------------------------------

_OFFSETS = re.compile(r"^\s*\d+\s*:\s*\d+\s*(,\s*\d+\s*:\s*\d+\s*)*$")


@dataclass(frozen=True, slots=True)
class Position:
    """`earliest`, a time (epoch µs) or explicit offsets per partition."""

    kind: str  # "earliest" | "time" | "offsets"
    time_us: int | None = None
    offsets: dict[int, int] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.kind == "offsets":
            return ",".join(f"{p}:{o}" for p, o in sorted(self.offsets.items()))
        if self.kind == "time":
            return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((self.time_us or 0) / MICROS)) + "Z"
        return self.kind


def parse_position(text: str, *, allow_earliest: bool = True) -> Position:
    """`earliest` | `P:O[,P:O...]` | an ISO-8601 time (or epoch s/ms/µs)."""
    value = text.strip()
    if value.lower() == "earliest":
        if not allow_earliest:
            raise ValueError("'earliest' is a start, not an end; give a time or P:O,...")
        return Position("earliest")
    if _OFFSETS.match(value):
        offsets: dict[int, int] = {}
        for part in value.split(","):
            p, o = (int(x) for x in part.split(":"))
            if p in offsets:
                raise ValueError(f"partition {p} given twice in {text!r}")
            offsets[p] = o
        return Position("offsets", offsets=offsets)
    try:
        return Position("time", time_us=parse_generation_time(value, field="position"))
    except ValidationError as exc:
        raise ValueError(f"expected 'earliest', an ISO-8601 time or P:O[,P:O...], got {text!r} ({exc})") from None


# -- reading a partition to its end ----------------------------------------------------------------------


@dataclass(slots=True)
class _Part:
    high: int  # high watermark reported when reading started
    stop_offset: int | None  # exclusive, from --to P:O
    position: int  # next offset to read
    last_seen: float  # monotonic time of the last record (or of the start)
    done: bool = False


class PartitionEnds:
    """Decides when each partition has been read to the end it had when reading started.

    Why not just "position >= high watermark": the local broker (Tansu) reports the base offset of the
    partition's last record batch + 1 as the high watermark, not the true end, so records of that last batch
    lie beyond it. A fetch returns whole batches, so they arrive right after the record at high - 1. Hence a
    partition is finished only when its position has reached the reported high watermark AND one of:
    * a bounded poll (`quiet_s`) brought nothing more for it (the end of a quiet topic), or
    * a record stamped after reading started (+ `margin_us` for clock skew) shows up: it was appended later
      (a live topic never goes quiet: workers append heartbeats to counter-mutations every 250 ms, and
      producers keep writing). Records stamped earlier but appended later are read too, which is harmless.
    With Apache Kafka the high watermark is exact and the same rule holds (the extra poll costs `quiet_s`).
    `--to` ends are enforced too: the first record at or after `stop_offset`, or stamped after `stop_after_us`.
    """

    def __init__(self, *, snapshot_us: int, margin_us: int = MICROS, quiet_s: float = 1.0,
                 stop_after_us: int | None = None) -> None:
        self.snapshot_us = snapshot_us
        self.margin_us = margin_us
        self.quiet_s = quiet_s
        self.stop_after_us = stop_after_us
        self.parts: dict[int, _Part] = {}

    def add(self, partition: int, *, start: int, high: int, stop_offset: int | None = None) -> None:
        part = _Part(high, stop_offset, start, time.monotonic())
        part.done = stop_offset is not None and start >= stop_offset
        self.parts[partition] = part

    def accept(self, partition: int, offset: int, timestamp_us: int) -> bool:
        """Whether this record belongs to the read; a record that does not ends its partition."""
        part = self.parts.get(partition)
        if part is None or part.done:
            return False
        part.last_seen = time.monotonic()
        if part.stop_offset is not None and offset >= part.stop_offset:
            part.done = True
            return False
        if self.stop_after_us is not None and timestamp_us > self.stop_after_us:
            part.done = True
            return False
        if offset >= part.high and timestamp_us > self.snapshot_us + self.margin_us:
            part.done = True
            return False
        part.position = offset + 1
        return True

    def idle(self, positions: dict[int, int] | None = None) -> list[int]:
        """Mark partitions finished that reached their high watermark and stayed quiet; returns them.

        `positions` (the consumer's fetch positions) cover offsets consumed without a record to show for
        them (transaction markers, compacted gaps)."""
        now = time.monotonic()
        finished = []
        for p, part in self.parts.items():
            if part.done:
                continue
            if positions and positions.get(p, -1) > part.position:
                part.position = positions[p]
            reached_stop = part.stop_offset is not None and part.position >= part.stop_offset
            quiet_at_end = part.position >= part.high and now - part.last_seen >= self.quiet_s
            if reached_stop or quiet_at_end:
                part.done = True
                finished.append(p)
        return finished

    def done(self, partition: int) -> bool:
        part = self.parts.get(partition)
        return part is None or part.done

    @property
    def all_done(self) -> bool:
        return all(part.done for part in self.parts.values())

    def remaining(self) -> int:
        """Records still to read up to the reported high watermarks (an estimate: see the class doc)."""
        return sum(max(0, part.high - part.position) for part in self.parts.values() if not part.done)
