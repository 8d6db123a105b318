"""schemathesis against the live /openapi.json: bounded examples, no 5xx, responses conform to the schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.pipeline_harness import PipelineEnv

pytestmark = pytest.mark.integration

NAMESPACES = Path(__file__).resolve().parents[1] / "data" / "api_namespaces.yaml"


@pytest.fixture(scope="module")
def api_schema(kafka_bootstrap, memcached_address, tmp_path_factory):
    env = PipelineEnv(kafka_bootstrap, memcached_address, tmp_path_factory.mktemp("fuzz") / "data",
                      namespaces=NAMESPACES).prepare()
    env.start_worker()  # AddAndGetCount waits for its write to be persisted
    api = env.start_api()
    yield schemathesis.openapi.from_url(f"http://127.0.0.1:{api.port}/openapi.json")
    env.stop()


schema = schemathesis.pytest.from_fixture("api_schema")

# What the issue asks: no 5xx, and every response conforms to the schema (status, content type, body).
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case):
    case.call_and_validate(checks=CHECKS)
