"""counter_cli.common.fail: the one way the CLI reports an error."""

from __future__ import annotations

import pytest
from rich.console import Console

from counter_cli import common


def test_fail_prints_the_message_unwrapped_and_unparsed_and_exits_with_the_code(monkeypatch, capsys):
    monkeypatch.setattr(common, "console", Console(stderr=True, width=40))
    path = "/tmp/" + "a-long-directory-name/" * 6 + "bad.jsonl"
    with pytest.raises(SystemExit) as exited:
        common.fail(f"{path}:2: field [delta] must be an integer", code=3)
    assert exited.value.code == 3
    err = capsys.readouterr().err
    assert err == f"error: {path}:2: field [delta] must be an integer\n"  # one line, brackets kept
