"""A plain durable AddCount parsed and encoded in C (`_plain_add.c`): build it, and load the build of this source.

    python -m query_api.plain_add [--quiet]      # compile _plain_add.c with the C compiler Python was built with

Why: at concurrency 32 the API spent about 13 µs of Python per EVENTUAL AddCount (JSON, validation, token, Avro
body, answer, the response's bookkeeping) where the group-commit floor of bench/RESULTS.md spends 1 µs, and every µs
of it cost about 1.5% of the write rate on this two-core box. No part was above 1.5 µs, so no trimming in Python
closed the gap. The C function takes the plainest body ({"namespace", "counter_name", "delta"}, printable ASCII,
no escapes) and returns the fields, the Avro body and the answer in one call; anything else returns None and goes
the Python way (query_api.fastpath, then the FastAPI route), so every error keeps its one implementation.

`plain_add()` is the build's function while the build's SHA-256 stamp matches the source, else None: an edited
source is never shadowed by a stale build, and without a C compiler the API runs as before, only slower.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path

from schemas.compile import build_command

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("_plain_add.c")
MODULE = "query_api._plain_add"
TARGET = SOURCE.with_name("_plain_add" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))

PlainAdd = Callable[[bytes, dict[str, str], int, str], tuple[str, str, int, bytes, bytes] | None]


def source_digest() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def plain_add(*, warn: bool = True) -> PlainAdd | None:
    """The compiled function of the current source, or None (not built, or built from another source: `warn` says
    so in the log)."""
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
    function: PlainAdd = module.plain_add
    return function


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
