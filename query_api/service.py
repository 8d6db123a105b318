"""The counting logic behind the endpoints, one method per API call.

BEST_EFFORT goes to memcached only. EVENTUAL and ACCURATE writes are acknowledged once the broker has them
(durable); reads serve the rollup (cache, then store) and ACCURATE adds the live delta of persisted events.

Dimensions (schemas.dimensions): a write's dimensions are checked against the namespace here (422 naming the
field) and counted by the persist path in every combination; a read with a `dimensions` filter reads the one
combination counter, a `group_by` lists the counter's combinations in the registry and reads each.

UNIQUE namespaces (aggregation UNIQUE): every add carries an `item` and counts it once (`delta_of`, `extras`); their
reads are estimates from sketches (query_api.unique).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from control_plane import CounterType, Namespace, NamespaceRegistry
from control_plane.admission import (
    admission_error,
    extras_refusal,
    late_acknowledgement,
    record_time,
    rolled_past,
    rollup_boundary,
)
from producers import DeliveryError, new_token
from producers.group_commit import RETRY_RULE, Acknowledgement, GroupCommitProducer
from query_api import metrics
from query_api.arrivals import Arrivals
from query_api.combination_bound import CombinationBound, OverBound
from query_api.early_persist import EarlyPersist, Unnoted, eligible, furthest
from query_api.live_reads import LiveReads
from query_api.persist_progress import PersistProgress
from query_api.plain_add import plain_add
from query_api.signals import ReadSignals
from query_api.topk import TopK, top_k
from query_api.windows import Series, parse_window, series, window_count, windowed
from schemas import (
    MAX_NAMESPACE_LEN,
    MICROS,
    Dimensions,
    Mutation,
    MutationOp,
    ValidationError,
    combination,
    parse_generation_time,
    split_combination,
    validate_dimension_key,
    validate_dimensions,
    validate_item,
    validate_item_key,
    validate_token,
)
from schemas.validation import micros_iso
from sinks import BucketStore, EventStore, RollupCache, RollupStore, SketchStore
from sinks.availability import store_unavailable
from sinks.best_effort import BestEffortCounters
from sinks.combinations import all_combinations
from sinks.rolled import RolledFloors
from sinks.windows import WindowError

log = logging.getLogger(__name__)

GROUP_READS = 64  # group_by: counts read at once


class NamespaceNotFound(LookupError):
    pass


Identity = tuple[str, int]  # a durable write's idempotency token and event time (µs): what a safe retry re-sends


class BrokerUnavailable(RuntimeError):
    """The broker did not acknowledge a write. `identity`: the write's token and event time, which its 503 answers
    (a retry with them is counted once, also when this process drew them for a write that brought none);
    `entries`: a batch's, one per request (None for a BEST_EFFORT one, which has none)."""

    def __init__(self, message: str, identity: Identity | None = None,
                 entries: Sequence[Identity | None] | None = None) -> None:
        super().__init__(message)
        self.identity = identity
        self.entries = entries


class NotCountedYet(TimeoutError):
    """The write is durable but was not persisted within the read-your-write wait, or may not be counted (`identity`
    and `entries` as above)."""

    def __init__(self, message: str, identity: Identity | None = None,
                 entries: Sequence[Identity | None] | None = None) -> None:
        super().__init__(message)
        self.identity = identity
        self.entries = entries


TOKEN_NEEDS_TIME = ("is required with a token: an event is identified by its token and generation_time together, "
                    "so only a retry that carries both the same is counted once")


class Rejected(ValueError):
    """A well-formed request the namespace cannot accept (e.g. generation_time outside the accept window)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Count:
    ns: Namespace
    counter: str
    count: int
    rollup_ts: int | None


@dataclass(frozen=True, slots=True)
class WindowedCount:
    """A window's count over [start_us, end_us) (aligned to its buckets), exact up to `as_of`."""

    ns: Namespace
    counter: str
    count: int
    start_us: int
    end_us: int
    as_of: int | None


@dataclass(frozen=True, slots=True)
class Grouped:
    """GetCount with group_by: per value of `group_by`, the count of the combination `dimensions` + that value;
    `count` is the filter's total. `start_us`/`end_us`: the window counted, if one was asked for."""

    ns: Namespace
    counter: str
    dimensions: Dimensions
    group_by: str
    groups: list[tuple[str, int]]
    count: int
    as_of: int | None
    start_us: int | None = None
    end_us: int | None = None


@dataclass(frozen=True, slots=True)
class Ranked:
    """GetTopK: `top.items` are (counter, count) of base counters; `as_of` the oldest rollup among them."""

    ns: Namespace
    k: int
    dimensions: Dimensions
    top: TopK
    as_of: int | None


class Written(NamedTuple):
    """A write's answer. A NamedTuple rather than a dataclass: every durable write over HTTP builds one, and a tuple
    costs a third of a frozen dataclass to build."""

    ns: Namespace
    counter: str
    token: str | None
    event_time: int | None
    value: int | None = None  # BEST_EFFORT: the new count


# for the mutations topic's end offsets, once per process (`inherit_earlier_writes`): a start with the broker away
# waits no longer
INHERIT_WAIT_S = 2.0
FRESH_OFFSETS_S = 0.5  # the early path's wait for a fresh read of the worker's offsets, when forgotten writes block it
BROKER_TIMEOUT_MAX_S = 5.0  # the longest a durable write waits for the broker's acknowledgement
BROKER_TIMEOUT_MIN_S = 0.5


def broker_timeout_s(registry: NamespaceRegistry) -> float:
    """How long a durable write waits for the broker before its 503: half the smallest accept_limit of a durable
    namespace, within [BROKER_TIMEOUT_MIN_S, BROKER_TIMEOUT_MAX_S]. The API's SQLite stores wait as long for another
    process's lock (query_api.app.build_service), for the same reason.

    Why: the 503 tells the client to retry with the same token and generation_time, and a retry is admitted only
    while its generation_time lies within accept_limit of when it reaches Kafka. Waiting the whole accept_limit (5 s
    in the presets, the old fixed wait) left no time for the retry: it was refused with a 422, and a write whose
    first attempt had not landed was lost. Half leaves the other half for the retry."""
    limits = [ns.accept_limit_s for ns in registry.values() if ns.counter_type is not CounterType.BEST_EFFORT]
    return min(BROKER_TIMEOUT_MAX_S, max(BROKER_TIMEOUT_MIN_S, min(limits, default=BROKER_TIMEOUT_MAX_S) / 2))


def identity_of(written: Written | None) -> Identity | None:
    """A durable write's token and event time (None for a BEST_EFFORT one, which has neither)."""
    if written is None or written.token is None or written.event_time is None:
        return None
    return written.token, written.event_time


@contextlib.contextmanager
def counted_or_retry(written: Written) -> Iterator[None]:
    """Around an AddAndGetCount's wait and read once its write is acknowledged: a store outage there is a 504 with
    the write's token (NotCountedYet), not the 503 of a store away, which says a write was not taken: a review's
    client retried that as a new write (the API had drawn the token), and it was counted twice."""
    try:
        yield
    except NotCountedYet:
        raise  # a TimeoutError, so "unavailable" too: it already says so, with the token (nested before, a review)
    except Exception as exc:
        if not store_unavailable(exc):
            raise
        raise not_counted_yet(written, f"the store could not be read for its count ({exc})") from exc


def not_counted_yet(written: Written, why: str) -> NotCountedYet:
    """AddAndGetCount's 504 for an acknowledged write it could not count: the write is durable, so the answer names
    its token and whether a retry with it is still taken. Past accept_limit a retry is refused as too old (a 422), and
    the multi-worker review saw the read-your-write wait outlast a short accept_limit: the text then says not to."""
    identity = identity_of(written)
    token = identity[0] if identity else None
    return NotCountedYet(f"the write is durable (token {token!r}) but {why}; GetCount will include it "
                         f"({retry_advice(written)})", identity)


def retry_advice(written: Written) -> str:
    """Whether a retry of a durable write with its token and generation_time is counted once or refused as too old,
    judged by the API's clock now (the worker's view of the retry's record can only be later)."""
    ns, event_time = written.ns, written.event_time
    if event_time is None:
        return "a BEST_EFFORT write has no token"
    limit_us = int(ns.accept_limit_s * 1_000_000)
    if time.time_ns() // 1000 - event_time >= limit_us:
        return (f"do not retry: the write is counted, and a retry with its token now is refused as older than "
                f"namespace {ns.name!r}'s accept_limit={ns.accept_limit_s}s")
    return (f"a retry with the same token and generation_time before {micros_iso(event_time + limit_us)}, "
            "within accept_limit of it, is counted once")


def _acknowledged_late(ns: Namespace, token: str, event_time: int, what: str = "write") -> NotCountedYet | None:
    """The 504 of a durable write whose acknowledgement came (now) after its accept_limit, or None
    (control_plane.admission.late_acknowledgement)."""
    reason = late_acknowledgement(event_time, time.time_ns() // 1000, ns)
    if reason is None:
        return None
    return NotCountedYet(f"the {what} is durable (token {token!r}), but {reason}", (token, event_time))


_CLOCK_WARN_EVERY_S = 60.0
_clock_warned = [0.0]  # monotonic time of the last warning about the broker's clock (one a minute)


def refused_by_record(ns: Namespace, token: str, event_time: int, stamp_us: int | None) -> BrokerUnavailable | None:
    """The 503 of a durable write the worker will dead-letter, judged by the timestamp its record carries
    (`stamp_us`: what its acknowledgement settled with, producers.group_commit.Acknowledgement: None when this
    process's clock and the record's agree, and the API's own judgement stands), or None when the worker admits it.
    The record is in Kafka; the write is in the dead-letter topic, not counted, and a retry with its token and
    generation_time is counted once if admitted then."""
    if stamp_us is None or (reason := admission_error(event_time, stamp_us, ns)) is None:
        return None
    now_us = time.time_ns() // 1000
    if time.monotonic() - _clock_warned[0] >= _CLOCK_WARN_EVERY_S:
        _clock_warned[0] = time.monotonic()
        log.warning("a record's timestamp from the broker is %+.3fs from this API's clock, and a write it holds will "
                    "be dead-lettered (%s): synchronize the clocks of the API's and the brokers' hosts (NTP)",
                    (stamp_us - now_us) / MICROS, reason)
    return BrokerUnavailable(
        f"the write (token {token!r}) reached Kafka but will not be counted: {reason}. The broker's timestamp of its "
        f"record disagrees with this API's clock ({micros_iso(now_us)} on acknowledgement), which admitted it; the "
        f"write is in the dead-letter topic; {RETRY_RULE}", (token, event_time))


class CounterService:
    def __init__(self, registry: NamespaceRegistry, *, producer: GroupCommitProducer, signals: ReadSignals,
                 events: EventStore, rollups: RollupStore, cache: RollupCache, counters: BestEffortCounters,
                 buckets: BucketStore | None = None, sketches: SketchStore | None = None,
                 read_your_write_timeout_s: float = 5.0,
                 read_signal_lag_s: float = 5.0, progress: PersistProgress | None = None,
                 shared_pipeline: bool = False) -> None:
        self.registry = registry
        self.producer = producer
        self.signals = signals
        self.events = events
        self.rollups = rollups
        self.buckets = buckets
        self.sketches = sketches  # unique counts (query_api.unique); None when no namespace is UNIQUE
        self.cache = cache
        self.counters = counters
        self.read_your_write_timeout_s = read_your_write_timeout_s
        self.arrivals = Arrivals(events, timeout_s=read_your_write_timeout_s)
        # With the worker's progress known, the writes it has are passed over, so they can be kept longer than
        # they stay admissible (query_api.persist_progress)
        self.progress = progress
        # other API processes write to the same topic: AddAndGetCount waits for the worker to have every write
        # acknowledged before it, wherever it was acknowledged (`earlier_ends`), and never counts early
        self.shared_pipeline = shared_pipeline
        self.early = (Unnoted if shared_pipeline else EarlyPersist)(events, recent_s=2.0 if progress is None else 4.0,
                                                                  progress=progress)
        # the writes acknowledged before this process started (`inherit_earlier_writes`): read once, kept until the
        # worker has them (a shared pipeline reads the topic's ends at every AddAndGetCount anyway)
        self._inherited: dict[int, int] | None = None
        self._inherited_read = shared_pipeline or progress is None
        self.live = LiveReads(events)  # the events after a rollup, read for every reader of a pass at once
        # Namespaces whose accept_limit is so short that even a write dated on arrival may be acknowledged after it
        # (the producer waits that long; max_clock_skew on top, for a margin): usually none.
        wait_s = broker_timeout_s(registry)  # the producer's wait for an acknowledgement (query_api.app)
        self._broker_wait_us = int(wait_s * MICROS)
        self._undated_may_be_late = {ns.name for ns in registry.values()
                                     if ns.counter_type is not CounterType.BEST_EFFORT
                                     and wait_s + ns.max_clock_skew_s >= ns.accept_limit_s}
        self.read_signal_lag_us = int(read_signal_lag_s * MICROS)
        self.watermark_us = 0  # the lowest persist watermark stored (`follow_watermark`); 0: not known
        self.rolled = RolledFloors()  # each namespace's newest rollup (`follow_watermark`): admission keeps after it
        self.bound = CombinationBound(  # max_combinations, checked before a write with dimensions is sent
            lambda namespace, counter: all_combinations(self.rollups, namespace, counter, full_only=True))
        self._plain_add = plain_add()
        if self._plain_add is None:
            log.info("plain AddCounts take the Python path (no current build of query_api/_plain_add.c: "
                     "`python -m query_api.plain_add` compiles it)")
        # the namespaces whose plain AddCount `write_plain` takes (by name: their counter types' names); those of
        # fastpath.fast_call's durable case where every write is noted for read-your-write
        self.plain_types = {ns.name: ns.counter_type.value for ns in registry.values()
                            if ns.counter_type is not CounterType.BEST_EFFORT and not ns.requires_auth
                            and ns.unique is None and eligible(ns)}
        # the C reader of a whole plain AddCount request (`write_plain_request`), None without a build
        self._add_request = self._plain_add.add_request if self._plain_add is not None else None

    def namespace(self, name: str) -> Namespace:
        ns = self.registry.get(name)
        if ns is None:
            shown = name if len(name) <= MAX_NAMESPACE_LEN else name[:MAX_NAMESPACE_LEN] + "..."  # not echoed whole
            raise NamespaceNotFound(f"unknown namespace {shown!r}")
        return ns

    # -- writes -----------------------------------------------------------------------------------------

    def mutation(self, ns: Namespace, counter: str, delta: int, op: MutationOp, token: str | None,
                 generation_time: str | int | float | None, item_key: str = "",
                 dimensions: Mapping[str, Any] | None = None, item: str | None = None) -> Mutation:
        """The mutation a write becomes; refuses times the pipeline would dead-letter (admission).

        `counter` and `delta` arrive validated (the request models and the fast path check them); the token,
        generation time and item key are validated here (ValidationError naming the field). A write without
        a generation time happens now, which admission always accepts. Dimensions and item are checked against
        the namespace (Rejected naming the field); the max_combinations bound is `check_bound`'s."""
        dims, item = self.extras(ns, dimensions, item, op, delta=delta, item_key=item_key)
        event_time, event_id = self.event_identity(ns, token, generation_time)
        if item_key:
            item_key = validate_item_key(item_key)
        return Mutation(ns.name, counter, delta if op is MutationOp.ADD else 0, event_time, event_id, item_key, op,
                        dims, item)

    def event_identity(self, ns: Namespace, token: str | None,
                       generation_time: str | int | float | None) -> tuple[int, str]:
        """A write's event time and token: the generation time if given (validated, and refused where the pipeline
        would dead-letter it: admission), else now; the token if given (validated), else a new one.

        A token without a generation time is refused: an event is its token and generation time together, so a
        retry with the token alone, dated when it arrives, would be a second event (counted twice)."""
        now = time.time_ns() // 1000
        if token is None:
            token = new_token()
        else:
            token = validate_token(token, field="idempotency_token.token")  # the token first, as the routes' model
            if generation_time is None:
                raise Rejected("idempotency_token.generation_time", TOKEN_NEEDS_TIME)
        if generation_time is None:
            return now, token
        event_time = parse_generation_time(generation_time, field="idempotency_token.generation_time")
        reason = (admission_error(event_time, record_time(now), ns)
                  or rolled_past(event_time, self.rolled.floors.get(ns.name, -1), ns))
        if reason is not None:
            raise Rejected("idempotency_token.generation_time", reason)
        return event_time, token

    @staticmethod
    def delta_of(ns: Namespace, delta: int | None) -> int:
        """An add's delta: required in a SUM namespace; in a UNIQUE one absent or 1 (a write counts one item).
        Rejected naming `delta` otherwise."""
        if ns.unique is not None:
            if delta is not None and delta != 1:
                raise Rejected("delta", f"must be 1 or absent in namespace {ns.name!r} (aggregation UNIQUE): a write "
                                        f"counts one item, got {delta}")
            return 1
        if delta is None:
            raise Rejected("delta", "is required (only a UNIQUE namespace's writes may leave it out)")
        return delta

    @staticmethod
    def extras(ns: Namespace, dimensions: Mapping[str, Any] | None, item: str | None,
               op: MutationOp = MutationOp.ADD, *, delta: int | None = 1, item_key: str = "") -> tuple[Dimensions, str]:
        """A write's dimensions (sorted pairs) and item, valid for the namespace; Rejected naming the field (an
        undeclared key: `dimensions.<key>`; in a UNIQUE namespace a missing `item`, a `delta` other than 1, an
        `event_item_key`) otherwise."""
        if not dimensions and not item and ns.unique is None:
            return (), ""
        try:
            dims = validate_dimensions(dimensions)
            valid_item = validate_item(item or "")
        except ValidationError as exc:
            raise Rejected(exc.field, exc.reason) from None
        refusal = extras_refusal(ns, dims, valid_item, op is MutationOp.CLEAR, delta=1 if delta is None else delta,
                                 item_key=item_key)
        if refusal is not None:
            raise Rejected(*refusal)
        return dims, valid_item

    async def check_bound(self, ns: Namespace, counter: str, dimensions: Dimensions) -> None:
        """Refuse (Rejected naming `dimensions`) a write whose full combination is new to a counter that has
        max_combinations already (query_api.combination_bound). Call it once the write is otherwise valid, right
        before it is sent: an admitted combination holds its slot for a while."""
        if not dimensions:
            return
        try:
            await self.bound.admit(ns, counter, combination(counter, dimensions))
        except OverBound as exc:
            raise Rejected("dimensions", str(exc)) from None

    async def check_bounds(self, writes: Sequence[tuple[Namespace, str, Dimensions]]) -> None:
        """`check_bound` for a batch's writes, all admitted or none: OverBound (its `index` names the write) for the
        first past its counter's bound."""
        bounded = [(i, ns, counter, dims) for i, (ns, counter, dims) in enumerate(writes) if dims]
        try:
            await self.bound.admit_all([(ns, counter, combination(counter, dims)) for _, ns, counter, dims in bounded])
        except OverBound as exc:
            raise OverBound(str(exc), bounded[exc.index][0]) from None

    async def write(self, ns: Namespace, counter: str, delta: int, op: MutationOp, token: str | None,
                    generation_time: str | int | float | None, item_key: str = "",
                    dimensions: Mapping[str, Any] | None = None, item: str | None = None) -> Written:
        if ns.counter_type is CounterType.BEST_EFFORT:  # tokens are accepted and ignored, as documented
            if dimensions or item or ns.unique is not None:  # refused on BEST_EFFORT
                dims, _ = self.extras(ns, dimensions, item, op, delta=delta, item_key=item_key)
                await self.check_bound(ns, counter, dims)
            if op is MutationOp.CLEAR:
                await self.counters.clear(ns.name, counter)
                return Written(ns, counter, None, None, 0)
            return Written(ns, counter, None, None, await self.add_best_effort(ns, counter, delta))
        written, acknowledged = await self.write_bounded(ns, counter, delta, op, token, generation_time, item_key,
                                                         dimensions, item)
        await self.acknowledged(acknowledged, written)
        return written

    async def write_bounded(self, ns: Namespace, counter: str, delta: int, op: MutationOp, token: str | None,
                            generation_time: str | int | float | None, item_key: str = "",
                            dimensions: Mapping[str, Any] | None = None, item: str | None = None, *,
                            then_count: bool = False) -> tuple[Written, Acknowledgement]:
        """`write_durable` of a write that may have dimensions: its max_combinations bound is checked once it is
        otherwise valid, right before it is sent, so a write refused for its token or time takes no slot."""
        m = self.mutation(ns, counter, delta, op, token, generation_time, item_key, dimensions, item)
        await self.check_bound(ns, counter, m.dimensions)
        return self.send_mutation(ns, m, then_count=then_count)

    def write_durable(self, ns: Namespace, counter: str, delta: int, op: MutationOp, token: str | None,
                      generation_time: str | int | float | None, item_key: str = "",
                      dimensions: Mapping[str, Any] | None = None, item: str | None = None, *,
                      then_count: bool = False) -> tuple[Written, Acknowledgement]:
        """A durable (EVENTUAL/ACCURATE) write, group-committed: what to answer, and the future of the broker's
        acknowledgement (failing with DeliveryError). Plain, so the fast path can answer from a callback.
        `then_count`: the caller answers with the count including it (AddAndGetCount, `count_after`). Where this
        process does not store the event itself (not `eligible`, or a shared pipeline), it waits for the worker, so
        the record is marked read-your-write and persisted promptly."""
        return self.send_mutation(ns, self.mutation(ns, counter, delta, op, token, generation_time, item_key,
                                                    dimensions, item), then_count=then_count)

    def send_mutation(self, ns: Namespace, m: Mutation, *, then_count: bool = False) -> tuple[Written, Acknowledgement]:
        """`write_durable`'s send of a mutation already made (`mutation`)."""
        waits = then_count and (self.shared_pipeline or not eligible(ns))
        acknowledged = self.producer.send([m], read_your_write=waits)
        if eligible(ns):
            self.early.note(m, acknowledged)  # a later AddAndGetCount of the counter stores it with its own
        return Written(ns, m.counter_name, m.event_id, m.event_time), acknowledged

    def write_plain(self, body: bytes) -> tuple[bytes, Acknowledgement, int] | None:
        """`write_durable` for an AddCount body in its plainest form, read and encoded in C (query_api.plain_add):
        the answer's JSON and the future of the broker's acknowledgement. None when the body is not that form, the
        namespace is not in `plain_types`, the token or generation time is invalid (the route names the field) or
        the C build is absent: the caller takes the Python path. Rejected when admission refuses the time. The
        event time comes along: a failure answers it with the token (query_api.responses.error_response)."""
        plain = self._plain_add
        if plain is None or (read := plain.read_add(body, self.plain_types)) is None:
            return None
        namespace, counter, delta, counter_type, token, generation_time = read
        if token is None and generation_time is None:  # the commonest write: no validation to do
            event_time, token = time.time_ns() // 1000, new_token()
        else:
            try:
                event_time, token = self.event_identity(self.registry[namespace], token, generation_time)
            except ValidationError:
                return None
        encoded = plain.encode_add(namespace, counter, delta, counter_type, event_time, token)
        if encoded is None:  # a token the answer would have to escape
            return None
        avro_body, answer = encoded
        acknowledged = self.producer.send_body(avro_body)
        self.early.note_event(namespace, counter, (event_time, token, "", delta, False), acknowledged)
        if generation_time is not None or namespace in self._undated_may_be_late:  # as write_plain_request
            return answer, self.late_checked(acknowledged, self.registry[namespace], event_time, token), event_time
        return answer, acknowledged, event_time

    def late_checked(self, acknowledged: Acknowledgement, ns: Namespace, event_time: int,
                     token: str) -> Acknowledgement:
        """`acknowledged`, or, for a write dated so early that its acknowledgement could come after its accept_limit
        (`acknowledged`'s check), a future of its own that fails with NotCountedYet then. Only such writes get a
        future and a callback: a plain AddCount otherwise shares its record's. Every path that answers a durable
        AddCount from its acknowledgement takes it (one did not, and answered 200 for a write the worker then
        dead-lettered: a review). `acknowledged` returned as it is may still settle with the record's timestamp
        (`refused_by_record`, which its consumer applies)."""
        if late_acknowledgement(event_time, time.time_ns() // 1000 + self._broker_wait_us, ns) is None:
            return acknowledged  # even acknowledged at the last moment the producer waits, it is admitted
        checked: Acknowledgement = asyncio.get_running_loop().create_future()

        def settle(record: Acknowledgement) -> None:
            if checked.done():
                return
            if record.cancelled():
                checked.cancel()
            elif (exc := record.exception()) is not None:
                checked.set_exception(exc)
            elif refused := refused_by_record(ns, token, event_time, record.result()):
                checked.set_exception(refused)
            elif late := _acknowledged_late(ns, token, event_time):
                checked.set_exception(late)
            else:
                checked.set_result(None)
        acknowledged.add_done_callback(settle)
        return checked

    def write_plain_request(self, data: bytes) -> tuple[bytes, Acknowledgement, int] | None:
        """`write_plain` for a whole request (query_api.http_protocol's shortcut): one C call reads the request and,
        when it brings no token, draws the event's time and token and encodes it (`_plain_add.add_request`); one
        that brings a token or a generation time goes through `write_plain`. None when `data` is not one plain
        AddCount request of a plain namespace (the HTTP parser then reads it)."""
        add = self._add_request
        if add is None or (taken := add(data, self.plain_types)) is None:
            return None
        if isinstance(taken, bytes):  # its own token or generation time, validated in Python
            return self.write_plain(taken)
        avro_body, answer, key, event = taken
        acknowledged = self.producer.send_body(avro_body)
        self.early.note_keyed(key, event, acknowledged)
        if self._undated_may_be_late and (ns := self.registry[key.split(":", 1)[0]]).name in self._undated_may_be_late:
            return answer, self.late_checked(acknowledged, ns, event[0], event[1]), event[0]
        return answer, acknowledged, event[0]

    def add_best_effort(self, ns: Namespace, counter: str, delta: int) -> Awaitable[int]:
        """A BEST_EFFORT add (memcached only): the new count. An awaitable rather than a coroutine, so the fast
        path can settle the response in a callback."""
        return self.counters.add(ns.name, counter, delta, ns.ttl_s)

    async def send_durably(self, mutations: Sequence[Mutation]) -> None:
        """Return once the broker acknowledged every mutation (one record: all or none); BrokerUnavailable
        otherwise, and NotCountedYet when one was acknowledged after its accept_limit (the worker may refuse it)."""
        acknowledged = self.producer.send(mutations)
        for m in mutations:
            ns = self.registry.get(m.namespace)
            if ns is not None and eligible(ns):
                self.early.note(m, acknowledged)  # as write_durable does
        stamp = await self.acknowledged(acknowledged)
        for m in mutations:
            ns = self.registry.get(m.namespace)
            if ns is None or m.event_id is None or m.event_time is None:
                continue
            if refused := refused_by_record(ns, m.event_id, m.event_time, stamp):
                raise refused  # the batch route answers it with every entry's identity: a retry counts each once
            if late := _acknowledged_late(ns, m.event_id, m.event_time, f"{m.namespace}:{m.counter_name}"):
                raise late

    @staticmethod
    async def acknowledged(future: Acknowledgement, written: Written | None = None) -> int | None:
        """Wait for the broker's acknowledgement of a durable write: BrokerUnavailable when it fails or the worker
        will refuse the write by its record's timestamp (`refused_by_record`), NotCountedYet when it came after the
        write's accept_limit, so the worker may refuse it (control_plane.admission.late_acknowledgement; only a
        write whose client dated it near the end of accept_limit, and a slow broker). Without `written`, what the
        acknowledgement settled with, for the caller to judge its writes by."""
        try:
            stamp = await future
        except DeliveryError as exc:
            raise BrokerUnavailable(str(exc), identity_of(written)) from exc
        if written is not None and written.token is not None and written.event_time is not None:
            if refused := refused_by_record(written.ns, written.token, written.event_time, stamp):
                raise refused
            if late := _acknowledged_late(written.ns, written.token, written.event_time):
                raise late
        return stamp

    # -- reads ------------------------------------------------------------------------------------------

    async def rollup_of(self, ns: Namespace, counter: str) -> tuple[int, int]:
        """(count, rollup_ts): the cached rollup, else the rollup store's (then cached)."""
        cached = await self.cache.get(ns.name, counter)
        if cached is not None:
            metrics.count_cache(hit=True)
            return cached
        metrics.count_cache(hit=False)
        state = await self.rollups.get(ns.name, counter)
        if state is None or state.rollup_ts == 0:
            return (state.count if state else 0), 0
        await self.cache.advance(ns.name, counter, state.count, state.rollup_ts, ns.ttl_s)  # a rollup cached
        # since the read is newer: it stays
        return state.count, state.rollup_ts

    async def get(self, ns: Namespace, counter: str) -> Count:
        if ns.counter_type is CounterType.BEST_EFFORT:
            return Count(ns, counter, await self.counters.get(ns.name, counter), None)
        count, rollup_ts = await self.rollup_of(ns, counter)
        self.signal_if_stale(ns, counter, rollup_ts)
        if ns.counter_type is CounterType.ACCURATE:
            count = await self.live_count(ns, counter, count, rollup_ts)
        return Count(ns, counter, count, rollup_ts or None)

    def signal_if_stale(self, ns: Namespace, counter: str, rollup_ts: int) -> None:
        """A read repairs a stale counter: signal a rollup when its rollup lags the newest boundary possible
        now (by the persist watermark, when known) by more than `read_signal_lag_s`. A converged counter read in
        a loop then costs the workers one rollup per lag period (shared by every API process) instead of one
        per read, and none while the watermark stands still (idle workers send no heartbeats once every write is
        covered: a rollup could not move); written counters are signalled by the persist path anyway (so an
        AddAndGetCount, a write, sends none), and the sweep repairs lost signals.

        A counter never rolled up (`rollup_ts` 0) is not signalled: either nothing was ever written to it, and a
        rollup would store a row and a cache entry for a name only read (the scale review: 100,000 reads of new
        names made 100,000 of each, and a minute of the worker's rollups), or its first events are persisted, and
        the persist path signalled it (the sweep, every `COUNTER_SWEEP_INTERVAL_S`, repairs a lost signal: its
        row's last write is past its rollup)."""
        now_us = time.time_ns() // 1000
        if rollup_ts and rollup_ts < rollup_boundary(now_us, self.watermark_us or now_us, ns) - self.read_signal_lag_us:
            self.signals.emit(ns.name, counter)

    async def follow_watermark(self, topic: str, every_s: float = 1.0) -> None:
        """Keep `watermark_us` at the lowest watermark the workers stored for `topic`'s partitions (runs until
        cancelled). A hint for `signal_if_stale`: a partition without one yet is left out, and a failed read
        keeps the last value."""
        while True:
            try:
                marks = await self.rollups.watermarks(topic)
                self.watermark_us = min(marks.values(), default=0)
                await self.rolled.refresh(self.rollups, self.registry)  # what admission refuses (sinks.rolled)
            except Exception as exc:  # the store away for a moment: signals fall back to the last value
                log.warning("persist watermark not read: %s", exc)
            await asyncio.sleep(every_s)

    async def live_count(self, ns: Namespace, counter: str, rollup_count: int, rollup_ts: int) -> int:
        """Rollup plus the persisted events after it; a clear among them resets the sum."""
        return await self.live.plus_live(ns.name, counter, rollup_count, rollup_ts, self._live_horizon(ns))

    @staticmethod
    def _live_horizon(ns: Namespace) -> int:
        """The newest event time a live read looks at: the latest admissible, with a minute to spare."""
        return time.time_ns() // 1000 + int((ns.max_clock_skew_s + 60) * MICROS)

    # -- time windows -----------------------------------------------------------------------------------

    async def get_window(self, ns: Namespace, counter: str, spec: Mapping[str, object], *,
                         now_us: int | None = None) -> WindowedCount:
        """GetCount over a window: the buckets tiling it (coarsest first); ACCURATE adds the live events in the
        window after the buckets' boundary, honouring a live clear. `now_us`: the time a `last` window ends at
        (default: now), so the counts of one group_by share one window."""
        windowed(ns)
        now = time.time_ns() // 1000 if now_us is None else now_us
        start, end = parse_window(spec, now)
        # The rollup before the buckets: a rollup writes its buckets before its rollup_ts, so buckets read after
        # are at least as fresh. Read the other way round, a rollup landing in between moved as_of past buckets
        # that did not hold it, and the live delta of an ACCURATE read started after events no bucket counted.
        _, rollup_ts = await self.rollup_of(ns, counter)
        # buckets: the app always opens them (None only for a service built without windows, in tests)
        counted = await window_count(self.buckets, ns, counter, start, end, now_us=now)  # type: ignore[arg-type]
        self.signal_if_stale(ns, counter, rollup_ts)
        as_of = max(rollup_ts, counted.upto_us)
        count = counted.count
        if ns.counter_type is CounterType.ACCURATE:  # the window's events after the buckets' boundary
            horizon = self._live_horizon(ns)  # and a clear after the window that no bucket has applied yet
            count = await self.live.plus_live(ns.name, counter, count, max(as_of, counted.start_us - 1),
                                              min(counted.end_us - 1, horizon), clears_upto_us=horizon)
        return WindowedCount(ns, counter, count, counted.start_us, counted.end_us, as_of or None)

    async def get_series(self, ns: Namespace, counter: str, granularity: str, start: str | int | float,
                         end: str | int | float | None) -> tuple[Series, int | None]:
        """GetCountSeries: the granularity's buckets over [start, end), zero-filled, and their as_of."""
        windowed(ns, field="namespace")  # the series has no `window` to name
        now = time.time_ns() // 1000
        start_us = _window_time(start, "start")
        end_us = now if end is None else _window_time(end, "end")
        _, rollup_ts = await self.rollup_of(ns, counter)  # before the buckets, as get_window reads them (a review)
        # buckets: the app always opens them (None only for a service built without windows, in tests)
        result = await series(self.buckets, ns, counter, granularity, start_us, end_us,  # type: ignore[arg-type]
                              now_us=now)
        return result, max(rollup_ts, result.upto_us) or None

    async def get_top_k(self, ns: Namespace, k: int, window: Mapping[str, object],
                        dimensions: Mapping[str, Any] | None = None) -> Ranked:
        """GetTopK: the k counters (of the `dimensions` filter) with the highest counts in the window, from the rank
        lists of its buckets (query_api.topk). `as_of`: the oldest rollup_ts among the counters returned (their
        counts are exact up to it); a read of a lagging one signals it, as GetCount does."""
        windowed(ns)
        if ns.counts_unique:
            raise Rejected("namespace", f"namespace {ns.name!r} counts distinct items (UNIQUE): GetTopK ranks counts, "
                                        "not estimates of distinct items")
        dims, _ = self.dimension_filter(ns, dimensions, None)
        now = time.time_ns() // 1000
        start, end = parse_window(window, now)
        # buckets: the app always opens them (None only for a service built without windows, in tests)
        async def rollups_of(names: list[str]) -> dict[str, int]:  # before their counts: see top_k
            states = await self.rollups.get_many([(ns.name, name) for name in names])
            return {name: state.rollup_ts for (_ns, name), state in states.items()}

        top = await top_k(self.buckets, ns, k, start, end, dims, now_us=now,  # type: ignore[arg-type]
                          rollups_of=rollups_of)
        for (counter, _count), rollup_ts in zip(top.items, top.marks, strict=True):
            self.signal_if_stale(ns, combination(counter, dims), rollup_ts)
        as_of = min(top.marks) if top.marks and all(top.marks) else None
        return Ranked(ns, k, dims, top, as_of)

    async def add_and_get(self, ns: Namespace, counter: str, delta: int, token: str | None,
                          generation_time: str | int | float | None, item_key: str = "",
                          dimensions: Mapping[str, Any] | None = None, item: str | None = None) -> Count:
        """Read-your-write: the count includes this delta, or NotCountedYet after a bounded wait. With dimensions,
        the count is the counter's (all its writes)."""
        if ns.counter_type is CounterType.BEST_EFFORT:
            written = await self.write(ns, counter, delta, MutationOp.ADD, token, generation_time, item_key,
                                       dimensions, item)
            return Count(ns, counter, written.value, None)  # type: ignore[arg-type]  # BEST_EFFORT: the new count
        written, acknowledged = await self.write_bounded(ns, counter, delta, MutationOp.ADD, token, generation_time,
                                                         item_key, dimensions, item, then_count=True)
        return await self.count_after(written, acknowledged, item_key)

    async def count_after(self, written: Written, acknowledged: Acknowledgement, item_key: str = "") -> Count:
        """The count once a durable write is acknowledged and persisted: AddAndGetCount's read-your-write. In an
        eligible namespace of an API process that writes alone this process stores the event itself, with its
        recent writes of the counter before it, and reads the count in the same store call
        (query_api.early_persist), instead of waiting for the worker."""
        await self.acknowledged(acknowledged, written)
        ns, counter = written.ns, written.counter
        # a durable write always has its event time and token (write_durable sets them)
        event_time, token = written.event_time, written.token
        assert event_time is not None and token is not None, "a durable write has its event time and token"
        with counted_or_retry(written):
            if not self.shared_pipeline:  # shared: writes of other processes, which this one cannot store, may
                early = await self.counted_early(ns, counter, event_time, token)  # precede it
                if early is not None:
                    return early
            await self.wait_counted(written, item_key)
            count, rollup_ts = await self.rollup_of(ns, counter)  # no read signal: the write's own persist signals it
            return Count(ns, counter, await self.live_count(ns, counter, count, rollup_ts), rollup_ts or None)

    async def wait_counted(self, written: Written, item_key: str = "") -> None:
        """Wait until the worker has persisted an acknowledged durable write (its event is in the store) and every
        durable write acknowledged before it (`earlier_ends`), which may be in partitions the worker has not
        reached; NotCountedYet after the read-your-write wait."""
        assert identity_of(written) is not None, "a durable write has its event time and token"
        deadline = time.monotonic() + self.read_your_write_timeout_s
        ends = await self.earlier_ends(written)
        await self.wait_persisted(written, item_key)
        if ends is not None:
            await self.wait_worker_has(ends, written, max(0.0, deadline - time.monotonic()))

    async def earlier_ends(self, written: Written) -> dict[int, int] | None:
        """Per partition of the mutations topic, an offset below which every durable write acknowledged so far
        lies: this process's records (the group commit's acknowledged ends) and, in a shared pipeline, every API
        process's (the topic's end offsets, read now). None for a process that writes alone and cannot read the
        worker's progress (the broker refuses or does not answer the persist group's offsets): it then waits for its
        own write only (query_api.persist_progress)."""
        await self.inherit_earlier_writes()
        progress = self.progress
        if progress is None or (progress.failing and not self.shared_pipeline):
            return None
        ends = progress.acked_ends()
        if self._inherited is not None:
            if progress.covers(self._inherited):
                self._inherited = None  # the worker has every write of the processes before this one
            else:
                ends = furthest(ends, self._inherited)
        if self.shared_pipeline:
            try:
                topic = await progress.topic_ends()
            except Exception as exc:  # without them the count could miss another process's earlier write
                raise not_counted_yet(written, f"the mutations topic's end offsets could not be read ({exc})") from exc
            ends = furthest(ends, topic)
        return ends

    async def inherit_earlier_writes(self) -> None:
        """Once per process, at its start (else at its first read-your-write): the mutations topic's end offsets,
        below which lie the durable writes acknowledged before this process started. An API restarted on the same
        port (`counter up` restarts a killed one) knew none of its predecessor's, and a review's AddAndGetCount
        answered 6 for a count of 31: an acknowledged ClearCount and three adds the lagging worker had not persisted
        were left out. Until the worker has them, AddAndGetCount waits for it (`earlier_ends`) and stores nothing
        early (`EarlyPersist.inherit`). A failed read is tried again at the next call, whose ends then hold this
        process's writes so far too (only waited for; meanwhile, as when the worker's progress cannot be read, only
        this process's own writes are)."""
        if self._inherited_read:
            return
        assert self.progress is not None  # `_inherited_read` is set without it
        try:
            ends = await asyncio.wait_for(self.progress.topic_ends(), INHERIT_WAIT_S)
        except Exception as exc:
            log.debug("the mutations topic's end offsets could not be read (%s): read again at the next "
                      "AddAndGetCount", exc)
            return
        if not self._inherited_read:  # another call read them meanwhile
            self._inherited_read = True
            self._inherited = ends
            self.early.inherit(ends)

    async def counted_early(self, ns: Namespace, counter: str, event_time: int, token: str) -> Count | None:
        """Store an acknowledged write's event now, with this process's recent writes of the counter, and count
        the counter with them, if the namespace is eligible and the worker is sure to admit these events
        (query_api.early_persist); None to wait for the worker instead."""
        if not eligible(ns):
            return None
        await self.inherit_earlier_writes()
        rows = self.early.rows(ns, counter)  # acknowledged and admissible only
        # Blocked by forgotten writes, perhaps only for offsets not read lately (an idle poll; a loaded broker answering
        # slowly): a fresh read may show the worker has them, which beats waiting for the worker (a CI run's 504 with
        # the worker frozen after it had committed everything)
        if (rows.blocked and (forgotten := self.early.forgotten) is not None and self.progress is not None
                and await self.progress.wait_covers(forgotten, FRESH_OFFSETS_S)):
            rows = self.early.rows(ns, counter)
        if rows.blocked or not any(row[2] == event_time and row[3] == token for row in rows):
            return None  # its own write or an earlier one is not admissible here: the worker's to store
        count, rollup_ts = await self.rollup_of(ns, counter)  # no read signal: the worker's persist of it signals
        try:
            live = await self.early.store_and_count(rows, ns.name, counter, count, rollup_ts, self._live_horizon(ns))
        except Exception:  # logged by EarlyPersist; the worker will store them
            return None
        return Count(ns, counter, live, rollup_ts or None)

    async def wait_worker_has(self, ends: Mapping[int, int], written: Written, timeout_s: float) -> None:
        """Wait until the worker has persisted every record before `ends` (`earlier_ends`): an AddAndGetCount that
        this process does not count itself (the worker lags, one of its writes is not admissible here any more, the
        namespace is not eligible, or the pipeline is shared) counts the earlier acknowledged writes of the counter
        too, wherever they are."""
        assert self.progress is not None
        if not await self.progress.wait_covers(ends, timeout_s):
            raise not_counted_yet(written, f"earlier writes were not persisted within "
                                           f"{self.read_your_write_timeout_s}s of its acknowledgement")

    async def wait_persisted(self, written: Written, item_key: str) -> None:
        """Wait until the worker has stored the write's own event (query_api.arrivals)."""
        assert written.token is not None and written.event_time is not None, "a durable write"
        key = (written.counter, written.event_time, written.token, item_key)
        if not await self.arrivals.wait(written.ns.name, key):
            raise not_counted_yet(written, f"was not counted within {self.read_your_write_timeout_s}s of its "
                                           "acknowledgement")


    # -- dimensions -------------------------------------------------------------------------------------

    @staticmethod
    def dimension_filter(ns: Namespace, dimensions: Mapping[str, Any] | None,
                         group_by: str | None) -> tuple[Dimensions, str | None]:
        """A read's `dimensions` filter (sorted pairs) and `group_by` key, valid for the namespace; Rejected
        naming the field otherwise (an undeclared key, group_by repeating a filter key, BEST_EFFORT)."""
        if not dimensions and group_by is None:
            return (), None
        if ns.counter_type is CounterType.BEST_EFFORT:
            raise Rejected("dimensions" if dimensions else "group_by",
                           f"namespace {ns.name!r} is BEST_EFFORT: it keeps no dimension combinations")
        try:
            dims = validate_dimensions(dimensions)
            key = None if group_by is None else validate_dimension_key(group_by, field="group_by")
        except ValidationError as exc:
            raise Rejected(exc.field, exc.reason) from None
        refusal = ns.dimensions.refusal(ns.name, dims)
        if refusal is not None:
            raise Rejected(*refusal)
        if key is not None:
            if key not in ns.dimensions.keys:
                declared = ", ".join(ns.dimensions.keys) or "none"
                raise Rejected("group_by", f"dimension {key!r} is not declared by namespace {ns.name!r} "
                                           f"(it declares {declared})")
            if key in dict(dims):
                raise Rejected("group_by", f"{key!r} is already filtered on in dimensions: group by another key")
        return dims, key

    async def group_names(self, ns: Namespace, counter: str, dimensions: Dimensions,
                          group_by: str) -> list[tuple[str, str]]:
        """`(value, combination)` of each registered combination with exactly the filter's keys plus `group_by`
        and the filter's values, by value: one registry range (the combinations sharing the name's prefix up
        to `group_by=`), filtered here."""
        before = [(k, v) for k, v in dimensions if k < group_by]
        prefix = f"{combination(counter, before)} {group_by}="
        keys = sorted([*(k for k, _ in dimensions), group_by])
        wanted = dict(dimensions)
        out = []
        for name in await all_combinations(self.rollups, ns.name, counter, prefix=prefix):
            try:
                base, pairs = split_combination(name)
            except ValueError:
                continue
            found = dict(pairs)
            if base == counter and sorted(found) == keys and all(found[k] == v for k, v in wanted.items()):
                out.append((found[group_by], name))
        return sorted(out)

    async def get_groups(self, ns: Namespace, counter: str, dimensions: Dimensions, group_by: str,
                         window: Mapping[str, object] | None = None) -> Grouped:
        """GetCount with group_by (and maybe a window): the filter's total and each group's count."""
        names = await self.group_names(ns, counter, dimensions, group_by)
        total_name = combination(counter, dimensions)
        counted: list[Count | WindowedCount] = []
        todo = [total_name, *(name for _, name in names)]
        now = time.time_ns() // 1000
        for i in range(0, len(todo), GROUP_READS):
            chunk = todo[i:i + GROUP_READS]
            if window is None:
                counted.extend(await asyncio.gather(*(self.get(ns, name) for name in chunk)))
            else:
                counted.extend(await asyncio.gather(*(self.get_window(ns, name, window, now_us=now)
                                                      for name in chunk)))
        marks = [c.rollup_ts if isinstance(c, Count) else c.as_of for c in counted]
        as_of = None if any(not m for m in marks) else min(m for m in marks if m)
        total = counted[0]
        groups = [(value, c.count) for (value, _), c in zip(names, counted[1:], strict=True)]
        if isinstance(total, WindowedCount):
            return Grouped(ns, counter, dimensions, group_by, groups, total.count, as_of, total.start_us,
                           total.end_us)
        return Grouped(ns, counter, dimensions, group_by, groups, total.count, as_of)


def _window_time(value: str | int | float, field: str) -> int:
    try:
        return parse_generation_time(value, field=field)
    except ValidationError as exc:
        raise WindowError(exc.reason, field=field) from None
