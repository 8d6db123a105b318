"""`counter produce`: send mutations from arguments or from a JSONL file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from control_plane import NamespaceRegistry
from control_plane.admission import admission_error, mutation_refusal, record_time
from counter_cli.common import console, fail, namespaces_or_exit, resolve_bootstrap, stack_settings_or_exit
from counter_cli.progress import Interrupt, ProgressBar
from producers import CounterProducer, DeliveryError, NotAdmitted
from producers.client import add_delta, now_micros
from schemas import DecodeError, Mutation, MutationOp, ValidationError, mutation_from_json
from schemas.validation import micros_iso

EXAMPLES = """examples:
  counter produce my_dataset counter123 2
  counter produce my_dataset counter123 -1 --token evt-42 --generation-time "$(date -u +%FT%TZ)"
  counter produce my_dataset counter456 --clear
  counter produce plays title_1 1 --dimension country=US --dimension device=tv
  counter produce visitors home --item user-42 --dimension country=US
  counter produce --file mutations.jsonl --batch-size 500

A JSONL line has the AddCount body of the Netflix post, plus "op": "clear" for a clear and "dimensions":
  {"namespace": "my_dataset", "counter_name": "counter123", "delta": 2,
   "idempotency_token": {"token": "some_event_id", "generation_time": "2026-11-23T12:10:00Z"}}
  {"namespace": "plays", "counter_name": "title_1", "delta": 1, "dimensions": {"country": "US", "device": "tv"}}
Lines without a token get a generated one (then re-sending the file counts it again); a line with a token needs
its generation_time, as the API does: a time drawn at each run would count it again too.
What the pipeline would dead-letter is refused before anything is sent (exit 2, naming the argument, or the
line and field): a namespace the namespace file does not define, a BEST_EFFORT one (its counts live in the
cache: write them through the API), dimensions it does not declare, an item outside a UNIQUE namespace, and a
generation time outside its accept_limit (and max_clock_skew) of now: a rolled-up window never changes, so the
post's own 2024 example is refused. With --file, every refused line is listed and nothing is sent. (A counter at
its namespace's max_combinations is judged by the worker: it needs the stored combinations.) A line without a
generation_time is dated when it is sent.
Records are keyed "namespace:counter", or "namespace:counter#k" in a namespace with `shards` (COUNTER_NAMESPACES,
default the shipped example): k is chosen by the token, so a retry goes where the first try went."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("produce", help="produce count mutations to Kafka",
                       description="Produce AddCount/ClearCount mutations to the mutations topic and wait "
                                   "until the broker acknowledged every one.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("namespace", nargs="?")
    p.add_argument("counter_name", nargs="?")
    p.add_argument("delta", nargs="?", type=int, help="positive or negative (e.g. -1)")
    p.add_argument("--clear", action="store_true", help="ClearCount instead of AddCount")
    p.add_argument("--token", help="idempotency token (default: generated); needs --generation-time")
    p.add_argument("--generation-time", help="ISO-8601 or epoch (s/ms/µs); default now (without --token)")
    p.add_argument("--item-key", default="", help="event_item_key (default empty)")
    p.add_argument("--item", default="", help="the item a UNIQUE namespace counts (e.g. a user id); DELTA may then "
                                              "be left out (it is 1)")
    p.add_argument("--dimension", action="append", default=[], metavar="KEY=VALUE",
                   help="a dimension of the write (repeat for several, e.g. --dimension country=US "
                        "--dimension device=tv); keys the namespace declares")
    p.add_argument("--file", type=Path, help="JSONL file of mutations ('-' not supported: give a path)")
    p.add_argument("--batch-size", type=int, default=500, help="mutations per Kafka record (default 500)")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default COUNTER_KAFKA_BOOTSTRAP or counter up's)")
    p.add_argument("--topic", default=None, help="topic (default COUNTER_MUTATIONS_TOPIC)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = stack_settings_or_exit()
    if args.file is None and (args.namespace is None or args.counter_name is None):
        fail("give NAMESPACE COUNTER [DELTA], or --file FILE.jsonl (see counter produce --help)")
    if args.file is not None and args.namespace is not None:
        fail("give either NAMESPACE COUNTER DELTA or --file, not both")
    if args.batch_size < 1:
        fail("--batch-size must be >= 1")
    # The namespaces say what the pipeline accepts, and each one's shards how its counters are keyed.
    _, registry = namespaces_or_exit(settings)
    if args.file:
        try:
            mutations, drawn = _from_file(args.file, registry)
        except KeyboardInterrupt:  # a traceback before (a review)
            console.print(f"interrupted while reading {args.file}: nothing was sent", highlight=False)
            return 130
    else:
        mutations, drawn = [_from_args(args)], [args.generation_time is None]
        refused = refusal(mutations[0], registry, now_micros())
        if refused is not None:
            fail(f"{_argument(refused[0])}: {refused[1]} (the pipeline would dead-letter this write)")
    bootstrap = resolve_bootstrap(settings, args.bootstrap)
    topic = args.topic or settings.mutations_topic
    handed = [0]
    # SIGINT, SIGTERM or SIGHUP stops between mutations (a review: SIGTERM ended it without a word, and Ctrl-C while
    # the producer's flush ran its delivery callbacks came out as a SystemError traceback); a second one at once. The
    # first one is answered at once: the ping or the final flush can wait for the broker for seconds
    stop = Interrupt("stopping: waiting for the broker to acknowledge what was handed over (press Ctrl-C again to "
                     "quit without waiting)").install()
    try:
        with CounterProducer(bootstrap, topic=topic, batch_size=args.batch_size, namespaces=registry,
                             config=settings.kafka_security.librdkafka()) as producer:
            try:  # before any time is drawn for sending (`_send`)
                producer.ping(producer.metadata_timeout_s)
            except DeliveryError as exc:  # no retry advice: nothing was sent (a review)
                fail(f"{exc}; nothing was sent", code=1)
            if stop():
                raise KeyboardInterrupt  # while the broker was asked: nothing was handed over
            if args.file is None:
                _send(producer, mutations, drawn, 0)
                handed[0] = 1
            else:
                _send_with_progress(producer, mutations, drawn, handed, stop)
            producer.flush()
    except DeliveryError as exc:
        also = (f" Of the acknowledged, {len(exc.refusals)} will be dead-lettered (first: {exc.refusals[0][1]}): "
                "send those again as new writes." if exc.refusals else "")
        fail(f"{exc}; {_retry_advice(args, mutations)}.{also}", code=1)
    except NotAdmitted as exc:  # acknowledged, and refused by admission (a broker that stalled past accept_limit)
        m, reason = exc.refusals[0]
        fail(f"{len(exc.refusals)} mutation(s) reached Kafka but will be dead-lettered, not counted: {reason} "
             f"(first: {m.namespace}/{m.counter_name}, token {m.event_id}); send "
             + ("it again without --token: a new write" if args.file is None else
                "those lines again with new tokens and times: new writes"), code=1)
    except (KeyboardInterrupt, SystemError) as exc:
        if isinstance(exc, SystemError) and not stop():  # only an interrupt inside the client's callbacks is one
            raise
        console.print(f"interrupted after {handed[0]:,} of {len(mutations):,} mutation(s) were handed to the producer "
                      "(those the broker acknowledged are counted); "
                      f"{_retry_advice(args, mutations)}", soft_wrap=True, highlight=False)
        return 130
    finally:
        stop.restore()
    console.print(f"produced {len(mutations)} mutation(s) to {topic} on {bootstrap}")
    return 0


def _retry_advice(args: argparse.Namespace, mutations: list[Mutation]) -> str:
    """How to send again without counting twice (a review: a failed single write printed nothing to retry with)."""
    if args.file is None:
        m = mutations[0]  # its token and time: given, or drawn by CounterProducer.mutation (never None there)
        return (f"to retry, send it again with --token {m.event_id} --generation-time {micros_iso(m.event_time or 0)} "
                "(counted once, if within the namespace's accept_limit of that time)")
    return ("running the file again counts its lines with a token and generation_time once, counts the lines "
            "without a token again, and refuses lines older than their namespace's accept_limit")


def _from_args(args: argparse.Namespace) -> Mutation:
    if args.clear and args.delta not in (None, 0):
        fail("--clear takes no DELTA")
    if not args.clear and args.delta is None and not args.item:
        fail("DELTA is required for an add (or pass --clear, or --item in a UNIQUE namespace)")
    if args.clear and args.item:
        fail("--clear takes no --item: a clear erases every item counted before it")
    if args.token is not None and args.generation_time is None:
        fail("--token needs --generation-time (e.g. $(date -u +%FT%TZ)): with a time drawn at each run, running the "
             "command again would count the write again")
    op = MutationOp.CLEAR if args.clear else MutationOp.ADD
    dimensions = _dimensions(args.dimension)
    if dimensions and args.clear:
        fail("--clear takes no --dimension: a clear applies to the counter and all its combinations")
    try:
        delta = 0 if args.clear and args.delta is None else add_delta(args.delta, args.item)
        return CounterProducer.mutation(op, args.namespace, args.counter_name, delta, args.token,
                                        args.generation_time, args.item_key, dimensions, args.item)
    except (ValidationError, ValueError) as exc:
        fail(str(exc))


# The argument of `counter produce NAMESPACE COUNTER DELTA` that carries a refused field.
_ARGUMENTS = {"namespace": "NAMESPACE", "delta": "DELTA", "item": "--item", "event_item_key": "--item-key",
              "dimensions": "--dimension", "idempotency_token.generation_time": "--generation-time"}


def _argument(field: str) -> str:
    """The argument that carries `field`: `namespace` -> `NAMESPACE`, `dimensions.country` -> `--dimension country`."""
    if field.startswith("dimensions."):
        return f"--dimension {field.removeprefix('dimensions.')}"
    return _ARGUMENTS.get(field, field)


def refusal(m: Mutation, registry: NamespaceRegistry, now_us: int) -> tuple[str, str] | None:
    """``(field, reason)`` when the pipeline would dead-letter `m` were it to reach Kafka at `now_us`, else None,
    fields named as the API's 422 names them: what it refuses whatever the time (`mutation_refusal`), then the
    time. The dimension bound (max_combinations) is left to the pipeline: it needs the stored combinations."""
    if (refused := mutation_refusal(registry, m)) is not None:
        return refused
    reason = admission_error(now_us if m.event_time is None else m.event_time, record_time(now_us),
                             registry[m.namespace])
    if reason is not None:
        return "idempotency_token.generation_time", reason
    return None


def _dimensions(pairs: list[str]) -> dict[str, str]:
    """--dimension KEY=VALUE arguments as a map; a key given twice or a missing '=' fails."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            fail(f"--dimension {pair!r}: expected KEY=VALUE (e.g. country=US)")
        if key in out:
            fail(f"--dimension {key!r} given twice")
        out[key] = value
    return out


def _from_file(path: Path, registry: NamespaceRegistry | None = None) -> tuple[list[Mutation], list[bool]]:
    """Parse and validate the whole file first, so a bad line sends nothing: one the pipeline would dead-letter
    (`refusal`, when the namespaces are given) neither."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        fail(f"cannot read {path}: {exc}")
    except UnicodeDecodeError as exc:  # a traceback before (a review)
        where = path.read_bytes()[:exc.start].count(b"\n") + 1
        fail(f"{path}: line {where} is not UTF-8 ({exc.reason} at byte {exc.start}); nothing was sent")
    mutations: list[Mutation] = []
    drawn_times: list[bool] = []  # whose time is drawn here: dated again when sent (`_send`)
    errors: list[str] = []
    now = now_micros()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            m = mutation_from_json(json.loads(line))
            if m.event_id is not None and m.event_time is None:  # as the API refuses it
                raise ValidationError("idempotency_token.generation_time", "is required with a token: a time drawn "
                                      "at each run would make a re-run of the file count the line again")
            drawn = m.event_time is None  # the time is drawn here, now: no time to judge (max_clock_skew may be 0)
            m = CounterProducer.mutation(
                m.op, m.namespace, m.counter_name, m.delta, m.event_id,
                None if m.event_time is None else m.event_time, m.event_item_key, dict(m.dimensions), m.item)
        except (ValueError, DecodeError, ValidationError) as exc:
            errors.append(f"{path}:{number}: {exc}")
            continue
        refused = None if registry is None else refusal(m, registry, m.event_time if drawn and m.event_time else now)
        if refused is not None:
            errors.append(f"{path}:{number}: field '{refused[0]}': {refused[1]}")
        else:
            mutations.append(m)
            drawn_times.append(drawn)
    if errors:
        shown = "\n  ".join(errors[:20])
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        fail(f"{len(errors)} invalid line(s) (malformed, or the pipeline would dead-letter them), nothing was "
             f"sent:\n  {shown}{more}")
    return mutations, drawn_times


def _send(producer: CounterProducer, mutations: list[Mutation], drawn: list[bool], i: int) -> None:
    """Send mutations[i], dated now if its time was drawn (`drawn[i]`), and keep that time for the retry advice.
    Dated when the file was read, the lines of a large one reached Kafka past a 5 s accept_limit and were
    dead-lettered (a review: 194,594 of 420,000), and a single write dated before a slow broker's first answer too."""
    if drawn[i]:
        mutations[i] = mutations[i]._replace(event_time=now_micros())
    producer.send(mutations[i])


def _send_with_progress(producer: CounterProducer, mutations: list[Mutation], drawn: list[bool],
                        handed: list[int], stop: Interrupt) -> None:
    with ProgressBar("producing", total=len(mutations), unit="mut") as bar:
        step = max(1, len(mutations) // 200)
        for i in range(len(mutations)):
            if stop():
                raise KeyboardInterrupt  # here, in Python: the `with` then flushes what was handed over
            _send(producer, mutations, drawn, i)
            handed[0] = i + 1
            if handed[0] % step == 0 or handed[0] == len(mutations):
                bar.update(completed=handed[0])
