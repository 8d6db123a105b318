"""Interleaved rounds: every phase (baselines and the service) measured once per round, medians reported.

On a shared 2-core machine one run of a phase can differ from the next by a third. Measuring the baseline and
the service back to back in each round, and quoting the median of the per-round ratios, keeps that drift out
of the comparison.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Mapping
from typing import Any

from bench.common import console, progress_bar
from bench.loadgen import LoadResult, Meter
from bench.stack_meter import StackMeter

Phase = Callable[..., LoadResult]  # called with on_progress= and duration_s= (and meter=, when one is given)
_LOAD_KEYS = ("requests", "errors", "throughput_per_s", "p50_ms", "p99_ms", "max_ms")


def run_rounds(phases: Mapping[str, tuple[str, Phase]], *, rounds: int, duration_s: float,
               meter: Meter | None = None) -> dict[str, list[dict]]:
    """{key: [summary per round]} for phases {key: (label, load function)}, run in order once per round; with
    `meter`, each load is measured by it and its figures are printed under the phase."""
    out: dict[str, list[dict]] = {key: [] for key in phases}
    extra = {} if meter is None else {"meter": meter}
    for n in range(1, rounds + 1):
        console.print(f"round {n}/{rounds}:")
        for key, (label, phase) in phases.items():
            with progress_bar(label, None) as update:
                result = phase(on_progress=update, duration_s=duration_s, **extra)
            summary = result.summary()
            out[key].append(summary)
            console.print(f"  {label:<36} {summary['throughput_per_s']:>9,.0f}/s  p50 {summary['p50_ms']:6.2f} ms  "
                          f"p99 {summary['p99_ms']:6.2f} ms  max {summary['max_ms']:7.2f} ms  "
                          f"errors {summary['errors']}")
            if result.figures:
                console.print(f"    {StackMeter.describe(result.figures)}")
    return out


def medians(per_round: list[dict]) -> dict[str, Any]:
    """The median of each figure over the rounds (a meter's too, over the rounds that have it), and the rounds."""
    keys = ("throughput_per_s", "p50_ms", "p99_ms", "max_ms")
    figures = {k for r in per_round for k in r if k not in _LOAD_KEYS}
    return {**{k: statistics.median(r[k] for r in per_round) for k in keys},
            **{k: statistics.median(r[k] for r in per_round if k in r) for k in sorted(figures)},
            "errors": sum(r["errors"] for r in per_round), "rounds": per_round}


def median_ratio(per_round: Mapping[str, list[dict]], key: str, base: str) -> float:
    """Median over rounds of throughput(key) / throughput(base), each pair from the same round."""
    ratios = [a["throughput_per_s"] / b["throughput_per_s"]
              for a, b in zip(per_round[key], per_round[base], strict=True) if b["throughput_per_s"]]
    return statistics.median(ratios) if ratios else 0.0


def load_args(prog: str, description: str | None, argv: list[str] | None) -> argparse.Namespace:
    """The options every load benchmark takes: --duration, --concurrency, --counters, --rounds."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (default 10)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--counters", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians reported (default 3)")
    return parser.parse_args(argv)
