"""infra.native: `counter up` (and `counter api`, `counter worker`, the benchmarks' stacks) build the compiled parts
before their processes start, and report a part that cannot be built instead of failing."""

from __future__ import annotations

import argparse

import pytest

from counter_cli import common
from infra.native import PARTS, BuildOutcome, NativePart, ensure_native_builds

COMMANDS = {
    # what a build command does: prints what it compiled, prints nothing (current), or fails saying what runs
    "built_now": 'print("compiled thing.c: _thing.so")',
    "current": "pass",
    "broken": ('import sys; print("could not compile thing.c; the Python path will be used: cc failed:", '
               'file=sys.stderr); print("thing.c:1: error", file=sys.stderr); sys.exit(1)'),
    "needs_quiet": 'import sys; sys.exit(0 if sys.argv[1:] == ["--quiet"] else 3)',
}


@pytest.fixture()
def fake_parts(tmp_path, monkeypatch) -> dict[str, NativePart]:
    for name, code in COMMANDS.items():
        (tmp_path / f"fake_build_{name}.py").write_text(code + "\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return {name: NativePart(f"fake_build_{name}", f"the {name} part") for name in COMMANDS}


def test_each_part_is_built_in_order_and_reported(fake_parts):
    parts = tuple(fake_parts.values())
    reported: list[BuildOutcome] = []
    outcomes = ensure_native_builds(reported.append, parts)
    assert reported == outcomes
    assert [o.part for o in outcomes] == list(parts)
    by_name = {name: o for name, o in zip(fake_parts, outcomes, strict=True)}
    assert by_name["built_now"].ok and by_name["built_now"].summary == "the built_now part: compiled thing.c: _thing.so"
    assert by_name["current"].ok and by_name["current"].message == ""
    assert by_name["current"].summary == "the current part: current"
    assert by_name["needs_quiet"].ok, "the build commands are run with --quiet"
    broken = by_name["broken"]
    assert not broken.ok
    assert broken.summary == "could not compile thing.c; the Python path will be used: cc failed: ... thing.c:1: error"
    assert "thing.c:1: error" in broken.message, "the whole output is kept for whoever wants it"


def test_a_missing_build_command_is_a_failure_not_an_exception():
    (outcome,) = ensure_native_builds(None, (NativePart("no_such_module_for_native_test", "a part"),))
    assert not outcome.ok
    assert "no_such_module_for_native_test" in outcome.message


def test_the_parts_are_the_two_compiled_modules_with_their_build_commands():
    assert [p.module for p in PARTS] == ["schemas.compile", "query_api.plain_add"]


def test_the_cli_warns_about_a_failed_build_and_says_nothing_of_a_current_one(fake_parts, monkeypatch, capsys):
    monkeypatch.setattr("counter_cli.common.ensure_native_builds",
                        lambda report: ensure_native_builds(report, tuple(fake_parts.values())))
    monkeypatch.setattr(common, "console", common.Console(stderr=True, width=200))
    common.build_native_parts(argparse.Namespace(no_compile=False))
    err = capsys.readouterr().err
    assert "warning: could not compile thing.c; the Python path will be used" in err
    assert "the built_now part: compiled thing.c" in err
    assert "the current part" not in err and "needs_quiet" not in err


def test_no_compile_builds_nothing(monkeypatch):
    monkeypatch.setattr("counter_cli.common.ensure_native_builds",
                        lambda report: pytest.fail("built despite --no-compile"))
    common.build_native_parts(argparse.Namespace(no_compile=True))


@pytest.mark.parametrize("verb", ["up", "api", "worker"])
def test_the_verbs_that_start_processes_take_no_compile(verb):
    from counter_cli.main import build_parser

    args = build_parser().parse_args([verb, "--no-compile"])
    assert args.no_compile is True
    assert build_parser().parse_args([verb]).no_compile is False
