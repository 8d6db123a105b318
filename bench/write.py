"""Durable writes over HTTP (EVENTUAL and ACCURATE AddCount, AddAndGetCount) next to a raw produce.

    python -m bench.write [--duration 5] [--concurrencies 1,32,256] [--counters 1000] [--rounds 3] [--namespaces F]

What a user sees: one AddCount per HTTP request, answered once the broker acknowledged it, in the namespaces a
fresh `counter up` serves (the shipped example file: `my_dataset` EVENTUAL, `my_dataset_accurate` ACCURATE, the
post's LOW presets, a 10 s rollup coalescing window); `--namespaces bench/namespaces.yaml` runs them with the
other benchmarks' 500 ms window instead, which makes the worker roll every counter up 20 times as often.

The baseline, in the same run on the same broker, is what a Kafka client alone does: aiokafka `send_and_wait` of
one record per call (acks=all; the same CountMutation record the API produces) at the same concurrency, to a
topic of the same shape that no worker reads. AddAndGetCount (read-your-write: acknowledged, persisted, read
back) is measured at the middle concurrency, and there too EVENTUAL AddCount as the Netflix post's request has it,
with an `idempotency_token` (a token of its own and the current time as `generation_time`, made per request by the
load generator, as a client retrying safely does). Every phase runs once per round; figures are medians over the
rounds. At the end the benchmark waits until every acknowledged write is counted in the rollup store, exactly.

Three ceilings, measured in the same rounds, say where the gap to the raw produce comes from: the HTTP floor (a
no-op uvloop + httptools server, `bench.http_floor`) at each concurrency, what one HTTP exchange costs the load
generator and the kernel; at the middle concurrency, the group-commit floor (`bench.group_commit_floor`), the server
answering each POST once the broker has acknowledged a record holding its body, group-committed through the API's
own producer as the API does, with none of the API's work per request (no JSON, validation, token, Avro body or
bookkeeping): what HTTP plus group commit allow against the raw produce, so the rest of AddCount's gap is the
API's own work (only there: the local broker's later fetches pay for every record it adds); and, there too,
EVENTUAL AddCount with the pipeline paused (the
workers frozen with SIGSTOP for the phase, at most 5 s so their group sessions survive): the API's own path,
HTTP plus group commit plus the broker's produce, without the persist pipeline sharing the cores. A fourth,
"tail read", adds back only the broker's side of the pipeline: the workers stay frozen while a consumer
that keeps nothing reads the mutations topic at its tail with the persist consumer's fetch settings
(`bench.broker_fetch.tail_reader`). The local broker pays for each fetch by the length of the partitions it reads
(`counter bench broker-fetch`), so this phase says how much of the gap the broker's reads alone cost; Apache Kafka
answers a tail fetch from its offset index. The writes of the paused phases are counted like the others once the
workers resume.

Every phase is also measured from outside (`bench.stack_meter`): CPU per request of the API, the workers, the
broker and the load generator, how busy the machine was, and from the API's /metrics how many writes each
group-commit record carried and how long the broker took to acknowledge one. A machine well short of fully busy
means the requests waited on one another (the group-commit cycle), not on the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from bench.broker_fetch import tail_reader
from bench.common import (
    console,
    ensure_baseline_topic,
    group_commit_floor,
    http_floor,
    local_stack,
    progress_bar,
    stack_settings,
    wait_exact,
    write_result,
)
from bench.loadgen import Call, LoadResult, Meter, closed_loop, http_load, http_post
from bench.rounds import median_ratio, medians, run_rounds
from bench.stack_meter import StackMeter
from control_plane import default_config_path
from infra.stack import LocalStack
from producers import CounterProducer
from schemas import MutationOp, encode_mutation

RAW_TOPIC = "bench-raw-produce"
FLOOR_TOPIC = "bench-group-commit-floor"  # what the group-commit floor produces to; no worker reads it
PAUSED_MAX_S = 5.0  # a paused worker misses its heartbeats: stay under the group session timeout (10 s)
NAMESPACES = {"eventual": "my_dataset", "accurate": "my_dataset_accurate"}


def raw_produce_load(bootstrap: str, values: list[tuple[bytes, bytes]], *, concurrency: int, duration_s: float,
                     on_progress: Callable[[int], None] | None = None, meter: Meter | None = None) -> LoadResult:
    """aiokafka send_and_wait of one record per call, `concurrency` calls in flight (acks=all)."""
    async def run() -> LoadResult:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
        await producer.start()

        async def send(i: int) -> bool:
            key, value = values[i % len(values)]
            try:
                await producer.send_and_wait(RAW_TOPIC, value, key=key)
                return True
            except KafkaError:
                return False

        async def connect() -> tuple[Call, Callable[[], object]]:
            return send, lambda: None

        try:
            return await closed_loop(connect, concurrency=concurrency, duration_s=duration_s, on_progress=on_progress,
                                     meter=meter)
        finally:
            await producer.stop()
    return asyncio.run(run())


def paused_pipeline(stack: LocalStack, load: Callable[..., LoadResult], caught_up: Callable[[], bool],
                    beside: Callable[[], AbstractContextManager[None]] = nullcontext) -> Callable[..., LoadResult]:
    """`load` run with every worker frozen (SIGSTOP), for at most PAUSED_MAX_S, inside `beside()` (the tail reader,
    or nothing); after it the workers resume and `caught_up()` waits until they counted the backlog, so the next
    phase does not pay for this one."""
    def run(**kw: object) -> LoadResult:
        for worker in stack.workers:
            worker.pause()
        try:
            with beside():
                return load(**{**kw, "duration_s": min(PAUSED_MAX_S, float(kw["duration_s"]))})  # type: ignore[arg-type]
        finally:
            for worker in stack.workers:
                worker.resume()
            if not caught_up():
                console.print("[red]the workers did not count the paused phase's writes in time[/red]")
    return run


class TokenedAdds:
    """AddCount requests with idempotency tokens, one of its own per request: request i (`self(i)`, a request
    factory for `bench.loadgen.http_load`) adds 1 to `names[i % n]` with token `<prefix>-<i>` and the current time as
    its generation time (ISO 8601, milliseconds), made when it is sent; `acked[i % n]` counts its counter. The body is
    formatted from a template and the time string is made once a millisecond, so the load generator pays little
    more per request than a compiled client would."""

    def __init__(self, namespace: str, names: list[str], prefix: str) -> None:
        self.names = [name.encode() for name in names]
        self.template = (b'{"namespace":"%s","counter_name":"%%s","delta":1,"idempotency_token":{"token":"%s-%%d",'
                         b'"generation_time":"%%s"}}' % (namespace.encode(), prefix.encode()))
        self._ms, self._now = -1, b""

    def __call__(self, i: int) -> bytes:
        ms = time.time_ns() // 1_000_000
        if ms != self._ms:
            self._ms = ms
            self._now = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")[:-6].encode() + b"Z"
        return http_post("/v1/AddCount", self.template % (self.names[i % len(self.names)], i, self._now))


def add_latency_ratios(result: dict, base: dict) -> None:
    """`p50_to_raw` and `p99_to_raw`: a phase's latency percentiles over the raw produce's at its concurrency."""
    for p in ("p50", "p99"):
        result[f"{p}_to_raw"] = result[f"{p}_ms"] / base[f"{p}_ms"] if base[f"{p}_ms"] else float("nan")


def run(duration: float, concurrencies: list[int], counters: int, rounds: int, namespaces: Path) -> dict:
    middle = concurrencies[len(concurrencies) // 2]
    with (tempfile.TemporaryDirectory(prefix="bench-write-") as tmp,
          local_stack(Path(tmp), COUNTER_NAMESPACES=str(namespaces)) as stack, http_floor(Path(tmp)) as floor,
          group_commit_floor(Path(tmp), stack.env["COUNTER_KAFKA_BOOTSTRAP"], FLOOR_TOPIC,
                             stack_settings(stack).api_group_commit_hold_ms) as gc_floor):
        api = stack.apis[0]
        bootstrap = stack.env["COUNTER_KAFKA_BOOTSTRAP"]
        settings = stack_settings(stack)
        ensure_baseline_topic(bootstrap, RAW_TOPIC)
        names = [f"w-{i}" for i in range(counters)]
        bodies = {kind: [http_post("/v1/AddCount", json.dumps({"namespace": ns, "counter_name": n,
                                                                "delta": 1}).encode()) for n in names]
                  for kind, ns in NAMESPACES.items()}
        add_and_get = [http_post("/v1/AddAndGetCount", json.dumps({"namespace": "my_dataset", "counter_name": n,
                                                                   "delta": 1}).encode()) for n in names]
        raw = [(f"my_dataset:{n}".encode(),
                encode_mutation(CounterProducer.mutation(MutationOp.ADD, "my_dataset", n, 1))) for n in names]
        acked = {kind: [0] * counters for kind in NAMESPACES}
        acked_get = [0] * counters
        with progress_bar("warm-up", None) as update:
            http_load(api.host, api.port, bodies["eventual"], concurrency=middle, duration_s=2, on_progress=update,
                      acked=acked["eventual"])
            raw_produce_load(bootstrap, raw, concurrency=middle, duration_s=1)

        def expected() -> dict[tuple[str, str], int]:
            """Every acknowledged write so far, per counter."""
            out = {("my_dataset_accurate", n): a for n, a in zip(names, acked["accurate"], strict=True) if a}
            for n, added, got in zip(names, acked["eventual"], acked_get, strict=True):
                if added + got:
                    out[("my_dataset", n)] = added + got
            return out

        def addcount(kind: str, c: int) -> Callable[..., LoadResult]:
            """AddCount in the namespace of `kind` at concurrency `c`, counting what was acknowledged."""
            return lambda **kw: http_load(api.host, api.port, bodies[kind], concurrency=c, acked=acked[kind], **kw)

        loads = itertools.count()

        def addcount_tokened(c: int) -> Callable[..., LoadResult]:
            """EVENTUAL AddCount with a token of its own per request (each load its own tokens)."""
            return lambda **kw: http_load(api.host, api.port, TokenedAdds("my_dataset", names, f"bench-{next(loads)}"),
                                          concurrency=c, acked=acked["eventual"], **kw)

        phases: dict = {}
        for c in concurrencies:
            phases[f"raw_produce_c{c}"] = (f"raw aiokafka produce, c={c}", lambda c=c, **kw: raw_produce_load(
                bootstrap, raw, concurrency=c, **kw))
            phases[f"http_floor_c{c}"] = (f"HTTP floor (no-op), c={c}", lambda c=c, **kw: http_load(
                floor.host, floor.port, bodies["eventual"], concurrency=c, **kw))
            if c == middle:  # at the target's concurrency only: its records slow the local broker's later fetches
                phases[f"group_commit_floor_c{c}"] = (f"group-commit floor (no work), c={c}", lambda c=c, **kw:
                                                      http_load(gc_floor.host, gc_floor.port, bodies["eventual"],
                                                                concurrency=c, **kw))
            for kind in NAMESPACES:
                phases[f"addcount_{kind}_c{c}"] = (f"AddCount {kind.upper()}, c={c}", addcount(kind, c))
                if kind == "eventual" and c == middle:  # before ACCURATE, whose prompt persist pace lasts a while
                    phases[f"addcount_tokened_c{c}"] = (f"AddCount EVENTUAL, with tokens, c={c}", addcount_tokened(c))
            if c == middle:
                def caught_up() -> bool:
                    return wait_exact(Path(tmp), expected(), allow_more=True, timeout_s=120)
                phases[f"addcount_paused_c{c}"] = (f"AddCount EVENTUAL, paused, c={c}", paused_pipeline(
                    stack, addcount("eventual", c), caught_up))
                phases[f"addcount_tail_read_c{c}"] = (f"AddCount EVENTUAL, tail read, c={c}", paused_pipeline(
                    stack, addcount("eventual", c), caught_up, beside=lambda: tail_reader(
                        bootstrap, settings.mutations_topic, min_bytes=settings.persist_fetch_min_bytes,
                        wait_ms=settings.persist_eventual_within_ms)))
        phases[f"addandget_c{middle}"] = (f"AddAndGetCount EVENTUAL, c={middle}", lambda **kw: http_load(
            api.host, api.port, add_and_get, concurrency=middle, acked=acked_get, **kw))
        meter = StackMeter({"api": api.pid, **{w.name: w.pid for w in stack.workers},
                            "broker": stack.broker.pid if stack.broker else None, "floor": floor.pid,
                            "gc_floor": gc_floor.pid},
                           metrics_url=f"http://{api.address}/metrics")
        console.print(f"durable writes, {duration:g} s per phase, {rounds} interleaved rounds:")
        per_round = run_rounds(phases, rounds=rounds, duration_s=duration, meter=meter)
        acknowledged = expected()
        errors = sum(r["errors"] for rs in per_round.values() for r in rs)
        started = time.monotonic()
        exact = wait_exact(Path(tmp), acknowledged, allow_more=errors > 0)
        counted_s = time.monotonic() - started
    results = {key: medians(values) for key, values in per_round.items()}
    console.print(f"medians of {rounds} rounds (ratio: throughput / raw produce at the same concurrency, "
                  "median of per-round ratios):")
    for c in concurrencies:
        base = results[f"raw_produce_c{c}"]
        console.print(f"  c={c:<4} raw produce {base['throughput_per_s']:>8,.0f}/s p50 {base['p50_ms']:6.2f} ms "
                      f"p99 {base['p99_ms']:6.2f} ms")
        kinds = ["eventual", "tokened", "accurate", "paused", "tail_read"] if c == middle else list(NAMESPACES)
        for floor_key, floor_label, what in (("http_floor", "HTTP floor", "a ceiling"),
                                             ("group_commit_floor", "GC floor", "HTTP + group commit, no work")):
            floor_r = results.get(f"{floor_key}_c{c}")
            if floor_r is None:
                continue
            floor_r["ratio_to_raw_produce"] = median_ratio(per_round, f"{floor_key}_c{c}", f"raw_produce_c{c}")
            add_latency_ratios(floor_r, base)
            console.print(f"         {floor_label:<11} {floor_r['throughput_per_s']:>8,.0f}/s p50 "
                          f"{floor_r['p50_ms']:6.2f} ms p99 {floor_r['p99_ms']:6.2f} ms  = "
                          f"{floor_r['ratio_to_raw_produce']:.0%} of raw, p50 {floor_r['p50_to_raw']:.2f}x, p99 "
                          f"{floor_r['p99_to_raw']:.2f}x ({what})")
        for kind in kinds:
            key = f"addcount_{kind}_c{c}"
            r = results[key]
            r["ratio_to_raw_produce"] = median_ratio(per_round, key, f"raw_produce_c{c}")
            add_latency_ratios(r, base)
            r["ratio_to_http_floor"] = median_ratio(per_round, key, f"http_floor_c{c}")
            versus = f"{r['ratio_to_http_floor']:.0%} of the HTTP floor"
            if c == middle:
                r["ratio_to_group_commit_floor"] = median_ratio(per_round, key, f"group_commit_floor_c{c}")
                versus = f"{r['ratio_to_group_commit_floor']:.0%} of the GC floor"
            console.print(f"         AddCount {kind:<10}{r['throughput_per_s']:>8,.0f}/s p50 {r['p50_ms']:6.2f} ms "
                          f"p99 {r['p99_ms']:6.2f} ms  = {r['ratio_to_raw_produce']:.0%} of raw, p50 "
                          f"{r['p50_to_raw']:.2f}x, p99 {r['p99_to_raw']:.2f}x, {versus}")
    console.print(f"  where the time goes at c={middle} (medians of the rounds; CPU per request by process, "
                  "'client' is this process: the load generator, or the raw produce's Kafka client):")
    for key, (label, _) in phases.items():
        if key.endswith(f"_c{middle}"):
            console.print(f"    {label:<36} {StackMeter.describe(results[key])}")
    g = results[f"addandget_c{middle}"]
    console.print(f"  AddAndGetCount c={middle}: {g['throughput_per_s']:,.0f}/s p50 {g['p50_ms']:.2f} ms "
                  f"p99 {g['p99_ms']:.2f} ms")
    console.print(f"  every acknowledged write counted: {exact} ({sum(acknowledged.values()):,} writes over "
                  f"{len(acknowledged):,} counters, {counted_s:.1f} s after the last round; {errors} errors)")
    return {"duration_s": duration, "concurrencies": concurrencies, "counters": counters, "rounds": rounds,
            "namespaces": str(namespaces), "results": results, "acknowledged_writes": sum(acknowledged.values()),
            "all_counted": exact, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="counter bench write", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase (default 5)")
    parser.add_argument("--concurrencies", default="1,32,256", help="comma-separated (default 1,32,256)")
    parser.add_argument("--counters", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians reported (default 3)")
    parser.add_argument("--namespaces", type=Path, default=default_config_path(),
                        help="namespace file (default: the shipped example, what `counter up` serves)")
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrencies.split(",")]
    result = run(args.duration, concurrencies, args.counters, args.rounds, args.namespaces)
    write_result("write", result)
    return 0 if result["all_counted"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
