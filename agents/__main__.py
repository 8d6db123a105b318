"""`python -m agents`: run one worker with settings from COUNTER_* (what `counter worker` execs)."""

import logging
import sys

from control_plane import ConfigError
from streams.namespace_shapes import NamespaceChanged
from streams.settings import SettingsError, load_settings
from streams.store_binding import StoreMismatch


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings()
        if not settings.kafka_bootstrap:
            raise SettingsError("COUNTER_KAFKA_BOOTSTRAP: the worker needs a broker (counter up sets it)")
        from agents.worker import build, start

        pipeline = build(settings)
    except (SettingsError, ConfigError, StoreMismatch, NamespaceChanged) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # broker, store or cache unreachable at start-up: one line, not a traceback
        logging.getLogger("counter.worker").debug("start-up failed", exc_info=True)
        print(f"error: cannot start the worker: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    start(pipeline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
