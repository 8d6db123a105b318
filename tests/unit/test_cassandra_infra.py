"""The production compose file, the Dockerfile, the CQL schema file, `counter schema`, the store
factory's cassandra:// routing, and the contract suite's explicit skip (no Docker here: the
compose file is validated by loading it and asserting its structure)."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from infra.native import PARTS
from sinks import open_stores
from sinks.cassandra.config import CassandraUrlError, parse_cassandra_url
from sinks.cassandra.cql import BASE_TABLES, render_schema_file
from streams.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
COMPOSE = yaml.safe_load((INFRA / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
APP_SERVICES = ("worker-1", "worker-2", "api")
LONG_RUNNING = ("kafka", "cassandra", "memcached", *APP_SERVICES)


def env_of(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in (SERVICES[service].get("environment") or {}).items()}


def test_the_stack_has_every_service():
    assert set(SERVICES) == {"kafka", "cassandra", "memcached", "schema", "worker-1", "worker-2", "api"}
    assert not any("zookeeper" in name or "zookeeper" in str(s.get("image", "")) for name, s in SERVICES.items())


def test_images_are_pinned():
    assert re.fullmatch(r"apache/kafka:3\.\d+\.\d+", SERVICES["kafka"]["image"])
    assert re.fullmatch(r"cassandra:\d+\.\d+", SERVICES["cassandra"]["image"])
    assert re.fullmatch(r"memcached:1\.6-alpine", SERVICES["memcached"]["image"])
    for name in (*APP_SERVICES, "schema"):
        s = SERVICES[name]
        assert s["image"] == "counter-abstraction:latest"
        assert s["build"] == {"context": "..", "dockerfile": "infra/Dockerfile"}
        assert (INFRA / s["build"]["context"] / s["build"]["dockerfile"]).resolve() == INFRA / "Dockerfile"


def test_kafka_is_kraft_with_enough_partitions():
    env = env_of("kafka")
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{env['KAFKA_NODE_ID']}@kafka:")
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", env["CLUSTER_ID"])  # base64 of 16 bytes
    assert int(env["KAFKA_NUM_PARTITIONS"]) >= 3 and env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]


def test_commands_run_the_real_entry_points():
    assert SERVICES["worker-1"]["command"] == SERVICES["worker-2"]["command"] == ["python", "-m", "agents"]
    assert SERVICES["api"]["command"] == ["python", "-m", "query_api"]
    assert SERVICES["schema"]["command"] == ["python", "-m", "counter_cli.schema_cmd", "apply"]
    for module in ("agents", "query_api", "counter_cli.schema_cmd"):
        assert importlib.util.find_spec(module) is not None, module
    assert (ROOT / "agents" / "__main__.py").exists() and (ROOT / "query_api" / "__main__.py").exists()


def test_counter_env_vars_are_settings_the_code_reads():
    fields = set(Settings.model_fields)
    for name in (*APP_SERVICES, "schema"):
        env = env_of(name)
        counter_vars = {k for k in env if k.startswith("COUNTER_")}
        assert {"COUNTER_KAFKA_BOOTSTRAP", "COUNTER_STORE", "COUNTER_CACHE", "COUNTER_NAMESPACES"} <= counter_vars
        unknown = {k for k in counter_vars if k.removeprefix("COUNTER_").lower() not in fields}
        assert not unknown, f"{name}: {unknown} are not read by streams/settings.py"


@pytest.mark.parametrize("name", [*APP_SERVICES, "schema"])
def test_each_services_environment_validates(monkeypatch, name):
    for var in [v for v in __import__("os").environ if v.startswith("COUNTER_")]:
        monkeypatch.delenv(var)
    for key, value in env_of(name).items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    assert settings.kafka_bootstrap == "kafka:9092"
    config = parse_cassandra_url(settings.store)
    assert config.hosts == ("cassandra",) and config.port == 9042 and config.keyspace == "counters"
    assert config.local_dc == env_of("cassandra")["CASSANDRA_DC"] and config.consistency == "LOCAL_QUORUM"
    assert settings.cache == "memcached://memcached:11211"
    assert settings.mutations_partitions >= 3 and settings.rollups_partitions >= 3
    assert settings.replication_factor == 1  # one broker here; the broker's default in production (README)


def test_workers_share_one_group_and_the_api_listens_outside():
    assert env_of("worker-1")["COUNTER_WORKER_ID"] == env_of("worker-2")["COUNTER_WORKER_ID"]
    api = env_of("api")
    assert api["COUNTER_API_HOST"] == "0.0.0.0"
    assert SERVICES["api"]["ports"] == [f"{api['COUNTER_API_PORT']}:{api['COUNTER_API_PORT']}"]


def test_namespaces_file_is_mounted_where_the_env_points():
    for name in APP_SERVICES:
        (mount,) = SERVICES[name]["volumes"]
        source, target, mode = mount.split(":")
        assert (INFRA / source).resolve() == ROOT / "control_plane" / "examples" / "namespaces.yaml"
        assert target == env_of(name)["COUNTER_NAMESPACES"] and mode == "ro"


def test_every_long_running_service_has_a_healthcheck():
    for name in LONG_RUNNING:
        check = SERVICES[name].get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert {"interval", "timeout", "retries"} <= set(check), name
    assert "6066/ready" in " ".join(SERVICES["worker-1"]["healthcheck"]["test"])
    assert env_of("worker-1")["COUNTER_WORKER_PORT"] == "6066"
    assert f"{env_of('api')['COUNTER_API_PORT']}/readyz" in " ".join(SERVICES["api"]["healthcheck"]["test"])
    assert "cqlsh" in SERVICES["cassandra"]["healthcheck"]["test"][1]
    assert "kafka-broker-api-versions" in SERVICES["kafka"]["healthcheck"]["test"][1]


def test_start_order_waits_for_health_and_the_schema():
    expected = {"kafka": "service_healthy", "cassandra": "service_healthy", "memcached": "service_healthy",
                "schema": "service_completed_successfully"}
    for name in APP_SERVICES:
        deps = {k: v["condition"] for k, v in SERVICES[name]["depends_on"].items()}
        assert deps == expected, name
    assert SERVICES["schema"]["depends_on"] == {"cassandra": {"condition": "service_healthy"}}
    assert SERVICES["schema"]["restart"] == "no"
    for s in SERVICES.values():
        assert set(s.get("depends_on", {})) <= set(SERVICES)


def test_volumes_are_declared():
    used = {v.split(":")[0] for s in SERVICES.values() for v in s.get("volumes", []) if not v.startswith(".")}
    assert used == set(COMPOSE["volumes"]) == {"kafka-data", "cassandra-data"}


def test_dockerfile_builds_the_package_and_its_compiled_parts():
    text = (INFRA / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert "pip install -c constraints.txt ." in text and "USER counter" in text
    packages = [p.rstrip("*") for p in tomllib.loads((ROOT / "pyproject.toml").read_text())
                ["tool"]["setuptools"]["packages"]["find"]["include"]]
    for package in packages:  # every package the install takes (the CLI imports jobs and bench)
        assert f"COPY {package} ./{package}" in text and (ROOT / package).is_dir()
    for part in PARTS:  # what `counter up` builds, the image builds, with the installed sources
        assert re.search(rf"/opt/counter/bin/python -m {re.escape(part.module)} ", text), part.module
    assert "COPY --from=build /opt/counter /opt/counter" in text


def test_runbook_covers_the_topics():
    text = (INFRA / "README.md").read_text().lower()
    for topic in ("sizing", "scaling out", "upgrades", "retention", "monitor", "lost cache", "lost rollup table"):
        assert topic in text, topic


# -- the CQL file matches the code -----------------------------------------------------------------------------


def test_schema_file_is_the_generated_one():
    assert (INFRA / "cassandra" / "schema.cql").read_text() == render_schema_file()
    text = render_schema_file()
    for table in BASE_TABLES:
        assert f"CREATE TABLE IF NOT EXISTS counters.{table} (" in text


# -- counter schema ----------------------------------------------------------------------------------------------


def run_schema(argv: list[str], monkeypatch, store: str | None = None) -> int:
    from counter_cli import schema_cmd

    monkeypatch.delenv("COUNTER_STORE", raising=False)
    if store:
        monkeypatch.setenv("COUNTER_STORE", store)
    return schema_cmd.main(argv)


def test_schema_print_is_the_cql_with_the_urls_keyspace_and_replication(monkeypatch, capsys):
    assert run_schema(["print", "--replication", "dc1:3,dc2:2"], monkeypatch, "cassandra://a,b/prod_ks?dc=dc1") == 0
    out = capsys.readouterr().out
    assert out.startswith("CREATE KEYSPACE IF NOT EXISTS prod_ks WITH replication = "
                          "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 2}")
    assert out.count("CREATE TABLE IF NOT EXISTS prod_ks.") == len(BASE_TABLES)


def test_schema_verbs_fail_with_a_named_reason(monkeypatch, capsys):
    with pytest.raises(SystemExit) as info:
        run_schema(["print", "--store", "cassandra://h:x/ks"], monkeypatch)
    assert info.value.code == 2 and "bad port 'x'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_schema(["print", "--store", "cassandra://h/ks", "--replication", "lots"], monkeypatch)
    assert "bad replication='lots'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        run_schema(["apply", "--store", "cassandra://127.0.0.1:1/ks?connect_timeout=1"], monkeypatch)
    assert info.value.code == 1 and "cannot apply the schema on cassandra://127.0.0.1:1/ks" in capsys.readouterr().err


def test_schema_apply_on_sqlite_creates_the_files(monkeypatch, tmp_path):
    assert run_schema(["apply", "--store", f"sqlite://{tmp_path}"], monkeypatch) == 0
    assert (tmp_path / "events.sqlite3").exists() and (tmp_path / "rollups.sqlite3").exists()


def test_schema_verb_registers_like_the_others():
    import argparse

    from counter_cli import schema_cmd

    parser = argparse.ArgumentParser(prog="counter")
    schema_cmd.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(["schema", "apply", "--store", "cassandra://h/ks"])
    assert args.run is schema_cmd.run_apply and args.store == "cassandra://h/ks"


# -- the factory routes cassandra:// -------------------------------------------------------------------------


def test_factory_routes_cassandra_urls(tmp_path):
    from cassandra.cluster import NoHostAvailable

    with pytest.raises(CassandraUrlError, match="bad port"):
        open_stores("cassandra://h:x/ks", tmp_path, lambda ns: None)
    with pytest.raises(NoHostAvailable):  # routed to the driver: nothing listens on port 1
        open_stores("cassandra://127.0.0.1:1/ks?connect_timeout=1", tmp_path, lambda ns: None)


# -- the contract suite says why Cassandra did not run -------------------------------------------------------------


def test_contract_skip_reason_is_explicit(monkeypatch):
    from tests import cassandra_support as cassandra_testing

    monkeypatch.delenv(cassandra_testing.ENV, raising=False)
    monkeypatch.setattr(cassandra_testing, "_state", {})
    with pytest.raises(pytest.skip.Exception) as info:
        cassandra_testing.contract_url()
    reason = str(info.value)
    assert reason.startswith("Cassandra contract tests not run: set COUNTER_TEST_CASSANDRA=host:port or run a "
                             "Docker engine for testcontainers (")
    with pytest.raises(pytest.skip.Exception) as again:  # remembered: later tests skip at once, same reason
        cassandra_testing.contract_url()
    assert str(again.value) == reason


@pytest.mark.parametrize("target, expected", [
    ("db1:9042", "cassandra://db1:9042/"),
    ("cassandra://u:p@db1,db2:9142/ignored?dc=dc9", "cassandra://u:p@db1,db2:9142/"),
])
def test_contract_url_from_the_environment(monkeypatch, target, expected):
    from tests import cassandra_support as cassandra_testing

    monkeypatch.setenv(cassandra_testing.ENV, target)
    monkeypatch.setattr(cassandra_testing, "_state", {})
    url = cassandra_testing.contract_url()
    assert url.startswith(expected + "counter_contract_") and "create=1&replication=1" in url
    config = parse_cassandra_url(url)
    assert config.create and config.replication_factor == 1
    if "dc9" in target:
        assert config.local_dc == "dc9"
