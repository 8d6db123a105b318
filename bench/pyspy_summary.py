"""Summarize a py-spy profile of the event-loop thread: inclusive and self share per function.

    py-spy record -r 200 -d 5 -p <pid> -f raw -o api.raw [--native]
    python -m bench.pyspy_summary api.raw --thread Runner.run [--top 40]

`--thread` keeps only stacks containing that frame (the API's loop runs under `Runner.run`, the worker's
under `run_until_complete`), so idle helper threads do not dilute the shares.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def summarize(lines: list[str], thread: str | None, top: int) -> str:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit() or (thread and thread not in stack):
            continue
        n = int(count)
        total += n
        frames = [f.split(" (")[0] for f in stack.split(";")]
        for name in set(frames):
            inclusive[name] += n
        own[frames[-1]] += n
    if not total:
        return "no samples matched\n"
    out = [f"samples: {total}", "", "== inclusive (share of the thread's samples) =="]
    out += [f"{n / total:6.1%} {name}" for name, n in inclusive.most_common(top)]
    out += ["", "== self =="]
    out += [f"{n / total:6.1%} {name}" for name, n in own.most_common(top)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pyspy_summary", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw", type=Path, help="py-spy output recorded with -f raw")
    parser.add_argument("--thread", default=None, help="keep stacks containing this frame (e.g. Runner.run)")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    print(summarize(args.raw.read_text().splitlines(), args.thread, args.top), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
