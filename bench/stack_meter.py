"""Where a load's time goes, measured around it: CPU per request of each process and of the load generator, how
busy the machine was, and the API's group commit (writes per record, the broker's acknowledgement time).

Why: on this shared 2-core machine a ratio alone does not say what bounds a path. CPU per request says what each
process costs; the machine's busy share says whether the cores ran out (near 100%) or the requests waited on
one another (well below: a latency chain, not a CPU ceiling); the group-commit figures, read from the API's
/metrics before and after, say how many writes shared a record and how long the broker took to acknowledge one.
Linux only (/proc), like the local stack.
"""

from __future__ import annotations

import os
import resource
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from infra.process import proc_stat

_TICK = os.sysconf("SC_CLK_TCK")
_GROUP_COMMIT = ("counter_api_group_commit_records_total", "counter_api_group_commit_mutations_total",
                 "counter_api_broker_ack_seconds_sum", "counter_api_broker_ack_seconds_count")


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of a process, all its threads (None once it is gone)."""
    fields = proc_stat(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / _TICK


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot: busy is everything but idle and iowait."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


def scrape(metrics_url: str) -> list[Sample]:
    """Every sample a /metrics page exports."""
    with urllib.request.urlopen(metrics_url, timeout=5) as answer:
        text = answer.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def group_commit_totals(metrics_url: str) -> dict[str, float]:
    """The API's group-commit series from its /metrics (empty when it exports none)."""
    return {sample.name: sample.value for sample in scrape(metrics_url) if sample.name in _GROUP_COMMIT}


class StackMeter:
    """`start()` before a load, `stop(requests)` after it: {figure: value} for the load's summary.

    Figures: `cpu_us_<process>` per request for each named process and `cpu_us_client` for this one (the load
    generator, or the Kafka client of a raw produce); `busy_pct`, the machine's busy share of all its cores;
    with `metrics_url`, when the API sent records meanwhile, `writes_per_record` and `broker_ack_ms` (mean)."""

    def __init__(self, processes: Mapping[str, int | None], metrics_url: str | None = None) -> None:
        self.processes = {name: pid for name, pid in processes.items() if pid}
        self.metrics_url = metrics_url
        self._cpu: dict[str, float | None] = {}
        self._machine = (0, 0)
        self._group_commit: dict[str, float] = {}

    def start(self) -> None:
        self._group_commit = group_commit_totals(self.metrics_url) if self.metrics_url else {}
        self._cpu = {name: process_cpu_s(pid) for name, pid in self.processes.items()}
        self._cpu["client"] = _own_cpu_s()
        self._machine = _machine_ticks()

    def stop(self, requests: int) -> dict[str, float]:
        busy, total = _machine_ticks()
        now = {name: process_cpu_s(pid) for name, pid in self.processes.items()}
        now["client"] = _own_cpu_s()
        out: dict[str, float] = {}
        for name, before in self._cpu.items():
            after = now.get(name)
            if before is not None and after is not None and requests:
                out[f"cpu_us_{name}"] = (after - before) / requests * 1e6
        if total > self._machine[1]:
            out["busy_pct"] = 100 * (busy - self._machine[0]) / (total - self._machine[1])
        if self.metrics_url:
            after_gc = group_commit_totals(self.metrics_url)
            delta = {name: after_gc.get(name, 0.0) - self._group_commit.get(name, 0.0) for name in _GROUP_COMMIT}
            records, mutations, ack_s, acked = (delta[name] for name in _GROUP_COMMIT)
            if records:
                out["writes_per_record"] = mutations / records
            if acked:
                out["broker_ack_ms"] = ack_s / acked * 1e3
        return out

    @staticmethod
    def describe(figures: Mapping[str, float], per: str = "request") -> str:
        """One line: CPU µs per `per` (what `stop` was given a count of) per process, the machine's busy share,
        the group-commit figures."""
        cpu = " ".join(f"{name[7:]} {value:.1f}" for name, value in figures.items()
                       if name.startswith("cpu_us_") and value >= 0.05)  # idle ones (a frozen worker) say nothing
        parts = [f"CPU µs/{per}: {cpu}"] if cpu else []
        if "busy_pct" in figures:
            parts.append(f"machine {figures['busy_pct']:.0f}% busy")
        if "writes_per_record" in figures:
            parts.append(f"{figures['writes_per_record']:.1f} writes/record")
        if "broker_ack_ms" in figures:
            parts.append(f"broker ack {figures['broker_ack_ms']:.2f} ms")
        return " | ".join(parts)
