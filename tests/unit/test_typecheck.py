"""The non-test code type-checks: mypy as configured in pyproject.toml ([tool.mypy]: the packages, the untyped
libraries, unused ignores as errors), so that pytest alone checks types too (`make test` also runs mypy first).

Through mypy's API, in this process; with its cache (.mypy_cache) a re-run takes a few seconds, a cold one
about 15 s on 2 cores."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_reports_no_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the configured packages are found from the repository root
    stdout, stderr, status = api.run(["--config-file", str(ROOT / "pyproject.toml")])
    assert status == 0, f"mypy found errors (status {status}):\n{stdout}{stderr}"
