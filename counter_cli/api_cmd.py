"""`counter api`: serve the HTTP API in the foreground."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from counter_cli.common import (
    add_no_compile,
    build_native_parts,
    check_api_namespaces,
    check_listen,
    console,
    fail,
    joined_stack,
    member_bootstrap,
    namespaces_or_exit,
    read_endpoints,
    settings_or_exit,
)
from streams.settings import check_host


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "api", help="serve the HTTP API (AddCount, AddAndGetCount, GetCount, ClearCount, batches)",
        description="Serve the counter API over HTTP (FastAPI). OpenAPI at /openapi.json, docs at /docs, "
                    "health at /healthz and /readyz, Prometheus metrics at /metrics.",
        epilog="example: counter api --port 8080\n"
               "  curl -s localhost:8080/v1/GetCount -d '{\"namespace\": \"my_dataset\", "
               "\"counter_name\": \"counter123\"}'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bootstrap", help="Kafka bootstrap (default COUNTER_KAFKA_BOOTSTRAP or counter up's)")
    p.add_argument("--host", help="listen address (default COUNTER_API_HOST, 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default COUNTER_API_PORT, 8080)")
    p.add_argument("--data-dir", type=Path, help="override COUNTER_DATA_DIR")
    add_no_compile(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_or_exit(data_dir=args.data_dir)
    endpoints = read_endpoints(settings)
    shared = joined_stack(settings, endpoints)  # beside a running `counter up`: its cache and namespaces
    if endpoints and settings.api_shared_pipeline is None:
        shared["api_shared_pipeline"] = "true"  # AddAndGetCount counts the other API's writes too
    if shared:
        settings = settings_or_exit(data_dir=args.data_dir, **shared)
    _, registry = namespaces_or_exit(settings)
    check_api_namespaces(settings, registry)
    if args.host is not None:
        try:
            check_host(args.host)
        except ValueError as exc:
            fail(f"--host: {exc}")
    host = settings.api_host if args.host is None else args.host
    port = settings.api_port if args.port is None else args.port
    if not 0 <= port <= 65535:
        fail(f"--port: {port} is outside 0..65535 (0: any free port)")
    check_listen(host, port, "COUNTER_API_HOST" if args.host is None else "--host",
                 "COUNTER_API_PORT" if args.port is None else "--port")
    env = dict(os.environ, COUNTER_KAFKA_BOOTSTRAP=member_bootstrap(settings, args.bootstrap, endpoints),
               **{f"COUNTER_{name.upper()}": value for name, value in shared.items()})
    if endpoints and not endpoints.get("api_shared_pipeline"):
        console.print("[yellow]warning:[/] the running `counter up`'s API does not share the pipeline: its "
                      "AddAndGetCount does not count this API's writes (start counter up with "
                      "COUNTER_API_SHARED_PIPELINE=true to have it count them)", soft_wrap=True, highlight=False)
    for name, value in (("COUNTER_API_HOST", args.host), ("COUNTER_API_PORT", args.port),
                        ("COUNTER_DATA_DIR", args.data_dir)):
        if value is not None:
            env[name] = str(value)
    build_native_parts(args)
    # The API is its own process image (query_api is never imported by the CLI).
    os.execve(sys.executable, [sys.executable, "-m", "query_api"], env)
    return 0  # pragma: no cover
