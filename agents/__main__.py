"""`python -m agents`: run one worker with settings from COUNTER_* (what `counter worker` execs)."""

import logging
import sys

from control_plane import ConfigError
from infra.process import ServiceError
from streams.settings import SettingsError, load_settings


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings()
        if not settings.kafka_bootstrap:
            raise SettingsError("COUNTER_KAFKA_BOOTSTRAP: the worker needs a broker (counter up sets it)")
        from agents.worker import run

        run(settings)
    except (SettingsError, ConfigError, ServiceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
