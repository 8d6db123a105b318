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
    ("COUNTER_KAFKA_BOOTSTRAP", " a:9092, b:65535 ", "kafka_bootstrap", "a:9092, b:65535"),
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
    assert set(specs) == {"counter-mutations", "counter-rollups", "counter-mutations-dlq"}
    assert specs["counter-mutations"].partitions == 12
    assert specs["counter-mutations"].config["message.timestamp.type"] == "LogAppendTime"


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
