"""producers.new_token: unique within a process and across processes, forked ones included."""

from __future__ import annotations

import multiprocessing
import re

from producers import new_token


def _child_tokens(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put([new_token() for _ in range(1000)])


def test_tokens_are_32_hex_digits_and_never_repeat_in_a_process() -> None:
    tokens = [new_token() for _ in range(100_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", t) for t in tokens[:100] + tokens[-100:])
    assert len(set(tokens)) == len(tokens)
    numbers = [int(t[16:], 16) for t in tokens]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), "the process's sequence, in order"


def test_a_forked_child_draws_its_own_tokens() -> None:
    """A forked child continues the parent's state: without drawing again it would repeat the parent's tokens."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    children = [ctx.Process(target=_child_tokens, args=(queue,)) for _ in range(2)]
    for child in children:
        child.start()
    theirs = [queue.get(timeout=30) for _ in children]
    for child in children:
        child.join(timeout=30)
    mine = [new_token() for _ in range(1000)]
    assert len(set(mine) | set(theirs[0]) | set(theirs[1])) == 3000
