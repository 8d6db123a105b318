"""Typed request and response bodies: the Netflix post's shapes, validated with the wire format's rules."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, field_validator
from pydantic.config import JsonDict

from query_api.topk import MAX_K
from schemas import (
    INT64_MAX,
    INT64_MIN,
    MAX_COUNTER_NAME_BYTES,
    MAX_ITEM_KEY_BYTES,
    MAX_NAMESPACE_LEN,
    MAX_TOKEN_BYTES,
    parse_generation_time,
    validate_counter_name,
    validate_item_key,
    validate_namespace,
    validate_token,
)

MAX_BATCH = 1000

# The bounds the validators below enforce, declared in the OpenAPI document only (`json_schema_extra`): as pydantic
# constraints they would be checked first, with other messages. Lengths are in UTF-8 bytes, which JSON Schema cannot
# say: maxLength (characters) is the bound for ASCII text, and the descriptions say bytes.
NAMESPACE_SCHEMA: JsonDict = {"pattern": "^[A-Za-z0-9_.-]+$", "minLength": 1, "maxLength": MAX_NAMESPACE_LEN}
COUNTER_NAME_SCHEMA: JsonDict = {"minLength": 1, "maxLength": MAX_COUNTER_NAME_BYTES}
COUNTER_NAME_RULE = f"1 to {MAX_COUNTER_NAME_BYTES} UTF-8 bytes, no whitespace or control characters"


def _check(validator: Any, value: Any) -> Any:
    """Run a schemas validator, re-raised as ValueError so pydantic reports it against the field."""
    try:
        return validator(value)
    except ValueError as exc:
        raise ValueError(getattr(exc, "reason", str(exc))) from None


def _not_bool(value: Any) -> Any:
    """JSON true/false is not a time: pydantic's lax mode reads it as the epoch number 1 or 0, and the 422 then said
    "1970-01-01T00:00:01Z (read as epoch seconds)" (a review)."""
    if isinstance(value, bool):
        raise ValueError("must be an ISO-8601 string or an epoch number, got bool")
    return value


TimeValue = Annotated[str | int | float, BeforeValidator(_not_bool)]
"""A time as requests give it: RFC 3339 / ISO-8601 text or an epoch number (s, ms or µs by magnitude)."""


def _duration_input(value: object) -> object:
    """A duration is seconds as a JSON number, or a string: one error naming the field for anything else (a
    boolean is no "1 second"), where a union's would name each of its members."""
    if value is None or type(value) in (str, int, float):
        return value
    raise ValueError(f'must be seconds as a number, or a string such as "1h" (got {type(value).__name__})')


DurationValue = Annotated[int | float | str, BeforeValidator(_duration_input)]
"""A duration as requests give it: seconds as a number, or text ("1h", "90s", "PT5M"; control_plane.durations)."""


class IdempotencyToken(BaseModel):
    """Makes a write safe to retry or hedge: the same token and generation_time are counted once."""

    model_config = ConfigDict(extra="forbid")
    token: str = Field(..., examples=["some_event_id"],
                       description=f"1 to {MAX_TOKEN_BYTES} UTF-8 bytes, no control characters",
                       json_schema_extra={"minLength": 1, "maxLength": MAX_TOKEN_BYTES})
    generation_time: TimeValue | None = Field(
        None, description="ISO-8601 or epoch (s/ms/µs): the event's time, within the namespace's accept_limit of "
                          "when the write reaches Kafka. Required with a token in a durable namespace (an event is "
                          "its token and generation_time: only a retry with both is counted once); BEST_EFFORT "
                          "ignores tokens")

    @field_validator("token")
    @classmethod
    def _token(cls, v: str) -> str:
        return _check(validate_token, v)

    @field_validator("generation_time")
    @classmethod
    def _time(cls, v: str | int | float | None) -> str | int | float | None:
        if v is not None:
            _check(parse_generation_time, v)
        return v


class CounterRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    namespace: str = Field(..., examples=["my_dataset"], json_schema_extra=NAMESPACE_SCHEMA)
    counter_name: str = Field(..., examples=["counter123"], description=COUNTER_NAME_RULE,
                              json_schema_extra=COUNTER_NAME_SCHEMA)

    @field_validator("namespace")
    @classmethod
    def _ns(cls, v: str) -> str:
        return _check(validate_namespace, v)

    @field_validator("counter_name")
    @classmethod
    def _counter(cls, v: str) -> str:
        return _check(validate_counter_name, v)


Delta = Annotated[StrictInt, Field(ge=INT64_MIN, le=INT64_MAX, examples=[2])]


DimensionMap = dict[str, str]


class AddCountRequest(CounterRef):
    delta: Delta | None = Field(None, description="required, except in a UNIQUE namespace: there 1 or absent (a "
                                                  "write counts its item once)")
    idempotency_token: IdempotencyToken | None = None
    event_item_key: str = Field("", description=f"at most {MAX_ITEM_KEY_BYTES} UTF-8 bytes, no control characters",
                                json_schema_extra={"maxLength": MAX_ITEM_KEY_BYTES})
    dimensions: DimensionMap | None = Field(
        None, examples=[{"country": "US", "device": "tv"}],
        description="keys the namespace declares (dimensions.keys); the write is counted in the counter and in "
                    "every combination of these dimensions")
    item: str | None = Field(None, description="what a UNIQUE namespace counts (e.g. a user id): required there, "
                                               "refused elsewhere")

    @field_validator("event_item_key")
    @classmethod
    def _item(cls, v: str) -> str:
        return _check(validate_item_key, v)


class WindowSpec(BaseModel):
    """A time window: `last` (a duration ending now: "1h", "15m", "7d") or `start` and `end` (RFC 3339 or epoch;
    `end` defaults to now). Edges are aligned outwards to the buckets that cover them; the answer says which."""

    model_config = ConfigDict(extra="forbid")
    last: DurationValue | None = Field(
        None, examples=["1h"], description="a duration ending now: seconds as a number (3600), or a string (\"1h\")")
    start: TimeValue | None = Field(None, examples=["2026-11-23T10:00:00Z"])
    end: TimeValue | None = Field(None, examples=["2026-11-23T11:00:00Z"])

    def as_spec(self) -> dict[str, object]:
        return self.model_dump(exclude_none=True)


class GetCountRequest(CounterRef):
    window: WindowSpec | None = Field(None, description="count only this time window (EVENTUAL/ACCURATE)")
    dimensions: DimensionMap | None = Field(
        None, examples=[{"country": "US"}],
        description="count only the writes with these dimensions (any subset of the namespace's keys)")
    group_by: str | None = Field(None, examples=["device"],
                                 description="a declared dimension key (not in `dimensions`): one count per value")


class GetTopKRequest(BaseModel):
    """The k counters with the highest counts in a window, among the counters with `dimensions` (none: all the
    namespace's counters; `{"country": "BR"}`: their Brazilian writes)."""

    model_config = ConfigDict(extra="forbid")
    namespace: str = Field(..., examples=["plays"])
    k: Annotated[StrictInt, Field(ge=1, le=MAX_K)] = Field(10, description=f"how many counters, 1..{MAX_K}")
    window: WindowSpec = Field(..., description="the window counted (required): `last` or `start`/`end`")
    dimensions: DimensionMap | None = Field(
        None, examples=[{"country": "BR"}],
        description="rank the counts of the writes with these dimensions (any subset of the namespace's keys)")

    @field_validator("namespace")
    @classmethod
    def _ns(cls, v: str) -> str:
        return _check(validate_namespace, v)


class GetCountSeriesRequest(CounterRef):
    granularity: str = Field(..., examples=["hour"], description="minute, hour or day (as the namespace keeps)")
    start: TimeValue = Field(..., examples=["2026-11-22T00:00:00Z"])
    end: TimeValue | None = Field(None, examples=["2026-11-23T00:00:00Z"], description="default: now")


class ClearCountRequest(CounterRef):
    idempotency_token: IdempotencyToken | None = None
    dimensions: DimensionMap | None = Field(None, description="refused when given: a clear applies to the counter "
                                                              "and every combination of its dimensions")


class BatchAddCountRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests: list[AddCountRequest] = Field(..., min_length=1, max_length=MAX_BATCH)


class BatchGetCountRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests: list[GetCountRequest] = Field(..., min_length=1, max_length=MAX_BATCH)


class AddCountResponse(BaseModel):
    namespace: str
    counter_name: str
    counter_type: str
    durable: bool = Field(..., description="true once the broker acknowledged the write (rolled-up types)")
    idempotency_token: str | None = Field(None, description="the token the write was recorded with")


class CountResponse(BaseModel):
    namespace: str
    counter_name: str
    count: int
    counter_type: str
    as_of: datetime | None = Field(None, description="rollup timestamp the count is exact up to (rolled-up types)")


class Window(BaseModel):
    start: datetime = Field(..., description="start of the window actually counted (aligned to its buckets)")
    end: datetime = Field(..., description="end (exclusive) of the window actually counted")


class WindowCountResponse(CountResponse):
    window: Window


class DimensionCountResponse(CountResponse):
    """GetCount with a `dimensions` filter: the count of the writes carrying those dimensions."""

    dimensions: DimensionMap


class DimensionWindowCountResponse(WindowCountResponse):
    dimensions: DimensionMap


class Group(BaseModel):
    value: str = Field(..., description="the group_by dimension's value")
    count: int


class GroupedCountResponse(BaseModel):
    """GetCount with `group_by`: one count per value of that dimension among the writes matching `dimensions`
    (a value never written with them is absent; one whose writes were all cleared reads 0), and `count`, the
    filter's total (writes without the group_by dimension count there but in no group)."""

    namespace: str
    counter_name: str
    counter_type: str
    dimensions: DimensionMap
    group_by: str
    groups: list[Group] = Field(..., description="ordered by value")
    count: int = Field(..., description="the count of the writes matching `dimensions` (all writes without it)")
    as_of: datetime | None = Field(None, description="every count is exact up to this time")
    window: Window | None = Field(None, description="the window actually counted, when one was asked for")


class Bucket(BaseModel):
    start: datetime
    count: int


class SeriesResponse(BaseModel):
    namespace: str
    counter_name: str
    counter_type: str
    granularity: str
    start: datetime
    end: datetime
    buckets: list[Bucket] = Field(..., description="every bucket of [start, end), in order, zero-filled")
    as_of: datetime | None = Field(None, description="the buckets are exact up to this time")


class TopKItem(BaseModel):
    counter_name: str
    count: int


class TopKResponse(BaseModel):
    """GetTopK: the counters with the highest positive counts in `window`, count descending, ties by name. Exact for
    the rolled-up counts (an ACCURATE namespace's live events after its last rollup are not included)."""

    namespace: str
    counter_type: str
    k: int
    dimensions: DimensionMap = Field(..., description="the filter ranked ({} for all counters)")
    window: Window
    items: list[TopKItem] = Field(..., description="at most k, count descending, ties by name; counters whose count "
                                                   "in the window is 0 or less are not ranked")
    as_of: datetime | None = Field(None, description="every count in items is exact up to this time (the oldest "
                                                     "rollup among them)")
    rows_read: int = Field(..., description="rank-list entries and buckets read to answer (not the namespace's "
                                            "counters: what the answer cost)")
    candidates: int = Field(..., description="counters whose exact count was read")


class BatchAddCountResponse(BaseModel):
    results: list[AddCountResponse]


class BatchGetCountResponse(BaseModel):
    """One answer per entry, in order, each what GetCount answers for it (with its `window` and `dimensions`)."""

    results: list[CountResponse | WindowCountResponse | DimensionCountResponse | DimensionWindowCountResponse
                  | UniqueCountResponse | UniqueWindowCountResponse | UniqueDimensionCountResponse
                  | UniqueDimensionWindowCountResponse]


class ErrorResponse(BaseModel):
    detail: str


class RetryToken(BaseModel):
    token: str
    generation_time: int = Field(..., description="epoch µs, as generation_time accepts it")


class WriteErrorResponse(ErrorResponse):
    """A durable write that failed (503) or whose outcome is not known in time (504): what a retry must send to be
    counted once, which the client never saw when the API drew them."""

    idempotency_token: RetryToken | None = Field(None, description="the write's token and time")
    idempotency_tokens: list[RetryToken | None] | None = Field(
        None, description="a batch's: each entry's, in order (null for a BEST_EFFORT entry)")


# -- unique counts (aggregation UNIQUE): estimates from HLL sketches, with bounds --------------------------------


class UniqueEstimate(BaseModel):
    """A distinct count from HLL sketches (a UNIQUE namespace): `count` is the estimate rounded."""

    estimate: float = Field(..., description="the estimated number of distinct items")
    lower_bound: float = Field(..., description="lower bound of the estimate at 95% (2 standard deviations)")
    upper_bound: float = Field(..., description="upper bound of the estimate at 95% (2 standard deviations)")


class UniqueCountResponse(UniqueEstimate, CountResponse):
    """GetCount in a UNIQUE namespace: the counter's distinct items since its latest clear."""


class UniqueWindowCountResponse(UniqueEstimate, WindowCountResponse):
    """GetCount with a window in a UNIQUE namespace: the window's distinct items."""


class UniqueDimensionCountResponse(UniqueEstimate, DimensionCountResponse):
    """GetCount with a dimensions filter in a UNIQUE namespace: the distinct items of the writes carrying them."""


class UniqueDimensionWindowCountResponse(UniqueEstimate, DimensionWindowCountResponse):
    pass


class UniqueGroup(UniqueEstimate, Group):
    pass


class UniqueGroupedCountResponse(UniqueEstimate, GroupedCountResponse):
    """GetCount with group_by in a UNIQUE namespace: one estimate per value, and the filter's own (an item written
    with several values is in several groups, so the groups need not add up to it)."""

    # a list of the subclass: pydantic validates it as such, mypy sees lists as invariant
    groups: list[UniqueGroup] = Field(..., description="ordered by value")  # type: ignore[assignment]
