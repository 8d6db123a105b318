"""`python -m query_api`: serve the API with settings from COUNTER_* (what `counter api` execs)."""

import sys

import uvicorn

from control_plane import ConfigError, NamespaceRegistry
from streams.namespace_shapes import NamespaceChanged, guard_namespaces
from streams.settings import Settings, SettingsError, load_settings
from streams.store_binding import BindingWatch, StoreMismatch


def main() -> int:
    try:
        settings = load_settings()
        if not settings.kafka_bootstrap:
            raise SettingsError("COUNTER_KAFKA_BOOTSTRAP: the API needs a broker (counter up sets it)")
        from control_plane import default_config_path, load_namespaces

        registry = load_namespaces(settings.namespaces or default_config_path())  # fail fast, naming the field
        _check_store_binding(settings, registry)
    except (SettingsError, ConfigError, StoreMismatch, NamespaceChanged) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from query_api.http_protocol import CounterHttpProtocol

    # uvicorn annotates timeout_keep_alive as int but only hands it to call_later: fractions of a second work
    uvicorn.run("query_api.app:create_app", factory=True, host=settings.api_host, port=settings.api_port,
                workers=settings.api_workers, http=CounterHttpProtocol, loop="uvloop", log_level="warning",
                access_log=False, timeout_keep_alive=settings.api_keep_alive_s)  # type: ignore[arg-type]
    return 0


STARTING_S = 5.0  # how long a request of the start's binding check waits for the broker (it is checked again later)


def _check_store_binding(settings: Settings, registry: NamespaceRegistry) -> None:
    """StoreMismatch, said here in one line, for a store that is not the one the consumer group persists into
    (streams.store_binding), and NamespaceChanged for a namespace setting changed in place
    (streams.namespace_shapes); the app's lifespan binds again (an app started otherwise), and says what else fails
    (a broker away: it starts, and binds once the broker answers)."""
    from sinks import store_identity, store_location

    try:
        identity = store_identity(settings.store, settings.data_dir, registry)
        BindingWatch(settings, identity, store_location(settings.store, settings.data_dir)).bind(STARTING_S)
        guard_namespaces(settings, registry, timeout_s=STARTING_S)
    except (StoreMismatch, NamespaceChanged):
        raise
    except Exception:  # the lifespan meets it again and says it
        return


if __name__ == "__main__":
    sys.exit(main())
