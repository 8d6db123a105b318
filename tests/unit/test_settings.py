"""Bad COUNTER_* values stop start-up with a message naming the variable."""

import pytest

from streams.settings import SettingsError, load_settings
from streams.topics import topic_specs


@pytest.mark.parametrize("var, value", [
    ("COUNTER_API_PORT", "eighty"),
    ("COUNTER_API_PORT", "70000"),
    ("COUNTER_KAFKA_BOOTSTRAP", "localhost"),
    ("COUNTER_STORE", "postgres://x"),
    ("COUNTER_CACHE", "redis://x"),
    ("COUNTER_MUTATIONS_PARTITIONS", "0"),
    ("COUNTER_SWEEP_INTERVAL_S", "inf"),
    ("COUNTER_READ_SIGNAL_LAG_S", "nan"),
    ("COUNTER_PERSIST_PROMPT_FOR_S", "1e400"),  # parses as inf
    ("COUNTER_GROUP_SESSION_TIMEOUT_S", "1e12"),
    ("COUNTER_PERSIST_DRAIN_S", "86400"),
    ("COUNTER_WATERMARK_INTERVAL_MS", "100000000000"),
    ("COUNTER_MUTATIONS_RETENTION_MS", "0"),
    ("COUNTER_MUTATIONS_RETENTION_MS", "604800"),  # 7 days written in seconds: 10 minutes
    ("COUNTER_KAFKA_BOOTSTRAP", "localhost:99999"),
    ("COUNTER_KAFKA_BOOTSTRAP", "a:9092,b:0"),
    ("COUNTER_WORKER_LOG_LEVEL", "verbose"),
    ("COUNTER_MUTATIONS_TOPIC", "bad topic/name"),
    ("COUNTER_ROLLUPS_TOPIC", "x" * 250),
    ("COUNTER_DLQ_TOPIC", ".."),
    ("COUNTER_WORKER_ID", ""),
    ("COUNTER_API_HOST", ""),
    ("COUNTER_CACHE", "memcached://"),
    ("COUNTER_CACHE", "memcached://localhost"),
    ("COUNTER_CACHE", "memcached://h:11211,h:70000"),
    ("COUNTER_STORE", "sqlite://relative/dir"),
])
def test_bad_setting_names_the_variable(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError, match=var):
        load_settings()


@pytest.mark.parametrize("var, value, attr, expected", [
    ("COUNTER_MUTATIONS_RETENTION_MS", "-1", "mutations_retention_ms", -1),
    ("COUNTER_MUTATIONS_RETENTION_MS", "3600000", "mutations_retention_ms", 3_600_000),
    ("COUNTER_WORKER_LOG_LEVEL", "INFO", "worker_log_level", "info"),
    ("COUNTER_CACHE", "memcached://10.0.0.1:11211,10.0.0.2:11211/", "cache", "memcached://10.0.0.1:11211,"
                                                                              "10.0.0.2:11211/"),
    ("COUNTER_KAFKA_BOOTSTRAP", " a:9092, b:65535 ", "kafka_bootstrap", "a:9092,b:65535"),
    ("COUNTER_MUTATIONS_TOPIC", "team.counter_mutations-v2", "mutations_topic", "team.counter_mutations-v2"),
    ("COUNTER_STORE", "sqlite:///var/lib/counter", "store", "sqlite:///var/lib/counter"),
])
def test_good_values_still_load(monkeypatch, var, value, attr, expected):
    monkeypatch.setenv(var, value)
    assert getattr(load_settings(), attr) == expected


def test_defaults_and_overrides(monkeypatch):
    monkeypatch.delenv("COUNTER_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("COUNTER_MUTATIONS_PARTITIONS", "12")
    s = load_settings()
    assert s.kafka_bootstrap is None and s.api_port == 8080 and str(s.data_dir) == ".counter"
    specs = {t.name: t for t in topic_specs(s)}
    assert set(specs) == {"counter-mutations", "counter-rollups", "counter-mutations-dlq",
                          "counter-mutations-stores"}
    assert specs["counter-mutations"].partitions == 12
    assert specs["counter-mutations"].config["message.timestamp.type"] == "LogAppendTime"
    # the broker's default replication (1 replica lost writes with its broker, and failed every write under
    # min.insync.replicas=2); batches kept as the producer compressed them
    assert {t.replication_factor for t in specs.values()} == {-1}
    assert {t.config["compression.type"] for t in specs.values()} == {"producer"}
    monkeypatch.setenv("COUNTER_REPLICATION_FACTOR", "3")
    assert {t.replication_factor for t in topic_specs(load_settings())} == {3}


@pytest.mark.parametrize("workers, shared, expected", [
    (None, None, False), ("2", None, True), (None, "true", True), ("2", "true", True), (None, "false", False)])
def test_api_shared_pipeline_follows_api_workers_unless_set(monkeypatch, workers, shared, expected):
    """Several API processes on one port share the pipeline; instances on other hosts say so themselves."""
    for var, value in (("COUNTER_API_WORKERS", workers), ("COUNTER_API_SHARED_PIPELINE", shared)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    assert load_settings().api_shared is expected


def test_api_shared_pipeline_false_with_several_api_workers_names_both(monkeypatch):
    """False there would let AddAndGetCount miss a write a sibling process acknowledged."""
    monkeypatch.setenv("COUNTER_API_WORKERS", "2")
    monkeypatch.setenv("COUNTER_API_SHARED_PIPELINE", "false")
    with pytest.raises(SettingsError, match=r"COUNTER_API_SHARED_PIPELINE: .*COUNTER_API_WORKERS=2"):
        load_settings()


@pytest.mark.parametrize("var, value, says", [
    ("COUNTER_API_HOST", "999.1.1.1", "'999.1.1.1' is not an IP address"),
    ("COUNTER_API_HOST", "1.2.3", "is not an IP address"),
    ("COUNTER_API_HOST", "http://localhost", "is neither an IP address nor a host name"),
    ("COUNTER_API_HOST", "a b", "is neither an IP address nor a host name"),
    ("COUNTER_KAFKA_BOOTSTRAP", "999.1.1.1:9092", "'999.1.1.1' is not an IP address"),
    ("COUNTER_CACHE", "memcached://-x:11211", "is neither an IP address nor a host name"),
    ("COUNTER_STORE", "cassandra://", "names no keyspace"),
    ("COUNTER_STORE", "cassandra://h1:9042", "names no keyspace"),
    ("COUNTER_STORE", "cassandra://h1/", "names no keyspace"),
    ("COUNTER_STORE", "cassandra:///ks", "names no host"),
    ("COUNTER_STORE", "cassandra://h1,,h2/ks", "names no host"),
    ("COUNTER_STORE", "cassandra://h1/1ks", "bad keyspace '1ks'"),
    ("COUNTER_STORE", "cassandra://h1:99999/ks", "bad port '99999'"),
    ("COUNTER_API_HOST", "[::1]", "without brackets here, e.g. '::1'"),  # passed, then "'[::1]' does not resolve"
    ("COUNTER_KAFKA_BOOTSTRAP", "[::1:9092", "'[::1' is no IPv6 address in brackets"),  # passed (from a review)
    ("COUNTER_KAFKA_BOOTSTRAP", "::1:9092", "written in brackets before its port"),
    ("COUNTER_CACHE", "memcached://[localhost]:11211", "'[localhost]' is no IPv6 address in brackets"),
])
def test_hosts_and_store_urls_are_checked_for_shape(monkeypatch, var, value, says):
    """A host that cannot be one, and a cassandra:// URL without hosts or keyspace, stop start-up naming the variable:
    `counter up` said "port 28180 is in use" of an unresolvable COUNTER_API_HOST, and started the broker and memcached
    before the worker died on "cassandra URL names no keyspace" without naming COUNTER_STORE (from a review)."""
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert f"{var}: " in str(info.value) and says in str(info.value), info.value


@pytest.mark.parametrize("var, value", [
    ("COUNTER_API_HOST", "::1"), ("COUNTER_API_HOST", "0.0.0.0"), ("COUNTER_API_HOST", "localhost"),
    ("COUNTER_API_HOST", "api_1.internal."), ("COUNTER_KAFKA_BOOTSTRAP", "[::1]:9092,kafka-0.kafka:9092"),
    ("COUNTER_CACHE", "memcached://[fe80::1]:11211"),
    ("COUNTER_STORE", "cassandra://h1,h2:9042/ks?dc=dc1"), ("COUNTER_STORE", "cassandra://u:p%40ss@[::1]:9042/ks"),
])
def test_good_hosts_and_store_urls_load(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    load_settings()


def test_a_plaintext_listener_is_taken_as_its_host_and_another_protocol_is_refused(monkeypatch):
    """librdkafka's listener form: Faust and aiokafka take host:port only, and the worker died on PLAINTEXT://."""
    monkeypatch.setenv("COUNTER_KAFKA_BOOTSTRAP", "PLAINTEXT://kafka:9092, plaintext://[::1]:9093,k2:9094")
    assert load_settings().kafka_bootstrap == "kafka:9092,[::1]:9093,k2:9094"
    monkeypatch.setenv("COUNTER_KAFKA_BOOTSTRAP", "PLAINTEXT://kafka:9092,SASL_SSL://kafka-1:9093")
    assert load_settings().kafka_bootstrap == "kafka:9092,kafka-1:9093"  # the protocol is the setting's
    monkeypatch.setenv("COUNTER_KAFKA_BOOTSTRAP", "http://kafka:9092")
    with pytest.raises(SettingsError, match="COUNTER_KAFKA_BOOTSTRAP: 'http://kafka:9092': 'http' is no Kafka "
                                            "listener protocol"):
        load_settings()


@pytest.mark.parametrize("var, value, says", [
    ("COUNTER_ROLLUPS_TOPIC", "counter-mutations", "COUNTER_ROLLUPS_TOPIC: is also COUNTER_MUTATIONS_TOPIC"),
    ("COUNTER_DLQ_TOPIC", "counter-mutations", "COUNTER_DLQ_TOPIC: is also COUNTER_MUTATIONS_TOPIC"),
    ("COUNTER_DLQ_TOPIC", "counter-rollups", "COUNTER_DLQ_TOPIC: is also COUNTER_ROLLUPS_TOPIC"),
])
def test_the_three_topics_must_differ(monkeypatch, var, value, says):
    """One topic named twice failed at start-up with a broker protocol error that named no variable (a review)."""
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError, match=says):
        load_settings()


def test_a_bad_value_is_shown_once(monkeypatch):
    """The validators' messages said "got 'foo'" and load_settings added "(got 'foo')" again."""
    monkeypatch.setenv("COUNTER_STORE", "foo")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert str(info.value) == ("invalid settings: COUNTER_STORE: expected 'sqlite', 'sqlite:///dir' or "
                               "'cassandra://hosts/keyspace' (got 'foo')")


def test_settings_a_worker_would_lower_to_the_rollup_window_are_named(monkeypatch):
    """COUNTER_PERSIST_CHECKPOINT_MS and COUNTER_PERSIST_EVENTUAL_WITHIN_MS above half the shortest coalesce_ms were
    lowered by the worker without a word (from a review); a default above it is lowered as documented."""
    from control_plane import parse_namespaces
    from streams.settings import namespace_bound_problems

    registry = parse_namespaces({"namespaces": {
        "slow": {"counter_type": "EVENTUAL", "queue_config": {"coalesce_ms": 10_000}},
        "fast": {"counter_type": "ACCURATE", "queue_config": {"coalesce_ms": 1_000}},
        "cache": {"counter_type": "BEST_EFFORT"}}})
    assert namespace_bound_problems(load_settings(), registry.values()) == []  # eventual_within 1000 by default
    monkeypatch.setenv("COUNTER_PERSIST_CHECKPOINT_MS", "3600000")
    monkeypatch.setenv("COUNTER_PERSIST_EVENTUAL_WITHIN_MS", "500")
    assert namespace_bound_problems(load_settings(), registry.values()) == [
        "COUNTER_PERSIST_CHECKPOINT_MS=3600000 is above 500, half the rollup window (the shortest coalesce_ms of the "
        "namespaces, 1000 of 'fast'): a worker would use 500; set at most 500, or raise coalesce_ms"]
    monkeypatch.setenv("COUNTER_PERSIST_EVENTUAL_WITHIN_MS", "3600000")
    assert [p.split("=")[0] for p in namespace_bound_problems(load_settings(), registry.values())] == [
        "COUNTER_PERSIST_CHECKPOINT_MS", "COUNTER_PERSIST_EVENTUAL_WITHIN_MS"]
    assert namespace_bound_problems(load_settings(), [registry["cache"]]) == []


def test_a_counter_variable_no_setting_reads_is_warned_of_with_the_one_it_may_mean(caplog) -> None:
    """pydantic ignores unknown COUNTER_* variables: a mistyped COUNTER_MUTATION_PARTITIONS left the default partitions
    in place without a word (a review). The tests' own COUNTER_TEST_* are not settings and not warned of."""
    from streams.settings import unknown_variables
    warnings = unknown_variables({"COUNTER_MUTATION_PARTITIONS": "4", "COUNTER_MUTATIONS_PARTITIONS": "4",
                                  "COUNTER_TEST_CASSANDRA": "h:9042", "COUNTER_TANSU_BIN": "/x", "HOME": "/",
                                  "COUNTER_ZZZ": "1"})
    assert warnings == [
        "COUNTER_MUTATION_PARTITIONS is not a setting and is ignored; did you mean COUNTER_MUTATIONS_PARTITIONS?",
        "COUNTER_ZZZ is not a setting and is ignored"]


def test_every_setting_is_in_the_readmes_configuration_table() -> None:
    """A review found 13 COUNTER_* variables the code reads and the table left out (topics, the consumer group's
    timeouts, the sweep and retention intervals, the log level, the API host). A row may name several as
    `COUNTER_X` / `_Y` (the same prefix) or `COUNTER_X` / `COUNTER_Y`."""
    import re
    from pathlib import Path

    from streams.settings import ENV_PREFIX, OTHER_VARIABLES, Settings

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    table = readme[readme.index("| variable | default | meaning |"):]
    table = table[:table.index("\n\n")]
    named: set[str] = set()
    for row in table.splitlines()[2:]:
        first = row.split(" | ")[0]
        names = re.findall(r"`(COUNTER_[A-Z0-9_]+|_[A-Z0-9_]+)`", first)
        full = ""
        for name in names:
            if name.startswith(ENV_PREFIX):
                named.add(full := name)
            else:  # `_CERT_FILE` after `COUNTER_KAFKA_SSL_CA_FILE`: as many of its last parts replaced
                named.add(full.rsplit("_", name.count("_"))[0] + name)
    tests_own = {"COUNTER_UI_SCREENSHOTS"}
    wanted = {ENV_PREFIX + name.upper() for name in Settings.model_fields} | (OTHER_VARIABLES - tests_own)
    assert wanted - named == set()
    assert named - wanted == set()  # no row names a variable nothing reads
