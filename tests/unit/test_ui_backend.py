"""The UI's server side without a broker: the audit log's backward paging (real SQLite), namespace configuration
without keys, pipeline health rendering and rates, and the static files (served from memory, with CSP and ETag)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from control_plane import parse_namespaces
from query_api.audit_log import BadCursor, decode_cursor, encode_cursor, newest_events
from query_api.broker_offsets import TopicOffsets
from query_api.namespace_info import namespace_config
from query_api.pipeline_health import BrokerFigures, Rates, Snapshot, StoreFigures, render
from query_api.routes import ui
from schemas import MICROS
from schemas.dead_letter import DeadRecord
from sinks import Partitioning, SqliteEventStore
from sinks.model import PendingRollups
from streams.settings import Settings
from tests.helpers import Sync

NAMESPACES = """
namespaces:
  open:
    counter_type: EVENTUAL
    time_partition: { buckets_per_id: 4, seconds_per_bucket: 10, seconds_per_slice: 3600 }
  locked:
    counter_type: ACCURATE
    api_keys:
      - { key: "s3cret-reader", scopes: [read] }
      - { key: "s3cret-writer", scopes: [write] }
"""
NOW = 1_800_000_000 * MICROS


@pytest.fixture
def registry():
    return parse_namespaces(NAMESPACES)


@pytest.fixture
def events(tmp_path, registry):
    store = Sync(SqliteEventStore(tmp_path / "events.sqlite3",
                                  lambda ns: Partitioning.of(registry[ns].time_partition)))
    yield store
    store.close()


def _all_pages(events, ns, counter: str, limit: int) -> list[tuple]:
    rows, cursor, pages = [], None, 0
    while True:
        page, cursor = events._runner.run(newest_events(events._target, ns, counter, limit=limit, now_us=NOW,
                                                        before=cursor))
        rows += page
        pages += 1
        assert len(page) <= limit
        if cursor is None:
            return rows
        assert pages < 10_000
        assert decode_cursor(encode_cursor(page[-1])) == cursor


def test_audit_pages_back_through_every_event_exactly_once(events, registry):
    ns = registry["open"]
    rows = []
    # a crowd of 400 events sharing one microsecond (more than a probe reads), a burst within a second, events
    # spread over six days, one in the near future (clock skew), and another counter's events
    for i in range(400):
        rows.append(("open", "c", NOW - 5 * MICROS, f"crowd-{i:04d}", "", 1, False))
    for i in range(300):
        rows.append(("open", "c", NOW - 3 * MICROS + i * 1000, f"burst-{i}", "k" if i % 2 else "", 2, False))
    for i in range(200):
        rows.append(("open", "c", NOW - i * 2600 * MICROS, f"spread-{i}", "", -1, i % 50 == 0))
    rows.append(("open", "c", NOW + MICROS // 10, "future", "", 5, False))
    rows += [("open", "other", NOW - i, f"o-{i}", "", 1, False) for i in range(50)]
    events.write_events(rows)
    mine = sorted((r for r in rows if r[1] == "c"), key=lambda r: (r[2], r[3], r[4]), reverse=True)
    for limit in (1, 50, 200):
        got = _all_pages(events, ns, "c", limit)
        assert [(r[2], r[3], r[4]) for r in got] == [(r[2], r[3], r[4]) for r in mine], limit


def test_audit_of_a_counter_without_events_is_empty(events, registry):
    page, cursor = events._runner.run(newest_events(events._target, registry["open"], "nobody", limit=10, now_us=NOW))
    assert page == [] and cursor is None


def test_cursor_rejects_what_it_did_not_issue():
    import base64

    def cursor(t: object) -> str:
        return base64.urlsafe_b64encode(json.dumps([t, "a", ""]).encode()).decode().rstrip("=")

    # a time no event has: 10**30 reached SQLite and answered 500 (from a review); so did a cursor of 1,000
    # nested arrays, 1,332 characters (RecursionError in the json module: another review)
    nested = base64.urlsafe_b64encode(b"[" * 1000).decode()
    for text in ("", "nonsense", "WzEsMl0", "eyJhIjoxfQ", cursor(10**30), cursor(-1), nested):
        with pytest.raises(BadCursor):
            decode_cursor(text)


def test_namespace_config_never_holds_keys(registry):
    text = json.dumps({name: namespace_config(ns) for name, ns in registry.items()})
    assert "s3cret" not in text and "api_keys" not in text
    config = namespace_config(registry["open"])
    assert config["time_partition"]["seconds_per_slice"] == 3600 and "name" not in config
    assert config["windows"]["granularities"] == ["minute", "hour", "day"]


def test_rates_need_two_samples_and_ignore_totals_going_back():
    rates = Rates(window_s=60, min_gap_s=1)
    assert rates.observe(100.0, {"a": 10}) == ({"a": None}, None)
    assert rates.observe(100.5, {"a": 11}) == ({"a": None}, None)  # too soon after the first
    got, span = rates.observe(102.0, {"a": 30, "b": 1})
    assert got == {"a": 10.0, "b": None} and span == 2.0
    got, _ = rates.observe(104.0, {"a": 5})  # a recreated topic: no negative rate
    assert got == {"a": None}


def test_rates_come_back_as_soon_as_the_broker_does():
    """A review: samples taken while the broker was away hold none of its totals, and the rate against the oldest
    sample in the window stayed blank for the window's whole length after it came back."""
    rates = Rates(window_s=60, min_gap_s=1)
    for t in range(0, 90, 2):  # the broker away for 90 s: no totals
        rates.observe(float(t), {})
    rates.observe(90.0, {"a": 100})
    got, span = rates.observe(92.0, {"a": 140})
    assert got == {"a": 20.0} and span == 2.0


def _settings() -> Settings:
    return Settings(kafka_bootstrap="127.0.0.1:9092", mutations_topic="m", rollups_topic="r", dlq_topic="d")


def test_health_render_hides_dead_letters_of_namespaces_the_caller_cannot_read(registry):
    def letter(offset: int, key: bytes, value: dict) -> DeadRecord:
        return DeadRecord(0, offset, NOW - MICROS, key, json.dumps(value).encode(), {"dlq.reason": f"why {offset}"})

    offsets = TopicOffsets("m", {0: 0, 1: 0}, {0: 10, 1: 7}, {0: 10, 1: 5})
    queue = TopicOffsets("r", {0: 0}, {0: 40}, {0: None})
    dlq = TopicOffsets("d", {0: 0}, {0: 2}, {})
    dead = [letter(1, b"locked:c", {"namespace": "locked", "counter_name": "c", "delta": 1}),
            letter(0, b"gone:c", {"namespace": "gone", "counter_name": "c", "delta": 2})]
    snapshot = Snapshot(NOW, StoreFigures({0: NOW - 2 * MICROS}, NOW - MICROS,
                                          {"open": PendingRollups(3, NOW - 9 * MICROS)}),
                        BrokerFigures(offsets, queue, dlq, {0: 3}, dead), {"mutation_records": 4.0}, {}, 2.0, {})
    body = render(snapshot, registry, _settings(), lambda name: name != "locked")
    assert [w["lag_s"] for w in body["watermarks"]] == [2.0, None]  # partition 1 has no watermark yet
    assert body["persist_lag_records"] == 2 and body["rollup_queue"]["depth"] == 40
    assert body["rollup_lag_s"] == 9.0 and body["rollups"][0]["pending_counters"] == 3
    assert body["dlq"]["size"] == 3  # the end found by reading the tail, past the reported end offset
    hidden, shown = body["dlq"]["dead_letters"]
    assert hidden["key"] is None and "hidden" in hidden["record"] and "hidden" in hidden["reason"]  # it may quote
    assert shown["key"] == "gone:c" and shown["record"] == "gone:c +2 token=(no token)"

    # the key is the whole record's: one item of a record keyed by a protected counter shows without its key
    mixed = [letter(2, b"locked:secret", {"namespace": "gone", "counter_name": "c", "delta": 3})]
    snapshot = Snapshot(NOW, None, BrokerFigures(offsets, queue, dlq, {0: 3}, mixed), {}, {}, None, {})
    [letter_body] = render(snapshot, registry, _settings(), lambda name: name != "locked")["dlq"]["dead_letters"]
    assert letter_body["key"] is None and letter_body["record"] == "gone:c +3 token=(no token)"
    [letter_body] = render(snapshot, registry, _settings(), lambda name: True)["dlq"]["dead_letters"]
    assert letter_body["key"] == "locked:secret"


def test_a_watermark_covering_every_write_has_no_lag_though_it_stands_still(registry):
    """Idle workers stop their heartbeats once the watermark covers the latest write: that is not a lag. Without
    the broker's offsets, whether records wait is unknown: no figure (a review read 0 ms, green, while the broker
    was down), unless the store alone shows the watermark short of the latest write persisted."""
    caught_up = TopicOffsets("m", {0: 0, 1: 0}, {0: 10, 1: 7}, {0: 10, 1: 7})

    def lags(covering: int | None, mutations: TopicOffsets | None = caught_up) -> list[float | None]:
        store = StoreFigures({0: NOW - 600 * MICROS, 1: NOW - 700 * MICROS}, covering, {})
        empty = TopicOffsets("x", {}, {}, {})
        broker = None if mutations is None else BrokerFigures(mutations, empty, empty, {}, [])
        body = render(Snapshot(NOW, store, broker, {}, {}, None, {}), registry, _settings(), lambda name: True)
        return [w["lag_s"] for w in body["watermarks"]]

    assert lags(NOW - 650 * MICROS) == [0.0, 700.0]  # partition 1 is short of the latest write
    assert lags(NOW - 800 * MICROS) == [0.0, 0.0]
    assert lags(None) == [0.0, 0.0]  # nothing written yet: nothing to cover
    assert lags(NOW - 650 * MICROS, None) == [None, 700.0]  # the broker did not answer
    assert lags(None, None) == [None, None]


def test_records_waiting_after_an_idle_spell_lag_from_when_none_waited_not_from_the_watermark(registry):
    """A review: after 12 s idle, one write read a 16 s watermark lag until it was persisted (hours after a quiet
    night). The watermark stands still while nothing is written; a record waiting now came after the last snapshot
    that saw none waiting, so it has waited at most since then."""
    from query_api.pipeline_health import Cleared

    store = StoreFigures({0: NOW - 3600 * MICROS, 1: NOW - 3600 * MICROS}, NOW - 3601 * MICROS, {})
    empty = TopicOffsets("x", {}, {}, {})
    cleared = Cleared()

    def lags(at_us: int, mutations: TopicOffsets | None) -> list[float | None]:
        seen = cleared.observe(at_us, mutations)
        broker = None if mutations is None else BrokerFigures(mutations, empty, empty, {}, [])
        snapshot = Snapshot(at_us, store, broker, {}, {}, None, {}, None, {}, seen)
        return [w["lag_s"] for w in render(snapshot, registry, _settings(), lambda name: True)["watermarks"]]

    idle = TopicOffsets("m", {0: 0, 1: 0}, {0: 10, 1: 7}, {0: 10, 1: 7})
    written = TopicOffsets("m", {0: 0, 1: 0}, {0: 11, 1: 7}, {0: 10, 1: 7})
    assert lags(NOW - 2 * MICROS, idle) == [0.0, 0.0]
    assert lags(NOW, written) == [2.0, 0.0]  # not 3600: none waited 2 s ago
    assert lags(NOW + 5 * MICROS, None) == [None, None]  # the broker did not answer
    assert lags(NOW + 8 * MICROS, written) == [10.0, 0.0]  # still waiting: the clock ran on
    assert Cleared().observe(NOW, written) == {1: NOW}  # never seen clear: from the watermark, as before


def ui_get(path: str, **headers: str) -> httpx.Response:
    """GET from an app holding only the UI's router (no broker, no stores)."""
    app = FastAPI()
    app.include_router(ui.router)

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ui") as client:
            return await client.get(path, headers=headers)
    return asyncio.run(get())


def test_ui_files_are_served_with_csp_and_cached_by_version():
    r = ui_get("/ui/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src 'self' 'sha256-" in r.headers["content-security-policy"]
    assert r.headers["cache-control"] == "no-cache"  # the page is revalidated: never stale after an upgrade
    again = ui_get("/ui/", **{"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    app_js = ui.FILES["js/app.js"]
    versioned = ui_get(f"/ui/js/app.js?v={app_js.version}")
    assert versioned.headers["content-type"].startswith("text/javascript")
    assert versioned.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert ui_get("/ui/js/app.js?v=0ld").headers["cache-control"] == "no-cache"  # another version: revalidated
    assert ui_get("/ui/nope.js").status_code == 404
    assert ui_get("/ui").headers["location"] == "/ui/"


def test_the_page_loads_every_module_up_front_by_its_versioned_url():
    index = ui.FILES["index.html"].body.decode()
    referenced = dict(re.findall(r'(?:href|src)="([^":#?]+)\?v=([0-9a-f]+)"', index))
    assert referenced and all(ui.FILES[name].version == v for name, v in referenced.items())
    assert not re.findall(r'(?:href|src)="(?!data:|#)[^"?]+"', index)  # nothing loaded by an unversioned URL
    modules = {n for n in ui.FILES if n.endswith(".js") and n.startswith("js/")}
    loaded = set(re.findall(r'rel="modulepreload" href="([^"?]+)', index))
    loaded |= set(re.findall(r'<script type="module" src="([^"?]+)', index))
    assert loaded == modules  # every module requested at once: no import waterfall
    # the import map sends every module's imports to the versioned URLs, and the CSP allows it by its hash
    (import_map,) = re.findall(r'<script type="importmap">(.*?)</script>', index, re.S)
    imports = json.loads(import_map)["imports"]
    assert imports == {f"/ui/{n}": f"/ui/{n}?v={ui.FILES[n].version}" for n in modules}
    digest = base64.b64encode(hashlib.sha256(import_map.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in ui.HEADERS["Content-Security-Policy"]


def test_every_import_resolves_and_no_module_writes_markup():
    for name, file in ui.FILES.items():
        if name.endswith(".js") and name.startswith("js/"):
            for target in re.findall(r'from "(\.[^"]+)"', file.body.decode()):
                assert _norm(name, target) in ui.FILES, (name, target)
            assert not re.search(r"\.(inner|outer)HTML\s*=|insertAdjacentHTML", file.body.decode()), name  # dom.js
    assert "MIT" in ui.FILES["vendor/uplot/LICENSE"].body.decode()


def _norm(base: str, target: str) -> str:
    """`js/pages/counter.js` importing `../api.js` -> `js/api.js`."""
    parts = Path(base).parent.parts + Path(target).parts
    out: list[str] = []
    for p in parts:
        if p == "..":
            out.pop()
        elif p != ".":
            out.append(p)
    return "/".join(out)


def test_a_watermark_past_the_latest_write_persisted_still_lags_while_records_wait(registry):
    """A dead worker persists nothing more, so the latest write persisted stands still and its watermark covers
    it: records waiting on the broker must still show as lag, not 0 (from a review)."""
    store = StoreFigures({0: NOW - 3600 * MICROS, 1: NOW - 3600 * MICROS}, NOW - 3600 * MICROS - 1, {})
    offsets = TopicOffsets("m", {0: 0, 1: 0}, {0: 15_000, 1: 10_000}, {0: 10_000, 1: 10_000})
    empty = TopicOffsets("x", {}, {}, {})
    body = render(Snapshot(NOW, store, BrokerFigures(offsets, empty, empty, {}, []), {}, {}, None, {}), registry,
                  _settings(), lambda name: True)
    assert [w["lag_s"] for w in body["watermarks"]] == [3600.0, 0.0]  # partition 0 holds 5,000 unpersisted


class _Service:
    """What list_counters uses of the API's service: the events store and the namespaces."""

    def __init__(self, events, registry) -> None:
        self.events = events._target
        self.namespace = registry.__getitem__


def test_counter_pages_skip_a_counters_combinations_instead_of_coming_back_empty(events, registry):
    """A review: a counter with 130 dimension combinations filled the next store pages with nothing but them, and
    GET /v1/namespaces/{ns}/counters answered `counters: []` with a next_after, click after click in the UI."""
    from query_api.routes.inspect import list_counters

    names = ["a", *(f"b country=C{i:03d}" for i in range(130)), "b", "c", "d"]
    events.write_events([("open", n, NOW + i, f"e{i}", "", 1, False) for i, n in enumerate(names)])

    def page(after: str | None) -> tuple[list[str], str | None]:
        service = _Service(events, registry)
        got = events._runner.run(list_counters("open", service, None, after=after, limit=3))  # type: ignore[arg-type]
        return got.counters, got.next_after

    seen, after, calls = [], None, 0
    while True:
        counters, after = page(after)
        calls += 1
        assert counters or after is None, "an empty page that says there is more"
        seen += counters
        if after is None:
            break
    assert seen == ["a", "b", "c", "d"] and calls <= 3, (seen, calls)


def test_a_counter_page_is_full_unless_it_is_the_last(events, registry):
    """A review: `limit=10` over 4 counters, one with combinations, answered 3 counters and a next_after: a client
    taking a short page for the last one missed the fourth. Every page but the last now holds `limit` counters."""
    from query_api.routes.inspect import list_counters

    names = ["a", "b", *(f"b country=C{i}" for i in range(4)), "b2", "c", *(f"c device=D{i}" for i in range(9)), "d"]
    events.write_events([("open", n, NOW + i, f"e{i}", "", 1, False) for i, n in enumerate(names)])

    for limit in (1, 2, 3, 4, 5, 10):
        pages, after = [], None
        while True:
            service = _Service(events, registry)
            got = events._runner.run(list_counters("open", service, None, after=after,  # type: ignore[arg-type]
                                                   limit=limit))
            pages.append(got.counters)
            if (after := got.next_after) is None:
                break
        assert [n for p in pages for n in p] == ["a", "b", "b2", "c", "d"], (limit, pages)
        assert all(len(p) == limit for p in pages[:-1]), (limit, pages)
