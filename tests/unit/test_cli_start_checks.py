"""What the verbs that start processes check first, and say: the listen address (`counter up`, `counter api`), the
namespace file's origin, settings the namespaces would override, and a worker's start and stop lines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
from rich.console import Console

from counter_cli import api_cmd, common, up_cmd, worker_cmd
from counter_cli.main import build_parser


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    for module in (common, up_cmd, worker_cmd):
        monkeypatch.setattr(module, "console", Console(stderr=True, width=400), raising=False)


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return " ".join(err.split())


def _exits(code: int, run: Any, *args: Any) -> None:
    with pytest.raises(SystemExit) as exited:
        run(*args)
    assert exited.value.code == code


def test_a_host_that_does_not_resolve_is_named_not_taken_for_a_port_in_use(monkeypatch, capsys):
    """`counter up` said "port 28180 is in use (COUNTER_API_PORT)" of COUNTER_API_HOST=no-such-host.invalid, and
    `counter api` printed uvicorn's "[Errno -2] Name or service not known" (from a review)."""
    def no_such_host(*_args: object, **_kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    _exits(1, common.check_listen, "no-such-host.invalid", 28180, "COUNTER_API_HOST", "COUNTER_API_PORT")
    assert ("error: COUNTER_API_HOST='no-such-host.invalid' does not resolve (Name or service not known)"
            in _error(capsys))


def test_an_address_of_another_machine_and_a_port_in_use_are_told_apart(capsys):
    _exits(1, common.check_listen, "192.0.2.1", 0, "--host", "--port")  # TEST-NET-1: no address of this machine
    assert "error: --host='192.0.2.1' is not an address of this machine" in _error(capsys)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        _exits(1, common.check_listen, "127.0.0.1", port, "COUNTER_API_HOST", "COUNTER_API_PORT")
    assert f"error: port {port} is in use (COUNTER_API_PORT)" in _error(capsys)
    common.check_listen("127.0.0.1", port, "COUNTER_API_HOST", "COUNTER_API_PORT")  # free again


def test_counter_api_names_a_bad_host_option(capsys):
    args = build_parser().parse_args(["api", "--host", "999.1.1.1", "--no-compile"])
    _exits(2, args.run, args)
    assert "error: --host: '999.1.1.1' is not an IP address" in _error(capsys)


def test_a_missing_namespace_file_names_the_variable_and_its_path_once(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("COUNTER_NAMESPACES", "/nonexistent.yaml")
    _exits(2, common.namespaces_or_exit, common.settings_or_exit())
    assert _error(capsys) == ("error: namespace configuration (COUNTER_NAMESPACES): /nonexistent.yaml: config file "
                              "not found")


def test_counter_up_refuses_a_setting_the_worker_would_lower(monkeypatch, tmp_path, capsys):
    """COUNTER_PERSIST_CHECKPOINT_MS=3600000 started normally and ran at half the coalesce_ms (from a review)."""
    monkeypatch.setenv("COUNTER_PERSIST_CHECKPOINT_MS", "3600000")
    monkeypatch.delenv("COUNTER_NAMESPACES", raising=False)
    args = build_parser().parse_args(["up", "--data-dir", str(tmp_path), "--no-compile"])
    monkeypatch.setattr(up_cmd, "LocalStack", lambda *_: pytest.fail("started despite the setting"))
    _exits(2, args.run, args)
    assert ("error: invalid settings: COUNTER_PERSIST_CHECKPOINT_MS=3600000 is above 5000, half the rollup window"
            in _error(capsys))


@pytest.mark.parametrize("verb", ["up", "api"])
@pytest.mark.parametrize(("env", "named"), [({"COUNTER_API_WORKERS": "2"}, "COUNTER_API_WORKERS=2"),
                                            ({"COUNTER_API_SHARED_PIPELINE": "true"}, "COUNTER_API_SHARED_PIPELINE")])
def test_api_processes_sharing_a_pipeline_refuse_the_in_process_cache(monkeypatch, tmp_path, capsys, verb, env,
                                                                       named):
    """A review: with COUNTER_API_WORKERS=2 and no memcached, each API process kept its own BEST_EFFORT counts
    (reads of 20 writes answered 5 and 15). The shipped namespaces have a BEST_EFFORT one."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COUNTER_CACHE", "memory")
    monkeypatch.delenv("COUNTER_NAMESPACES", raising=False)
    args = build_parser().parse_args([verb, "--data-dir", str(tmp_path), "--no-compile"])
    monkeypatch.setattr(up_cmd, "LocalStack", lambda *_: pytest.fail("started despite the setting"))
    monkeypatch.setattr(api_cmd.os, "execve", lambda *_: pytest.fail("started despite the setting"))
    _exits(2, args.run, args)
    error = _error(capsys)
    assert named in error and "COUNTER_CACHE=memory" in error and "BEST_EFFORT" in error, error
    assert "COUNTER_CACHE=memcached://host:port" in error


@pytest.mark.parametrize("verb", ["up", "api"])
def test_the_api_refuses_to_start_without_an_api_key_variable_that_other_verbs_do_without(monkeypatch, tmp_path,
                                                                                         capsys, verb):
    config = tmp_path / "keys.yaml"
    config.write_text("namespaces:\n  secured:\n    counter_type: EVENTUAL\n    api_keys:\n"
                      "      - {key_env: CP_TEST_UNSET_KEY, scopes: [read]}\n")
    monkeypatch.setenv("COUNTER_NAMESPACES", str(config))
    monkeypatch.delenv("CP_TEST_UNSET_KEY", raising=False)
    assert common.namespaces_or_exit(common.settings_or_exit())[1]["secured"].requires_auth  # loads for the others
    args = build_parser().parse_args([verb, "--data-dir", str(tmp_path), "--no-compile"])
    monkeypatch.setattr(up_cmd, "LocalStack", lambda *_: pytest.fail("started despite the setting"))
    monkeypatch.setattr(api_cmd.os, "execve", lambda *_: pytest.fail("started despite the setting"))
    _exits(2, args.run, args)
    assert ("namespace 'secured': api_keys[0].key_env: environment variable 'CP_TEST_UNSET_KEY' is not set or "
            "empty") in _error(capsys)


@pytest.mark.parametrize("verb", ["up", "api", "worker"])
def test_a_namespace_naming_another_store_than_the_deployments_is_refused_by_every_verb_that_starts(
        monkeypatch, tmp_path, capsys, verb):
    """A review saw a namespace's `store: cassandra` served from SQLite, and `cache: memory` kept in memcached: both
    fields were read and never used. One store and one cache serve every namespace."""
    config = tmp_path / "backends.yaml"
    config.write_text("namespaces:\n  elsewhere:\n    counter_type: EVENTUAL\n    store: cassandra\n"
                      "  here:\n    counter_type: EVENTUAL\n    store: sqlite\n    cache: default\n")
    monkeypatch.setenv("COUNTER_NAMESPACES", str(config))
    argv = [verb, "--data-dir", str(tmp_path), "--no-compile"] + (["--bootstrap", "127.0.0.1:9"] if verb == "worker"
                                                                  else [])
    args = build_parser().parse_args(argv)
    monkeypatch.setattr(up_cmd, "LocalStack", lambda *_: pytest.fail("started despite the setting"))
    monkeypatch.setattr(api_cmd.os, "execve", lambda *_: pytest.fail("started despite the setting"))
    monkeypatch.setattr(worker_cmd, "run_child", lambda *_, **__: pytest.fail("started despite the setting"))
    _exits(2, args.run, args)
    error = " ".join(_error(capsys).split())
    assert ("namespace 'elsewhere': field 'store': cassandra, but this deployment's store is sqlite (COUNTER_STORE), "
            "which serves every namespace") in error, error
    assert "'here'" not in error  # naming the deployment's own store is fine


def test_backend_problems_judge_the_cache_the_api_runs_on() -> None:
    from control_plane import parse_namespaces
    from streams.settings import backend_problems, load_settings

    registry = parse_namespaces({"namespaces": {
        "mem": {"counter_type": "BEST_EFFORT", "cache": "memory"},
        "shared": {"counter_type": "BEST_EFFORT", "cache": "memcached"},
        "any": {"counter_type": "EVENTUAL", "cache": "default", "store": "default"},
        "cass": {"counter_type": "EVENTUAL", "store": "cassandra"}}})
    sqlite, cassandra = load_settings(store="sqlite"), load_settings(store="cassandra://db1:9042/counters")

    def named(problems: list[str]) -> list[str]:
        return [p.split(":")[0] + ":" + p.split(":")[1] for p in problems]

    assert named(backend_problems(sqlite, registry.values())) == ["namespace 'cass': field 'store'"]  # the worker's
    assert named(backend_problems(cassandra, registry.values())) == []
    assert named(backend_problems(cassandra, registry.values(), in_process_cache=False)) == [
        "namespace 'mem': field 'cache'"]
    assert named(backend_problems(cassandra, registry.values(), in_process_cache=True)) == [
        "namespace 'shared': field 'cache'"]


def test_in_process_cache_problem_only_with_a_best_effort_namespace_and_shared_api() -> None:
    from control_plane import load_namespaces
    from streams.settings import in_process_cache_problem, load_settings

    registry = load_namespaces(common.default_config_path())
    durable = [ns for ns in registry.values() if ns.counter_type.value != "BEST_EFFORT"]
    assert in_process_cache_problem(load_settings(api_workers=2, cache="memory"), durable) is None
    assert in_process_cache_problem(load_settings(api_workers=1, cache="memory"), registry.values()) is None
    assert "no memcached installed" in (in_process_cache_problem(load_settings(api_workers=2, cache="auto"),
                                                                 registry.values()) or "")


def test_counter_worker_says_when_it_starts_and_stops(monkeypatch, tmp_path, capsys):
    """README: "a second worker joins the consumer group"; `counter worker` exec'd the worker and said nothing."""
    ran: list[dict[str, str]] = []

    def child(argv: list[str], env: dict[str, str], *, started: Any, name: str, stop_with: int | None) -> int:
        ran.append(env)
        started(4242)
        return 0

    monkeypatch.setattr(worker_cmd, "run_child", child)
    monkeypatch.setenv("COUNTER_WORKER_ID", "my-workers")
    monkeypatch.delenv("COUNTER_NAMESPACES", raising=False)
    args = build_parser().parse_args(["worker", "--bootstrap", "127.0.0.1:9", "--web-port", "0", "--no-compile",
                                      "--data-dir", str(tmp_path)])
    assert args.run(args) == 0
    port = ran[0]["COUNTER_WORKER_PORT"]
    assert int(port) > 0 and ran[0]["COUNTER_KAFKA_BOOTSTRAP"] == "127.0.0.1:9"
    assert (f"worker 4242 joining consumer group my-workers (persist: my-workers.persist) on 127.0.0.1:9; metrics "
            f"http://127.0.0.1:{port}/metrics") in _error(capsys)


def _stack_endpoints(tmp_path, **extra: Any) -> None:
    """The endpoints file of a running `counter up` on tmp_path (this process plays its supervisor)."""
    import json

    (tmp_path / ".counter").mkdir(exist_ok=True)
    endpoints = {"kafka_bootstrap": "127.0.0.1:9", "supervisor_pid": os.getpid(), **extra}
    common.settings_or_exit(data_dir=tmp_path).endpoints_path.write_text(json.dumps(endpoints))


def _worker_env(monkeypatch, tmp_path) -> list[dict[str, str]]:
    ran: list[dict[str, str]] = []

    def child(argv: list[str], env: dict[str, str], *, started: Any, name: str, stop_with: int | None) -> int:
        ran.append({**env, "stop_with": str(stop_with)})
        return 0

    monkeypatch.setattr(worker_cmd, "run_child", child)
    args = build_parser().parse_args(["worker", "--web-port", "0", "--no-compile", "--data-dir", str(tmp_path)])
    assert args.run(args) == 0
    return ran


def test_a_worker_joining_counter_up_takes_its_cache_and_namespace_file(monkeypatch, tmp_path, capsys):
    """A review: `counter worker` beside `counter up`, as the README shows, rolled counters up without the
    memcached the API reads (GetCount kept answering 0 for 7, indefinitely), and loaded the shipped namespaces
    instead of counter up's COUNTER_NAMESPACES (it dead-lettered the writes of the others)."""
    for name in ("COUNTER_NAMESPACES", "COUNTER_CACHE", "COUNTER_KAFKA_BOOTSTRAP"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "mine.yaml"
    config.write_text(common.default_config_path().read_text())
    _stack_endpoints(tmp_path, memcached="127.0.0.1:11311", namespaces=str(config))
    [env] = _worker_env(monkeypatch, tmp_path)
    assert env["COUNTER_CACHE"] == "memcached://127.0.0.1:11311" and env["COUNTER_NAMESPACES"] == str(config)
    assert env["COUNTER_KAFKA_BOOTSTRAP"] == "127.0.0.1:9" and "warning" not in _error(capsys)
    assert env["stop_with"] == str(os.getpid())  # counter up's supervisor (this process plays it)
    _stack_endpoints(tmp_path, memcached=None, namespaces=str(config))  # counter up's in-process cache
    assert _worker_env(monkeypatch, tmp_path)[0]["COUNTER_CACHE"] == "memory"


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("COUNTER_CACHE", "memcached://127.0.0.1:11999", "the running `counter up`'s API reads memcached://127.0.0.1:1"),
    ("COUNTER_NAMESPACES", "OTHER", "the running `counter up` uses"),
])
def test_a_worker_joining_counter_up_with_another_cache_or_namespace_file_fails(monkeypatch, tmp_path, capsys,
                                                                                variable, value, said):
    for name in ("COUNTER_NAMESPACES", "COUNTER_CACHE", "COUNTER_KAFKA_BOOTSTRAP"):
        monkeypatch.delenv(name, raising=False)
    other = tmp_path / "other.yaml"
    other.write_text(common.default_config_path().read_text().replace("my_dataset", "other_dataset"))
    monkeypatch.setenv(variable, str(other) if value == "OTHER" else value)
    _stack_endpoints(tmp_path, memcached="127.0.0.1:11311", namespaces=str(common.default_config_path()))
    monkeypatch.setattr(worker_cmd, "run_child", lambda *_a, **_k: pytest.fail("started despite the mismatch"))
    args = build_parser().parse_args(["worker", "--web-port", "0", "--no-compile", "--data-dir", str(tmp_path)])
    _exits(2, args.run, args)
    error = _error(capsys)
    assert variable in error and said in error, error


DEPLOYMENT = ("COUNTER_NAMESPACES", "COUNTER_CACHE", "COUNTER_KAFKA_BOOTSTRAP", "COUNTER_STORE", "COUNTER_WORKER_ID",
              "COUNTER_MUTATIONS_TOPIC", "COUNTER_ROLLUPS_TOPIC", "COUNTER_DLQ_TOPIC")


def _deployment_endpoints(tmp_path) -> dict[str, str]:
    return {"memcached": "127.0.0.1:11311", "namespaces": str(common.default_config_path()),
            "store": f"sqlite://{(tmp_path / 'elsewhere').resolve()}", "worker_id": "w-stack",
            "mutations_topic": "m-stack", "rollups_topic": "r-stack", "dlq_topic": "d-stack"}


def test_a_process_joining_counter_up_takes_its_store_group_and_topics(monkeypatch, tmp_path):
    """A review: a `counter worker` with another COUNTER_STORE (a stale variable in the shell is enough) joined the
    consumer group and persisted its share of the acknowledged writes where no API reads them: 214 of 912 were never
    counted. A joining process now takes counter up's store, consumer group and topics."""
    for name in DEPLOYMENT:
        monkeypatch.delenv(name, raising=False)
    recorded = _deployment_endpoints(tmp_path)
    _stack_endpoints(tmp_path, **recorded)
    [env] = _worker_env(monkeypatch, tmp_path)
    for name in ("store", "worker_id", "mutations_topic", "rollups_topic", "dlq_topic"):
        assert env[f"COUNTER_{name.upper()}"] == recorded[name], name
    settings = common.stack_settings_or_exit(data_dir=tmp_path)  # the operator tools too
    assert settings.store == recorded["store"] and settings.worker_id == "w-stack"
    assert settings.mutations_topic == "m-stack" and settings.dlq_topic == "d-stack"
    monkeypatch.setenv("COUNTER_STORE", f"sqlite://{tmp_path / 'x' / '..' / 'elsewhere'}")  # the same, said otherwise
    monkeypatch.setenv("COUNTER_WORKER_ID", "w-stack")
    assert _worker_env(monkeypatch, tmp_path)[0]["COUNTER_WORKER_ID"] == "w-stack"


def test_counter_ups_cassandra_password_is_never_recorded_and_a_joined_process_must_give_it(monkeypatch, tmp_path,
                                                                                      capsys):
    """A review: the store URL recorded for joined processes (endpoints.json, counter up's console) carried the
    Cassandra password. It is masked there; a process joining such a stack sets COUNTER_STORE itself."""
    for name in DEPLOYMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COUNTER_STORE", "cassandra://svc:s3cret@db1:9042/ks")
    recorded = common.store_location(common.settings_or_exit(data_dir=tmp_path))
    assert recorded == "cassandra://svc:***@db1:9042/ks"
    _stack_endpoints(tmp_path, store=recorded)
    assert "store" not in common.joined_stack(common.settings_or_exit(data_dir=tmp_path)), "the same store, given"
    monkeypatch.delenv("COUNTER_STORE")
    monkeypatch.setattr(worker_cmd, "run_child", lambda *_a, **_k: pytest.fail("started without the store"))
    args = build_parser().parse_args(["worker", "--no-compile", "--data-dir", str(tmp_path)])
    _exits(2, args.run, args)
    error = _error(capsys)
    assert "set COUNTER_STORE to counter up's" in error and "s3cret" not in error, error


@pytest.mark.parametrize("verb", ["worker", "api"])
def test_a_worker_or_api_joining_counter_up_with_another_broker_fails(monkeypatch, tmp_path, capsys, verb):
    """Another broker's partitions have the same numbers: their watermarks would overwrite the stack's in the shared
    store, and a rollup could pass writes the stack's worker had not persisted (a review's follow-up)."""
    for name in DEPLOYMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COUNTER_API_PORT", "0")  # not the default 8080, which a `counter up` on this host may hold
    _stack_endpoints(tmp_path, memcached="127.0.0.1:11311")  # its broker: 127.0.0.1:9
    monkeypatch.setattr(worker_cmd, "run_child", lambda *_a, **_k: pytest.fail("started on another broker"))
    monkeypatch.setattr(api_cmd.os, "execve", lambda *_a: pytest.fail("started on another broker"))
    args = build_parser().parse_args([verb, "--no-compile", "--bootstrap", "10.0.0.7:9092",
                                      "--data-dir", str(tmp_path)])
    _exits(2, args.run, args)
    error = _error(capsys)
    assert "--bootstrap=10.0.0.7:9092, but the running `counter up` in this data directory uses the broker " \
           "127.0.0.1:9" in error, error
    monkeypatch.setenv("COUNTER_KAFKA_BOOTSTRAP", "PLAINTEXT://127.0.0.1:9")  # the same broker, said otherwise
    if verb == "worker":
        assert _worker_env(monkeypatch, tmp_path)[0]["COUNTER_KAFKA_BOOTSTRAP"] == "127.0.0.1:9"


@pytest.mark.parametrize(("variable", "value"), [
    ("COUNTER_STORE", "sqlite"), ("COUNTER_WORKER_ID", "other"), ("COUNTER_MUTATIONS_TOPIC", "other"),
    ("COUNTER_ROLLUPS_TOPIC", "other"), ("COUNTER_DLQ_TOPIC", "other")])
@pytest.mark.parametrize("verb", ["worker", "api"])
def test_a_process_joining_counter_up_with_another_store_group_or_topic_fails(monkeypatch, tmp_path, capsys,
                                                                              variable, value, verb):
    for name in DEPLOYMENT:
        monkeypatch.delenv(name, raising=False)
    _stack_endpoints(tmp_path, **_deployment_endpoints(tmp_path))
    monkeypatch.setenv(variable, value)
    monkeypatch.setattr(worker_cmd, "run_child", lambda *_a, **_k: pytest.fail("started despite the mismatch"))
    monkeypatch.setattr(api_cmd.os, "execve", lambda *_a: pytest.fail("started despite the mismatch"))
    args = build_parser().parse_args([verb, "--no-compile", "--data-dir", str(tmp_path)])
    _exits(2, args.run, args)
    error = _error(capsys)
    assert f"{variable}={value}, but the running `counter up` uses" in error and f"unset {variable}" in error, error


@pytest.mark.parametrize("stack_shares", [False, True])
def test_an_api_beside_counter_up_takes_its_cache_and_namespaces_and_shares_the_pipeline(monkeypatch, tmp_path,
                                                                                         capsys, stack_shares):
    """A review: `counter api` beside `counter up` took only the broker, and counted BEST_EFFORT writes in its own
    in-process cache (5 on one API, 7 on the other, of 12). It takes counter up's cache and namespace file, shares
    the pipeline, and says when counter up's own API does not."""
    for name in ("COUNTER_NAMESPACES", "COUNTER_CACHE", "COUNTER_KAFKA_BOOTSTRAP", "COUNTER_API_SHARED_PIPELINE"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "mine.yaml"
    config.write_text(common.default_config_path().read_text())
    _stack_endpoints(tmp_path, memcached="127.0.0.1:11311", namespaces=str(config), api_shared_pipeline=stack_shares)
    started: list[dict[str, str]] = []

    def execve(_path: str, _argv: list[str], env: dict[str, str]) -> None:
        started.append(env)
        raise SystemExit(0)

    monkeypatch.setattr(api_cmd.os, "execve", execve)
    args = build_parser().parse_args(["api", "--port", "0", "--no-compile", "--data-dir", str(tmp_path)])
    _exits(0, args.run, args)
    [env] = started
    assert env["COUNTER_CACHE"] == "memcached://127.0.0.1:11311" and env["COUNTER_NAMESPACES"] == str(config)
    assert env["COUNTER_API_SHARED_PIPELINE"] == "true" and env["COUNTER_KAFKA_BOOTSTRAP"] == "127.0.0.1:9"
    said = _error(capsys)
    assert ("its AddAndGetCount does not count this API's writes" in said) is not stack_shares, said


def test_the_operator_tools_take_counter_ups_namespace_file(monkeypatch, tmp_path):
    """A review: replay, recount, audit, dlq and produce loaded the shipped namespaces beside a `counter up` started
    with its own: a replay rejected 16 counted writes as an unknown namespace's, and could dead-letter them."""
    for name in ("COUNTER_NAMESPACES", "COUNTER_CACHE", "COUNTER_KAFKA_BOOTSTRAP"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "mine.yaml"
    config.write_text(common.default_config_path().read_text().replace("my_dataset:", "nope:", 1))
    _stack_endpoints(tmp_path, memcached="127.0.0.1:11311", namespaces=str(config))
    for settings in (common.stack_settings_or_exit(data_dir=tmp_path), common.job_settings("127.0.0.1:9", tmp_path)):
        assert settings.namespaces == config and settings.cache == "memcached://127.0.0.1:11311"
        assert "nope" in common.namespaces_or_exit(settings)[1].names()


def test_a_worker_without_counter_up_or_memcached_warns_that_it_writes_no_shared_cache(monkeypatch, tmp_path,
                                                                                       capsys):
    for name in ("COUNTER_NAMESPACES", "COUNTER_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COUNTER_KAFKA_BOOTSTRAP", "127.0.0.1:9")
    [env] = _worker_env(monkeypatch, tmp_path)
    assert "COUNTER_CACHE" not in env and "writes no shared cache (COUNTER_CACHE=auto)" in _error(capsys)


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_a_worker_beside_counter_up_stops_when_counter_up_is_gone(monkeypatch, capsys, ignores_sigterm):
    """A review: a second worker outlived the stack's stop, writing thousands of connection errors to a broker that
    was gone, and ignored SIGTERM for 40 s. It is stopped once counter up is gone, and killed STOP_GRACE_S on."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process
    monkeypatch.setattr(worker_cmd, "STOP_GRACE_S", 0.5)
    body = ("import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignores_sigterm else "")
            + "time.sleep(60)")
    started = time.monotonic()
    code = worker_cmd.run_child([sys.executable, "-c", body], {}, started=lambda pid: None, name="worker",
                                stop_with=gone.pid)
    assert time.monotonic() - started < 10
    assert code == (128 + signal.SIGKILL if ignores_sigterm else 128 + signal.SIGTERM)
    assert f"counter up ({gone.pid}) stopped, and its broker with it: stopping worker" in _error(capsys)


def test_run_child_forwards_a_stop_signal_and_says_how_the_child_ended(tmp_path, capsys):
    code = worker_cmd.run_child([sys.executable, "-c", "import sys; sys.exit(3)"], {}, started=lambda pid: None,
                                name="worker")
    assert code == 3 and "stopped (exit code 3)" in _error(capsys)
    flag = tmp_path / "ready"
    script = ("import pathlib, signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
              f"pathlib.Path({str(flag)!r}).touch()\n"
              "time.sleep(60)\n")
    pids: list[int] = []

    def started(pid: int) -> None:
        pids.append(pid)
        deadline = time.monotonic() + 30
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.raise_signal(signal.SIGTERM)  # as a `kill` of `counter worker` would: forwarded to the child

    code = worker_cmd.run_child([sys.executable, "-c", script], {}, started=started, name="worker")
    assert code == 0
    assert f"worker {pids[0]} stopped after SIGTERM (exit code 0)" in _error(capsys)


def test_run_child_stops_the_child_with_sigterm_on_sighup(tmp_path, capsys):
    """A SIGHUP (a closed terminal: the child has its own session) is a stop: forwarded as SIGTERM, which the worker
    handles, not as a SIGHUP, which killed it unstopped (review)."""
    flag = tmp_path / "ready"
    script = ("import pathlib, signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
              f"pathlib.Path({str(flag)!r}).touch()\n"
              "time.sleep(60)\n")

    def started(_pid: int) -> None:
        deadline = time.monotonic() + 30
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.raise_signal(signal.SIGHUP)

    assert worker_cmd.run_child([sys.executable, "-c", script], {}, started=started, name="worker") == 0
    assert "stopped after SIGHUP (exit code 0)" in _error(capsys)


def test_a_bad_web_port_is_named_as_the_argument_given(tmp_path, capsys):
    """`--web-port 70000` was refused naming COUNTER_WORKER_PORT, a variable the user had not set (review)."""
    args = build_parser().parse_args(["worker", "--bootstrap", "127.0.0.1:9", "--web-port", "70000", "--no-compile",
                                      "--data-dir", str(tmp_path)])
    _exits(2, args.run, args)
    err = _error(capsys)
    assert "--web-port: 70000 is outside 0..65535" in err and "COUNTER_WORKER_PORT" not in err, err


def test_audit_by_bucket_of_a_unique_namespace_is_refused_naming_why(monkeypatch, tmp_path, capsys):
    """A review: `counter audit visitors C --by hour` printed 200 (the writes) where GetCountSeries answered 20
    distinct items; the README says --by prints the series as GetCountSeries answers it."""
    for name in ("COUNTER_NAMESPACES", "COUNTER_CACHE", "COUNTER_KAFKA_BOOTSTRAP"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "rollups.sqlite3").touch()  # a store there
    args = build_parser().parse_args(["audit", "visitors", "home", "--by", "hour", "--data-dir", str(tmp_path)])
    _exits(2, args.run, args)
    assert "--by: namespace 'visitors' counts distinct items (UNIQUE)" in _error(capsys)


@pytest.mark.parametrize("wait", ["nan", "inf", "-1"])
def test_recount_wait_is_a_bounded_number_of_seconds(tmp_path, capsys, wait):
    """A review: --wait nan and inf were taken; with inf a counter staying behind was waited for forever."""
    args = build_parser().parse_args(["recount", "my_dataset", "--all", "--wait", wait, "--data-dir", str(tmp_path)])
    _exits(2, args.run, args)
    assert "--wait must be 0 to 3600 seconds" in _error(capsys)


@pytest.mark.parametrize("endpoints, says", [
    ({"processes": {"broker": 4242, "worker-0": 4243}, "supervisor_pid": 77}, True),
    ({"processes": {"broker": None}, "supervisor_pid": 77}, False),  # on Apache Kafka: nothing lost with a broker
    (None, False),  # a clean stop removes the file
])
def test_an_endpoints_file_left_by_a_version_without_the_lock_pid_says_the_last_run_did_not_stop(
        tmp_path, capsys, endpoints, says):
    """An upgrade review: a data directory whose last `counter up`, of a version that did not write its pid into the
    lock file, was killed gave no warning that its broker's unpersisted writes were lost. Its endpoints file names
    the broker it ran, and a stop removes that file."""
    path = tmp_path / "endpoints.json"
    if endpoints is not None:
        path.write_text(json.dumps(endpoints))
    handle = up_cmd._lock_data_dir(tmp_path, path)
    handle.close()
    said = " ".join(capsys.readouterr().err.split())
    assert (f"the last `counter up` on {tmp_path} (pid 77) ended without its stop" in said) is says, said


@pytest.mark.parametrize(("url", "says"), [
    ("cassandra://a:9042,b:9043/ks", "hosts use different ports [9042, 9043]: all hosts share one port"),
    ("cassandra://a/ks?consistency=MOST", "consistency"),
    ("cassandra://a/ks?colour=red", "unknown cassandra URL option 'colour'"),
])
def test_a_cassandra_url_is_parsed_whole_before_anything_starts(monkeypatch, capsys, url, says):
    """The maintainability review: the settings check only the URL's shape (streams may not import sinks), and a URL
    they passed failed `counter api` with uvicorn's "Application startup failed" and a traceback. Every verb reads
    its settings through `settings_or_exit`, which now parses it as the store will."""
    monkeypatch.setenv("COUNTER_STORE", url)
    common.load_settings()  # the shape passes
    _exits(2, common.settings_or_exit)
    error = _error(capsys)
    assert error.startswith("error: invalid settings: COUNTER_STORE: ") and says in error, error
