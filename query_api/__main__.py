"""`python -m query_api`: serve the API with settings from COUNTER_* (what `counter api` execs)."""

import sys

import uvicorn

from control_plane import ConfigError
from streams.settings import SettingsError, load_settings


def main() -> int:
    try:
        settings = load_settings()
        if not settings.kafka_bootstrap:
            raise SettingsError("COUNTER_KAFKA_BOOTSTRAP: the API needs a broker (counter up sets it)")
        from control_plane import default_config_path, load_namespaces

        load_namespaces(settings.namespaces or default_config_path())  # fail fast, naming the field
    except (SettingsError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from query_api.http_protocol import CounterHttpProtocol

    # uvicorn annotates timeout_keep_alive as int but only hands it to call_later: fractions of a second work
    uvicorn.run("query_api.app:create_app", factory=True, host=settings.api_host, port=settings.api_port,
                workers=settings.api_workers, http=CounterHttpProtocol, loop="uvloop", log_level="warning",
                access_log=False, timeout_keep_alive=settings.api_keep_alive_s)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
