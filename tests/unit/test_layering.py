"""The import contracts of pyproject.toml ([tool.importlinter]) hold, and each of them can fail.

`make test` runs `lint-imports` too; this test makes a violation fail a plain `pytest` run as well. The second
test proves every contract bites: it copies the contracts next to a tree of empty stand-in packages with the
project's names, adds one violating import, and checks that `lint-imports` reports that contract broken.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def contracts() -> dict[str, dict]:
    with CONFIG.open("rb") as f:
        config = tomllib.load(f)["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def test_the_import_contracts_hold(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    code = lint_imports(config_filename=str(CONFIG), no_cache=True, no_logo=True)
    assert code == 0, capsys.readouterr().out


# (contract id, module of the stand-in tree -> its import, whether the contract must break)
CASES = [
    ("layers", {"schemas.bad": "import control_plane"}, True),
    ("layers", {"sinks.bad": "import agents.persist"}, True),
    ("layers", {"streams.bad": "import sinks"}, True),  # siblings of one layer are independent
    ("layers", {"agents.bad": "import query_api"}, True),
    ("layers", {"producers.bad": "import streams"}, True),
    ("layers", {"jobs.bad": "import counter_cli"}, True),
    ("layers", {"streams.ok": "import producers", "jobs.ok": "import agents.persist"}, False),
    ("jobs-not-worker", {"jobs.bad": "from agents import worker"}, True),
    ("jobs-not-worker", {"jobs.bad": "import agents.persist", "agents.persist": "import agents.persist_consumer"},
     True),  # indirectly too
    ("jobs-not-worker", {"jobs.ok": "import agents.persist"}, False),
    ("cli-not-services", {"counter_cli.bad": "import agents.persist"}, True),
    ("cli-not-services", {"counter_cli.bad": "import query_api"}, True),
    ("cli-not-services", {"counter_cli.ok": "import jobs.ok", "jobs.ok": "import agents.persist"}, False),
    ("nothing-imports-query-api", {"jobs.bad": "import query_api"}, True),
    ("nothing-imports-query-api", {"bench.bad": "import query_api"}, True),
    ("bench-apart", {"bench.bad": "import jobs"}, True),
    ("bench-apart", {"bench.bad": "import agents"}, True),
    ("bench-apart", {"bench.ok": "import producers, streams, sinks, infra, control_plane, schemas"}, False),
    ("nothing-imports-bench", {"counter_cli.bad": "import bench"}, True),
]


def _tree(tmp: Path, imports: dict[str, str]) -> None:
    with CONFIG.open("rb") as f:
        roots = tomllib.load(f)["tool"]["importlinter"]["root_packages"]
    for pkg in roots:
        (tmp / pkg).mkdir()
        (tmp / pkg / "__init__.py").write_text("")
    for module in ("agents.worker", "agents.persist_consumer", "agents.__main__", "agents.persist"):
        (tmp / (module.replace(".", "/") + ".py")).write_text("")
    for module, line in imports.items():
        (tmp / (module.replace(".", "/") + ".py")).write_text(line + "\n")


@pytest.mark.parametrize(("contract", "imports", "breaks"), CASES,
                         ids=[f"{c}-{'breaks' if b else 'kept'}-{i}" for i, (c, _, b) in enumerate(CASES)])
def test_each_contract_fails_on_a_violating_import(tmp_path, contract, imports, breaks):
    assert contract in contracts()
    _tree(tmp_path, imports)
    config = tmp_path / "pyproject.toml"
    config.write_bytes(CONFIG.read_bytes())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--contract", contract, "--no-cache",
                             "--no-logo"], cwd=tmp_path, env={**env, "PYTHONPATH": str(tmp_path)},
                            capture_output=True, text=True, timeout=60)
    assert "Analyzed" in result.stdout, result.stdout + result.stderr
    assert result.returncode == (1 if breaks else 0), result.stdout + result.stderr


def test_every_contract_is_exercised():
    assert {c for c, _, breaks in CASES if breaks} == set(contracts())
