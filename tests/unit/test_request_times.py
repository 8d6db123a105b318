"""Times in request bodies (query_api.models.TimeValue): JSON true/false is refused as a bool, naming the field. The
models' lax mode read it as the epoch number 1 and the 422 said "1970-01-01T00:00:01Z (read as epoch seconds)"."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from query_api.models import AddCountRequest, GetCountRequest, GetCountSeriesRequest

BASE = {"namespace": "my_dataset", "counter_name": "c"}


@pytest.mark.parametrize(("model", "body", "loc"), [
    (AddCountRequest, {"idempotency_token": {"token": "t", "generation_time": True}},
     ("idempotency_token", "generation_time")),
    (GetCountRequest, {"window": {"start": True}}, ("window", "start")),
    (GetCountRequest, {"window": {"start": "2026-11-27T00:00:00Z", "end": False}}, ("window", "end")),
    (GetCountSeriesRequest, {"granularity": "hour", "start": False}, ("start",)),
])
def test_a_bool_is_not_a_time(model: type[BaseModel], body: dict, loc: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError) as refused:
        model(**BASE, **body)
    assert [(e["loc"], e["msg"]) for e in refused.value.errors()] == [
        (loc, "Value error, must be an ISO-8601 string or an epoch number, got bool")]


@pytest.mark.parametrize("time", ["2026-11-27T10:00:00Z", 1_795_780_000, 1_795_780_000.5, "1795780000"])
def test_times_keep_their_type(time: object) -> None:
    assert GetCountSeriesRequest(**BASE, granularity="hour", start=time).start == time
    token = AddCountRequest(**BASE, idempotency_token={"token": "t", "generation_time": time}).idempotency_token
    assert token is not None and token.generation_time == time
