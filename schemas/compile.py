"""Compile `schemas.avro_fast` to C with mypyc, as `schemas._avro_fast_c` (see `schemas.compiled`).

    python -m schemas.compile [--quiet]

Copies the `schemas` package to a temporary folder (mypyc reads the modules avro_fast imports), adds the copy
`_avro_fast_c.py` (the source plus its SHA-256 stamp), compiles that copy and puts the resulting extension
modules next to the source. Needs mypy (which ships mypyc) and a C compiler; exits 1 with the compiler's output
when the build fails, and does nothing when the present build already matches the source.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from schemas.compiled import COMPILED_NAME, SOURCE, compiled_build, source_digest

PACKAGE = SOURCE.parent
STEM = COMPILED_NAME.rpartition(".")[2]  # _avro_fast_c


def built_files(folder: Path) -> list[Path]:
    """The extension modules of a build in `folder`: the module and mypyc's runtime library beside it."""
    return sorted(folder.glob(f"{STEM}.*.so")) + sorted(folder.glob(f"{STEM}__mypyc.*.so"))


def compile_build() -> list[Path]:
    """Build the compiled copy and install it into the package folder; the installed files."""
    if importlib.util.find_spec("mypyc") is None:
        raise RuntimeError("mypyc is not installed (it ships with mypy: the [local] extra, or pip install "
                           "'mypy>=2.4,<2.5' setuptools)")
    with tempfile.TemporaryDirectory(prefix="counter-mypyc-") as tmp:
        copy = Path(tmp) / PACKAGE.name
        shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        (copy / f"{STEM}.py").write_text(
            SOURCE.read_text() + f'\n\nSOURCE_SHA256 = "{source_digest()}"  # stamped by schemas.compile\n')
        done = subprocess.run([sys.executable, "-m", "mypyc", f"{PACKAGE.name}/{STEM}.py"], cwd=tmp,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"mypyc failed:\n{done.stdout}{done.stderr}")
        installed = []
        for built in built_files(copy):  # each file replaced whole: a process importing meanwhile sees old or new
            target = PACKAGE / built.name
            shutil.copy2(built, target.with_name(target.name + ".tmp"))
            os.replace(target.with_name(target.name + ".tmp"), target)
            installed.append(target)
        for stale in set(built_files(PACKAGE)) - set(installed):  # e.g. a build for another Python version
            stale.unlink()
    return installed


def build_command(argv: list[str] | None, *, prog: str, doc: str | None, name: str, source: Path,
                  current: Callable[[], bool], build: Callable[[], list[Path]], without: str) -> int:
    """`python -m <prog> [--quiet]` for a compiled build of `source` named `name`: nothing when `current()`, else
    `build()`; exits 1 saying what runs `without` it when the build fails. Shared with query_api.plain_add."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quiet", action="store_true", help="print nothing when the build is already current")
    args = parser.parse_args(argv)
    if current():
        if not args.quiet:
            print(f"{name} is current")
        return 0
    try:
        installed = build()
    except (RuntimeError, OSError) as exc:
        print(f"could not compile {source.name}; {without}: {exc}", file=sys.stderr)
        return 1
    print(f"compiled {source.name}: {', '.join(p.name for p in installed)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return build_command(argv, prog="schemas.compile", doc=__doc__, name=COMPILED_NAME, source=SOURCE,
                         current=lambda: compiled_build(warn=False) is not None, build=compile_build,
                         without="the Python module will be used")


if __name__ == "__main__":
    raise SystemExit(main())
