"""`schemas.avro_fast` compiled to C by mypyc, used when a build of exactly its current source is present.

Why: the hand-written readers are the persist path's largest cost once records carry one mutation each (2.9 µs
a mutation in Python, 1.3-1.5 compiled). The source stays the one Python module, which the tests hold equal to
fastavro; `python -m schemas.compile` (run by `make test` and `counter up`) compiles a copy of it, named
`schemas._avro_fast_c` and stamped with the source's SHA-256, into this folder. `avro_fast()` takes that build
only while its stamp matches the source, so an edited source is never shadowed by a stale build; without a
build (no C compiler) everything runs the pure Python module, only slower.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from pathlib import Path
from types import ModuleType

from schemas import avro_fast as pure

log = logging.getLogger(__name__)

SOURCE = Path(pure.__file__)
COMPILED_NAME = "schemas._avro_fast_c"


def source_digest() -> str:
    """The SHA-256 a build of the current source is stamped with."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def compiled_build(*, warn: bool = True) -> ModuleType | None:
    """The compiled build of the current source, or None (none built, or built from another source: `warn`
    says so in the log)."""
    try:
        module = importlib.import_module(COMPILED_NAME)
    except ImportError:
        return None
    if getattr(module, "SOURCE_SHA256", None) != source_digest():
        if warn:
            log.warning("%s was built from another version of %s; using the Python module (rebuild it with "
                        "`python -m schemas.compile`)", COMPILED_NAME, SOURCE.name)
        return None
    return module


def avro_fast() -> ModuleType:
    """The readers to use: the compiled build when it matches the source, else the Python module."""
    return compiled_build() or pure
