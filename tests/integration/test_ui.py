"""The web UI in a real browser: Debian's Chromium driven by Playwright, against the real stack (broker, worker,
memcached, SQLite, `python -m query_api`).

Counts are written through the API and through the Kafka topic (a plain confluent-kafka producer sending JSON
AddCount bodies), a bad record makes a dead letter, and the pages must show them: the namespaces, a counter's count
and as_of, the chart's points (the series the API returned, and a seeded 30-day hourly series point for point), the
audit entries, the dead letter's reason, a 401 page for a wrong key, and no console error anywhere. The counter
page's load time with the 30-day hourly series is measured (Performance API mark, printed; bench/RESULTS.md).

Chromium: `make test` installs Debian's `chromium` when it is missing. Without it this module fails, naming the
fix; COUNTER_TEST_NO_BROWSER=1 opts out (the tests are then skipped). COUNTER_UI_SCREENSHOTS=<dir> saves the
README's screenshots there.

The panels of issue 15 (Top-K, breakdown by dimension, unique counts) are checked against the API's answers; a
namespace whose API refuses a panel (Top-K on a UNIQUE namespace) must say "not available for this namespace".
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import wait_for
from tests.pipeline_harness import PipelineEnv

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("COUNTER_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
API_NAMESPACES = Path(__file__).resolve().parents[1] / "data" / "api_namespaces.yaml"
HOUR_US = 3600 * 1_000_000
DAYS = 30
LOADS = 5  # counter page loads measured
READ_ONLY = {"/v1/GetCount", "/v1/GetCountSeries", "/v1/BatchGetCount", "/v1/GetTopK"}  # the only POSTs it may make


def _browser_available() -> None:
    """Fail (not skip) without a browser, unless COUNTER_TEST_NO_BROWSER=1 opts out."""
    if os.environ.get("COUNTER_TEST_NO_BROWSER") == "1":
        pytest.skip("COUNTER_TEST_NO_BROWSER=1: the browser tests of the UI are opted out")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium is not installed at {CHROMIUM}: `make test` installs it (apt-get install -y chromium), "
                    "or point COUNTER_TEST_CHROMIUM at one; COUNTER_TEST_NO_BROWSER=1 skips these tests", pytrace=False)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("playwright is not installed: `make test` installs the test extra (pip install -e '.[test]')",
                    pytrace=False)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _t(text: str | None) -> datetime:
    assert text, "no as_of"
    return datetime.fromisoformat(text)


def _namespaces_file(directory: Path) -> Path:
    """The API tests' namespaces, plus those issue 15's panels need once the control plane has them: `plays`
    (dimensions country and device) and `visitors` (unique counts)."""
    import control_plane

    text = API_NAMESPACES.read_text()
    if hasattr(control_plane, "DimensionConfig"):
        text += "\n  plays:\n    counter_type: EVENTUAL\n    dimensions: { keys: [country, device] }\n"
    if hasattr(control_plane, "Aggregation"):
        text += "\n  visitors:\n    counter_type: EVENTUAL\n    aggregation: UNIQUE\n"
    path = directory / "ui_namespaces.yaml"
    path.write_text(text)
    return path


def _seed_hours(data_dir: Path, counter: str, now_us: int) -> dict[int, int]:
    """A 30-day hourly series for `counter` in my_dataset, written into the bucket store (as `counter bench
    windows` does), with a rollup so reads have an as_of. Returns {hour start µs: value}."""
    import asyncio

    from sinks import BUCKETS_FILE, ROLLUPS_FILE, SqliteRollupStore
    from sinks.sqlite.buckets import SqliteBucketStore
    from sinks.windows import Granularity

    current = now_us - now_us % HOUR_US
    starts = [current - (i + 1) * HOUR_US for i in range(DAYS * 24)]
    # a daily wave (peak at 18:00 UTC) on a slow upward trend: every hour a known, different value
    hours = {s: round(120 + 90 * math.sin(2 * math.pi * ((s // HOUR_US) % 24 - 12) / 24) + (s - starts[-1]) / 3.6e9 / 8)
             for s in starts}

    async def run() -> None:
        buckets = SqliteBucketStore(data_dir / BUCKETS_FILE)
        rollups = SqliteRollupStore(data_dir / ROLLUPS_FILE)
        try:
            await buckets.write_buckets("my_dataset", [(counter, Granularity.HOUR, s, v, now_us)
                                                       for s, v in hours.items()])
            await rollups.bump_last_write([("my_dataset", counter, now_us)])
            await rollups.write_rollups("my_dataset", [(counter, sum(hours.values()), now_us)])
        finally:
            await buckets.close()
            await rollups.close()
    asyncio.run(run())
    return hours


class World:
    """The stack and what was written to it."""

    def __init__(self, env: PipelineEnv, client: httpx.Client) -> None:
        self.env = env
        self.client = client
        self.namespaces = {n["name"] for n in client.get("/v1/namespaces").json()["namespaces"]}
        self.api = str(client.base_url).rstrip("/")
        tag = uuid.uuid4().hex[:8]
        self.counter = f"ui-{tag}"
        self.perf_counter = f"perf-{tag}"
        self.bad_namespace = f"no_such_ns_{tag}"
        self.top = {f"top-{tag}-{i}": n for i, n in enumerate((50, 30, 70, 10))}
        self.expected: dict[str, int] = {}
        self.seeded: dict[int, int] = {}

    def post(self, path: str, body: dict, **headers: str) -> httpx.Response:
        return self.client.post(path, json=body, headers=headers)

    def count(self, counter: str, namespace: str = "my_dataset", **headers: str) -> dict:
        r = self.post("/v1/GetCount", {"namespace": namespace, "counter_name": counter}, **headers)
        assert r.status_code == 200, r.text
        return r.json()


def _produce_json(bootstrap: str, topic: str, bodies: list[tuple[bytes, dict]]) -> None:
    """What any Kafka client may do: JSON AddCount bodies straight to the mutations topic."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for key, body in bodies:
        producer.produce(topic, key=key, value=json.dumps(body).encode())
    assert producer.flush(30) == 0


@pytest.fixture(scope="module")
def world(kafka_bootstrap: str, memcached_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    _browser_available()
    root = tmp_path_factory.mktemp("ui")
    env = PipelineEnv(kafka_bootstrap, memcached_address, root / "data", namespaces=_namespaces_file(root)).prepare()
    env.start_worker()
    api = env.start_api()
    with httpx.Client(base_url=f"http://127.0.0.1:{api.port}", timeout=30) as client:
        w = World(env, client)
        # First the seeded history: its rollup is stamped now (ahead of what a worker's rollup would be), and admission
        # refuses times at or before a namespace's newest rollup (sinks.rolled): every write below comes after it.
        w.seeded = _seed_hours(env.data_dir, w.perf_counter, time.time_ns() // 1000)
        # Through the API: three adds (one retried: counted once) ...
        adds = [{"namespace": "my_dataset", "counter_name": w.counter, "delta": d,
                 "idempotency_token": {"token": uuid.uuid4().hex, "generation_time": now_iso()}} for d in (2, 5, -1)]
        for body in [*adds, adds[0]]:
            assert w.post("/v1/AddCount", body).status_code == 200
        # ... and through the Kafka topic: JSON AddCount bodies from a plain producer, plus the Top-K candidates.
        direct = [(f"my_dataset:{w.counter}".encode(),
                   {"namespace": "my_dataset", "counter_name": w.counter, "delta": 10,
                    "idempotency_token": {"token": uuid.uuid4().hex, "generation_time": now_iso()}})]
        direct += [(f"my_dataset:{c}".encode(), {"namespace": "my_dataset", "counter_name": c, "delta": n})
                   for c, n in w.top.items()]
        # A record for a namespace nobody configured: dead-lettered with its reason.
        bad = {"namespace": w.bad_namespace, "counter_name": "c", "delta": 1}
        direct.append((f"{w.bad_namespace}:c".encode(), bad))
        _produce_json(kafka_bootstrap, env.mutations_topic, direct)
        # The keyed namespace: written with the write key, read with the read key.
        r = w.post("/v1/AddCount", {"namespace": "secured", "counter_name": w.counter, "delta": 4},
                   **{"X-API-Key": "writer-key"})
        assert r.status_code == 200, r.text
        for delta in (3, 1, 2):  # events on top of the seeded history: its audit panel has entries too
            assert w.post("/v1/AddCount", {"namespace": "my_dataset", "counter_name": w.perf_counter,
                                           "delta": delta}).status_code == 200
        w.expected = {w.counter: 16, **w.top, w.perf_counter: sum(w.seeded.values()) + 6}
        wait_for(lambda: env.converged("my_dataset", w.expected), 60, interval=0.2,
                 message=lambda: f"my_dataset converged: {env.mismatches('my_dataset', w.expected)}")
        wait_for(lambda: w.count(w.counter, "secured", **{"X-API-Key": "reader-key"})["count"] == 4, 30,
                 message="secured counter read")
        wait_for(lambda: any(d["reason"] == f"unknown namespace {w.bad_namespace!r}"
                             for d in (w.client.get("/v1/pipeline").json()["dlq"] or {}).get("dead_letters", [])),
                 30, interval=0.5, message="the dead letter in GET /v1/pipeline")
        assert w.client.get("/v1/pipeline").json()["warnings"] == []  # served (the model once dropped it)
        yield w
    env.stop()


class Browser:
    """One Chromium (fresh profile) for the module; pages record console errors, failed requests and writes."""

    def __init__(self, context: Any, api: str) -> None:
        self.context = context
        self.api = api
        self.errors: list[str] = []
        self.requests: list[tuple[str, str]] = []

    def page(self) -> Any:
        page = self.context.new_page()
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.method} {r.url} {r.failure}"))
        page.on("request", lambda r: self.requests.append((r.method, r.url)))
        page.on("response", lambda r: self.errors.append(f"HTTP {r.status}: {r.request.method} {r.url}")
                if r.status >= 400 else None)
        return page

    def open(self, page: Any, route: str, state: str = "ready") -> Any:
        page.goto(f"{self.api}/ui/{route}")
        page.wait_for_selector(f".page[data-state={state}]", timeout=15_000)
        return page


@pytest.fixture(scope="module")
def browser(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1280, "height": 900})
        b = Browser(context, world.api)
        try:
            yield b
        finally:
            context.close()
    writes = [(m, u) for m, u in b.requests if m not in ("GET", "HEAD") and not any(u.endswith(p) for p in READ_ONLY)]
    assert not writes, f"the UI must not write: {writes}"


@pytest.fixture
def page(browser: Browser) -> Iterator[Any]:
    """A fresh tab (fresh sessionStorage); the test fails on any console error, page error or failed request."""
    before = len(browser.errors)
    p = browser.page()
    yield p
    p.close()
    assert browser.errors[before:] == [], "console errors / failed requests in the UI"


def _screenshot(page: Any, name: str) -> None:
    directory = os.environ.get("COUNTER_UI_SCREENSHOTS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(directory) / name), full_page=True)


def test_namespaces_page(world: World, browser: Browser, page: Any) -> None:
    browser.open(page, "#/")
    rows = page.locator("#namespaces tbody tr")
    names = rows.evaluate_all("rows => rows.map(r => r.dataset.namespace)")
    assert {"my_dataset", "my_dataset_accurate", "my_dataset_best_effort", "secured"} <= set(names)
    my = page.locator("#namespaces tr[data-namespace=my_dataset]")
    assert "EVENTUAL" in my.inner_text() and "minute" in my.inner_text()  # type and configuration
    assert "key required" in page.locator("#namespaces tr[data-namespace=secured]").inner_text()
    assert "BEST_EFFORT" in page.locator("#namespaces tr[data-namespace=my_dataset_best_effort]").inner_text()


def test_counter_page_shows_count_as_of_chart_and_audit(world: World, browser: Browser, page: Any) -> None:
    before = world.count(world.counter)
    responses: list[Any] = []  # read after the page settles: no calls back into the browser from an event handler
    page.on("response", lambda r: responses.append(r) if r.url.endswith("/v1/GetCountSeries") else None)
    browser.open(page, f"#/ns/my_dataset/c/{world.counter}")
    after = world.count(world.counter)
    assert page.locator("#count").inner_text() == "16"
    shown = page.locator("#as-of").get_attribute("data-value")
    assert _t(before["as_of"]) <= _t(shown) <= _t(after["as_of"]), (before["as_of"], shown, after["as_of"])
    # The chart's points are the series the API returned, and that series holds the writes.
    series = [r.json() for r in responses]
    assert len(series) == 1
    xs, ys = page.evaluate("() => document.querySelector('#series-chart').uplot.data")
    assert ys == [b["count"] for b in series[0]["buckets"]]
    assert xs == [datetime.fromisoformat(b["start"]).timestamp() for b in series[0]["buckets"]]
    assert sum(ys) == 16 and series[0]["granularity"] == "hour"
    # The audit log: the four distinct events (the retry counted once), newest first.
    deltas = page.locator("#audit-table tbody td.delta").all_inner_texts()
    assert sorted(deltas) == sorted(["+2", "+5", "-1", "+10"]), deltas
    assert "audit" in page.locator("#audit").inner_text().lower()


def test_counter_page_30_day_hourly_series_and_load_time(world: World, browser: Browser, page: Any,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    route = f"#/ns/my_dataset/c/{world.perf_counter}?g=hour&r=30d"
    browser.open(page, route)
    xs, ys = page.evaluate("() => document.querySelector('#series-chart').uplot.data")
    plotted = {int(x * 1_000_000): y for x, y in zip(xs, ys, strict=True)}
    assert len(xs) in (720, 721)  # the 30 days, aligned outwards to the hour
    for start, value in world.seeded.items():
        if start in plotted:  # the oldest seeded hour may fall before the window's start
            assert plotted[start] == value, start
    assert sum(plotted.get(s, 0) for s in world.seeded) >= sum(world.seeded.values()) - max(world.seeded.values())
    assert page.locator("#count").inner_text() == f"{sum(world.seeded.values()) + 6:,}"
    assert page.locator("#audit-table tbody tr").count() == 3
    _screenshot(page, "ui.png")
    # Load time: navigation start to the page's `counter-page-ready` mark (count, chart and audit drawn), with
    # Chromium's cache emptied before each load (cold: every file fetched) and kept (warm: revalidated by ETag).
    cdp = browser.context.new_cdp_session(page)
    times: dict[str, list[float]] = {"cold": [], "warm": []}
    for _ in range(LOADS):
        for cache in ("cold", "warm"):
            page.goto("about:blank")
            if cache == "cold":
                cdp.send("Network.clearBrowserCache")
            browser.open(page, route)
            times[cache].append(page.evaluate("() => performance.getEntriesByName('counter-page-ready')[0].startTime"))
    with capsys.disabled():
        for cache, ms in times.items():
            print(f"\ncounter page with a 30-day hourly series ({len(xs)} points), {cache} cache: ready after "
                  f"{statistics.median(ms):.0f} ms, median of {LOADS} loads (min {min(ms):.0f}, max {max(ms):.0f} ms)")


def test_health_page_shows_the_dead_letter_and_pipeline_figures(world: World, browser: Browser, page: Any) -> None:
    browser.open(page, "#/health")
    reason = f"unknown namespace '{world.bad_namespace}'"
    page.wait_for_function("reason => [...document.querySelectorAll('#dead-letter-table td.reason')]"
                           ".some(td => td.textContent === reason)", arg=reason, timeout=15_000)
    row = page.locator("#dead-letter-table tr", has_text=reason)
    assert f"{world.bad_namespace}:c +1" in row.inner_text()
    partitions = page.locator("#watermarks tbody tr").count()
    assert partitions == world.env.partitions
    assert page.locator("#rollups tbody tr", has_text="my_dataset").count() >= 1
    for tile in ("#tile-watermark", "#tile-rollup-lag", "#tile-queue", "#tile-dlq", "#tile-ingest", "#tile-requests"):
        assert page.locator(tile).is_visible(), tile
    _screenshot(page, "ui-health.png")


def test_health_page_says_so_when_the_api_does_not_answer(world: World, browser: Browser, page: Any) -> None:
    """A review: with the API hung (SIGSTOP) the page kept its figures and "updated ..." with no word, for as long
    as the request stayed open. Here its refreshes are held unanswered: the page says the refresh failed."""
    browser.open(page, "#/health")
    held: list[Any] = []
    page.route("**/v1/pipeline", lambda route: held.append(route))  # never answered
    before = len(browser.errors)
    page.wait_for_function("() => document.querySelector('#health-updated').textContent"
                           ".includes('refresh failed: no answer from the API within 10 s')", timeout=30_000)
    page.unroute("**/v1/pipeline")
    failed = browser.errors[before:]
    assert held and all("request failed" in e and "/v1/pipeline" in e for e in failed), failed
    del browser.errors[before:]  # the held requests, given up by the page: what this test expects


def test_a_wrong_key_sees_the_401_page_and_a_read_key_the_counter(world: World, browser: Browser, page: Any) -> None:
    browser.open(page, "#/")
    page.fill("#key-input", "not-a-key")
    page.click("#key-form button[type=submit]")
    page.wait_for_selector(".page[data-state=ready]")
    page.goto(f"{world.api}/ui/#/ns/secured/c/{world.counter}")
    page.wait_for_selector("#auth-required[data-status='401']", timeout=15_000)
    assert "API key required" in page.locator("#auth-required").inner_text()
    assert page.locator("#count").count() == 0  # nothing of the counter is shown
    # The 401 page's own field: a read key shows the counter.
    page.fill("#auth-key", "reader-key")
    page.click("#auth-required button[type=submit]")
    page.wait_for_selector(".page[data-state=ready]", timeout=15_000)
    assert page.locator("#count").inner_text() == "4"
    # A write-only key may not read: the page says so (403: the key lacks the read scope).
    page.fill("#key-input", "writer-key")
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#auth-required[data-status='403']", timeout=15_000)


class Issue15:
    """What the API serves of issue 15 (read from /openapi.json)."""

    def __init__(self, world: World) -> None:
        self.doc = world.client.get("/openapi.json").json()

    def fields(self, path: str, part: str) -> set[str]:
        """Property names of a POST endpoint's request body ("request") or 200 answer ("response")."""
        op = self.doc["paths"].get(path, {}).get("post") or {}
        holder = op.get("requestBody", {}) if part == "request" else op.get("responses", {}).get("200", {})
        stack = [holder.get("content", {}).get("application/json", {}).get("schema") or {}]
        names: set[str] = set()
        while stack:
            schema = stack.pop()
            if "$ref" in schema:
                stack.append(self.doc["components"]["schemas"][schema["$ref"].split("/")[-1]])
                continue
            names |= set(schema.get("properties", {}))
            stack += schema.get("anyOf", []) + schema.get("allOf", []) + schema.get("oneOf", [])
        return names

    @staticmethod
    def require(available: bool, what: str) -> None:
        """Issue 15 has landed: a panel's endpoint or field missing from the API is a failure, not a skip."""
        assert available, f"the API no longer serves {what}"


def _panel_unavailable(page: Any, feature: str) -> None:
    locator = page.locator(f".unavailable[data-feature={feature}]")
    locator.wait_for(timeout=15_000)
    assert "not available for this namespace" in locator.inner_text()


def test_top_k_panel(world: World, browser: Browser, page: Any) -> None:
    """Top-K of my_dataset over the last 24 hours: our four counters in the order of their counts."""
    api = Issue15(world)
    browser.open(page, "#/ns/my_dataset")
    api.require("/v1/GetTopK" in api.doc["paths"], "Top-K (no /v1/GetTopK)")
    expected = [c for c, _ in sorted(world.top.items(), key=lambda kv: -kv[1])]

    def shown() -> list[str]:
        names = page.locator("#topk-table tbody tr td:nth-child(2)").all_inner_texts()
        return [c for c in names if c in world.top]
    wait_for(lambda: shown() == expected, 15, interval=0.5, message=lambda: f"Top-K order {shown()} == {expected}")


def test_breakdown_panel(world: World, browser: Browser, page: Any) -> None:
    """A counter of `plays` written with dimensions, broken down by country: one row per value with its count."""
    api = Issue15(world)
    api.require("group_by" in api.fields("/v1/GetCount", "request"), "breakdown (GetCount has no group_by)")
    counter = f"plays-{uuid.uuid4().hex[:6]}"
    for dims, delta in (({"country": "US", "device": "tv"}, 3), ({"country": "US", "device": "phone"}, 2),
                        ({"country": "FR", "device": "tv"}, 4)):
        r = world.post("/v1/AddCount", {"namespace": "plays", "counter_name": counter, "delta": delta,
                                         "dimensions": dims})
        assert r.status_code == 200, r.text
    wait_for(lambda: world.count(counter, "plays")["count"] == 9, 60, message="plays counter converged")
    browser.open(page, f"#/ns/plays/c/{counter}")
    page.wait_for_selector("#breakdown-table", timeout=15_000)
    values = page.locator("#breakdown-table tbody td:nth-child(1)").all_inner_texts()
    counts = page.locator("#breakdown-table tbody td:nth-child(2)").all_inner_texts()
    assert dict(zip(values, counts, strict=True)) == {"FR": "4", "US": "5"}


def test_unique_panel(world: World, browser: Browser, page: Any) -> None:
    """A unique count's estimate and bounds, as GetCount answers them, on the counter page."""
    api = Issue15(world)
    answered = {"estimate", "unique", "lower", "upper"} & api.fields("/v1/GetCount", "response")
    api.require(bool(answered) and "visitors" in world.namespaces, "unique counts (GetCount has no estimate)")
    counter = f"visits-{uuid.uuid4().hex[:6]}"
    for i in range(300):  # 100 distinct items, each written three times
        r = world.post("/v1/AddCount", {"namespace": "visitors", "counter_name": counter, "delta": 1,
                                         "item": f"user-{i % 100}"})
        assert r.status_code == 200, r.text

    def answer() -> dict:
        return world.count(counter, "visitors")
    wait_for(lambda: answer().get("count") == 100, 60, message="visitors counter rolled up")  # small: exact
    browser.open(page, f"#/ns/visitors/c/{counter}")
    page.wait_for_selector("#unique-estimate", timeout=15_000)
    got = answer()
    estimate = got.get("estimate", (got.get("unique") or {}).get("estimate"))
    assert page.locator("#unique-estimate").inner_text() == f"≈ {round(estimate):,}"
    assert 80 <= estimate <= 120, got
    # GetTopK refuses a UNIQUE namespace: its page says Top-K is not available instead of showing a 422
    browser.open(page, "#/ns/visitors")
    _panel_unavailable(page, "topK")
