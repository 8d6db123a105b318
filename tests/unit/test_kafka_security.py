"""The Kafka clients' security settings: what each protocol gives librdkafka, aiokafka and Faust, and the settings'
checks (a review: no client had any, so the service could not reach a cluster that wants TLS or SASL). TLS runs end
to end in tests/integration/test_kafka_tls.py; SASL cannot, with the local broker."""

from __future__ import annotations

import inspect
import ssl
from pathlib import Path

import aiokafka
import faust
import pytest

from streams.kafka_security import KafkaSecurity
from streams.settings import SettingsError, load_settings

CLEAR = ("COUNTER_KAFKA_SECURITY_PROTOCOL", "COUNTER_KAFKA_SASL_MECHANISM", "COUNTER_KAFKA_SASL_USERNAME",
         "COUNTER_KAFKA_SASL_PASSWORD", "COUNTER_KAFKA_SSL_CA_FILE", "COUNTER_KAFKA_SSL_CERT_FILE",
         "COUNTER_KAFKA_SSL_KEY_FILE")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CLEAR:
        monkeypatch.delenv(name, raising=False)


def test_plaintext_configures_nothing() -> None:
    security = load_settings().kafka_security
    assert (security.librdkafka(), security.aiokafka(), security.faust()) == ({}, {}, {})


def test_sasl_ssl_reaches_every_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COUNTER_KAFKA_SECURITY_PROTOCOL", "sasl_ssl")
    monkeypatch.setenv("COUNTER_KAFKA_SASL_MECHANISM", "scram-sha-512")
    monkeypatch.setenv("COUNTER_KAFKA_SASL_USERNAME", "svc")
    monkeypatch.setenv("COUNTER_KAFKA_SASL_PASSWORD", "s3cret")
    settings = load_settings()
    assert "s3cret" not in repr(settings)  # a secret: never printed with the settings
    security = settings.kafka_security
    assert security.librdkafka() == {"security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512",
                                     "sasl.username": "svc", "sasl.password": "s3cret"}
    kw = security.aiokafka()
    assert (kw["security_protocol"], kw["sasl_mechanism"], kw["sasl_plain_username"], kw["sasl_plain_password"]) == (
        "SASL_SSL", "SCRAM-SHA-512", "svc", "s3cret")
    assert isinstance(kw["ssl_context"], ssl.SSLContext) and kw["ssl_context"].check_hostname
    taken = inspect.signature(aiokafka.AIOKafkaConsumer.__init__).parameters  # keyword arguments aiokafka takes
    assert set(kw) <= set(taken), set(kw) - set(taken)
    credentials = security.faust()["broker_credentials"]
    assert isinstance(credentials, faust.SASLCredentials) and credentials.protocol.value == "SASL_SSL"
    assert credentials.mechanism.value == "SCRAM-SHA-512" and credentials.username == "svc"


def test_tls_with_a_ca_and_a_client_certificate(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("unused here")
    security = KafkaSecurity("SSL", ca_file=ca, cert_file=tmp_path / "c.pem", key_file=tmp_path / "k.pem")
    assert security.librdkafka() == {"security.protocol": "ssl", "ssl.ca.location": str(ca),
                                     "ssl.certificate.location": str(tmp_path / "c.pem"),
                                     "ssl.key.location": str(tmp_path / "k.pem")}
    assert isinstance(KafkaSecurity("SSL").faust()["broker_credentials"], faust.SSLCredentials)


@pytest.mark.parametrize(("env", "said"), [
    ({"COUNTER_KAFKA_SECURITY_PROTOCOL": "TLS"}, "COUNTER_KAFKA_SECURITY_PROTOCOL: expected one of PLAINTEXT, SSL"),
    ({"COUNTER_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "COUNTER_KAFKA_SASL_MECHANISM": "PLAIN"},
     "COUNTER_KAFKA_SASL_USERNAME: required with COUNTER_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT"),
    ({"COUNTER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "COUNTER_KAFKA_SASL_MECHANISM": "GSSAPI"},
     "COUNTER_KAFKA_SASL_MECHANISM: expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    ({"COUNTER_KAFKA_SASL_USERNAME": "svc"}, "COUNTER_KAFKA_SASL_USERNAME: set, but "
                                             "COUNTER_KAFKA_SECURITY_PROTOCOL=PLAINTEXT uses no SASL"),
    ({"COUNTER_KAFKA_SECURITY_PROTOCOL": "SSL", "COUNTER_KAFKA_SSL_CA_FILE": "/no/such/ca.pem"},
     "COUNTER_KAFKA_SSL_CA_FILE: /no/such/ca.pem is not a readable file"),
    ({"COUNTER_KAFKA_SSL_CA_FILE": __file__}, "COUNTER_KAFKA_SSL_CA_FILE: set, but "
                                              "COUNTER_KAFKA_SECURITY_PROTOCOL=PLAINTEXT uses no TLS"),
    ({"COUNTER_KAFKA_SECURITY_PROTOCOL": "SSL", "COUNTER_KAFKA_SSL_CERT_FILE": __file__},
     "COUNTER_KAFKA_SSL_CERT_FILE and COUNTER_KAFKA_SSL_KEY_FILE: give both"),
])
def test_a_half_set_security_stops_start_up_naming_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                                env: dict[str, str], said: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=said.replace("(", r"\(")):
        load_settings()
