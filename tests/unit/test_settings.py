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
])
def test_bad_setting_names_the_variable(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError, match=var):
        load_settings()


def test_defaults_and_overrides(monkeypatch):
    monkeypatch.delenv("COUNTER_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("COUNTER_MUTATIONS_PARTITIONS", "12")
    s = load_settings()
    assert s.kafka_bootstrap is None and s.api_port == 8080 and str(s.data_dir) == ".counter"
    specs = {t.name: t for t in topic_specs(s)}
    assert set(specs) == {"counter-mutations", "counter-rollups", "counter-mutations-dlq"}
    assert specs["counter-mutations"].partitions == 12
    assert specs["counter-mutations"].config["message.timestamp.type"] == "LogAppendTime"
