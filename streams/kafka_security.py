"""How every Kafka client of the service authenticates and encrypts: one setting, three clients' shapes.

The service talks to Kafka through librdkafka (confluent-kafka: producers, admin, the tools' consumers), aiokafka (the
persist consumer) and Faust (the rollup agent's group). `KafkaSecurity` is the COUNTER_KAFKA_SECURITY_PROTOCOL,
COUNTER_KAFKA_SASL_* and COUNTER_KAFKA_SSL_* settings (`streams.settings`) in each one's terms, so that no client
connects in plaintext to a cluster that wants TLS or SASL (managed Kafka does).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PROTOCOLS", "SASL_MECHANISMS", "KafkaSecurity"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    ca_file: Path | None = None  # None with TLS: the system's trusted CAs
    cert_file: Path | None = None  # a client certificate (mutual TLS), with its key
    key_file: Path | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def librdkafka(self) -> dict[str, str]:
        """confluent-kafka's config keys; nothing for PLAINTEXT (the clients' default)."""
        if self.protocol == "PLAINTEXT":
            return {}
        out = {"security.protocol": self.protocol.lower()}
        if self.sasl:
            out |= {"sasl.mechanism": str(self.sasl_mechanism), "sasl.username": str(self.username),
                    "sasl.password": str(self.password)}
        for key, path in (("ssl.ca.location", self.ca_file), ("ssl.certificate.location", self.cert_file),
                          ("ssl.key.location", self.key_file)):
            if self.tls and path is not None:
                out[key] = str(path)
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context aiokafka and Faust connect with (None without TLS): the CA file or the system's CAs,
        hostname checked, the client certificate when given."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.cert_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file) if self.key_file else None)
        return context

    def aiokafka(self) -> dict[str, Any]:
        """AIOKafkaConsumer's keyword arguments; nothing for PLAINTEXT."""
        if self.protocol == "PLAINTEXT":
            return {}
        out: dict[str, Any] = {"security_protocol": self.protocol, "ssl_context": self.ssl_context()}
        if self.sasl:
            out |= {"sasl_mechanism": self.sasl_mechanism, "sasl_plain_username": self.username,
                    "sasl_plain_password": self.password}
        return out

    def faust(self) -> dict[str, Any]:
        """faust.App's keyword arguments (`broker_credentials`); nothing for PLAINTEXT."""
        import faust

        if self.sasl:
            return {"broker_credentials": faust.SASLCredentials(
                username=self.username, password=self.password, ssl_context=self.ssl_context(),
                mechanism=self.sasl_mechanism)}
        if self.tls:
            return {"broker_credentials": faust.SSLCredentials(self.ssl_context())}
        return {}
