"""A plain durable AddCount read and encoded in C (`_plain_add.c`): build it, and load the build of this source.

    python -m query_api.plain_add [--quiet]      # compile _plain_add.c with the C compiler Python was built with

Why: at concurrency 32 the API spent about 13 µs of Python per EVENTUAL AddCount (JSON, validation, token, Avro
body, answer, the response's bookkeeping) where the group-commit floor of bench/RESULTS.md spends 1 µs, and every µs
of it cost about 1.5% of the write rate on this two-core box. No part was above 1.5 µs, so no trimming in Python
closed the gap. `read_add` takes the plainest body ({"namespace", "counter_name", "delta"} and optionally an
"idempotency_token" of "token" and "generation_time"; printable ASCII, no escapes) and returns its fields in one
call; `encode_add` returns the Avro body and the answer's JSON in one more. `add_request` does both, and reads the
HTTP request around the body (`plain_request`), in one call for a write without a token, drawing its time and token
itself. Anything else returns None and goes the Python way (query_api.fastpath, then the FastAPI route), so every
error keeps its one implementation.

`plain_add()` is the build while its SHA-256 stamp matches the source, else None: an edited source is never
shadowed by a stale build, and without a C compiler the API runs as before, only slower.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Protocol, cast

from schemas.compile import build_command

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("_plain_add.c")
MODULE = "query_api._plain_add"
TARGET = SOURCE.with_name("_plain_add" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))

class PlainAdd(Protocol):
    """The build's functions (see _plain_add.c)."""

    def read_add(self, body: bytes, namespaces: dict[str, str], /) -> (
            tuple[str, str, int, str, str | None, str | int | None] | None): ...

    def encode_add(self, namespace: str, counter_name: str, delta: int, counter_type: str, event_time: int,
                   token: str, /) -> tuple[bytes, bytes] | None: ...

    def plain_request(self, data: bytes, /) -> bytes | None: ...

    def add_request(self, data: bytes, namespaces: dict[str, str], /) -> (
            tuple[bytes, bytes, str, tuple[int, str, str, int, bool]] | bytes | None): ...


def source_digest() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def plain_add(*, warn: bool = True) -> PlainAdd | None:
    """The build of the current source, or None (not built, or built from another source: `warn` says so in the
    log)."""
    try:
        module = importlib.import_module(MODULE)
        digest = source_digest()
    except (ImportError, OSError):  # not built, or the source not installed beside the build
        return None
    if getattr(module, "SOURCE_SHA256", None) != digest:
        if warn:
            log.warning("%s was built from another version of %s; plain AddCounts take the Python path (rebuild "
                        "with `python -m query_api.plain_add`)", MODULE, SOURCE.name)
        return None
    return cast(PlainAdd, module)


def build() -> Path:
    """Compile the source into TARGET (replaced whole: a process importing meanwhile sees the old or the new)."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    include = sysconfig.get_paths()["include"]
    with tempfile.TemporaryDirectory(prefix="counter-plain-add-") as tmp:
        built = Path(tmp) / TARGET.name
        done = subprocess.run(
            [*compiler, "-O2", "-fPIC", "-shared", "-Wall", f"-I{include}",
             f'-DSOURCE_SHA256="{source_digest()}"', str(SOURCE), "-o", str(built)],
            capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(compiler)} failed:\n{done.stdout}{done.stderr}")
        staged = TARGET.with_name(TARGET.name + ".tmp")
        staged.write_bytes(built.read_bytes())
        os.replace(staged, TARGET)
    return TARGET


def main(argv: list[str] | None = None) -> int:
    return build_command(argv, prog="query_api.plain_add", doc=__doc__, name=MODULE, source=SOURCE,
                         current=lambda: plain_add(warn=False) is not None, build=lambda: [build()],
                         without="plain AddCounts will take the Python path")


if __name__ == "__main__":
    raise SystemExit(main())
