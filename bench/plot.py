"""Plot an ingest result: persisted throughput and converged counters over time, as a PNG.

    python -m bench.plot [bench/results/ingest-....json] [-o bench/ingest.png]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from bench.common import RESULTS_DIR, console


def latest(name: str) -> Path:
    files = sorted(RESULTS_DIR.glob(f"{name}-*.json"))
    if not files:
        raise SystemExit(f"no {name} results in {RESULTS_DIR}: run `counter bench {name}` first")
    return files[-1]


def plot(result_path: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = json.loads(result_path.read_text())
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    samples = r["persisted_over_time"]
    rates = [((t0 + t1) / 2, (v1 - v0) / (t1 - t0)) for (t0, v0), (t1, v1) in itertools.pairwise(samples)
             if t1 > t0]
    ax1.plot([t for t, _ in rates], [v / 1000 for _, v in rates], label="persisted (1 worker)")
    ax1.axhline(r["persisted_per_s"] / 1000, linestyle="--", color="gray",
                label=f"mean {r['persisted_per_s'] / 1000:,.0f}K/s")
    ax1.axhline(50, linestyle=":", color="red", label="target 50K/s")
    ax1.set(title=f"Persist throughput, {r['mutations']:,} mutations", xlabel="seconds since worker start",
            ylabel="thousand mutations / s")
    ax1.legend()
    conv = r["exact_counters_over_time"]
    ax2.plot([t for t, _ in conv], [n for _, n in conv], drawstyle="steps-post")
    ax2.axhline(r["counters"], linestyle="--", color="gray", label=f"{r['counters']} counters")
    ax2.axvline(r["convergence_after_last_write_s"], linestyle=":", color="green",
                label=f"all exact after {r['convergence_after_last_write_s']:.2f} s")
    ax2.set(title="Convergence after the last write", xlabel="seconds after the last write",
            ylabel="counters exact in the rollup store")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    console.print(f"plot written to {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", nargs="?", type=Path, help="ingest result JSON (default: the latest)")
    parser.add_argument("-o", "--out", type=Path, default=Path(__file__).resolve().parent / "ingest.png")
    args = parser.parse_args(argv)
    plot(args.result or latest("ingest"), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
