// Pipeline health, refreshed every few seconds: the figures of GET /v1/pipeline (shared state and the broker).

import {pipeline} from "../api.js";
import {card, fill, h, note, table} from "../dom.js";
import {count, duration, rate as perSecond, time} from "../format.js";

const REFRESH_MS = 5000;
// Beyond these an operator should look (a figure turns amber); they are hints, not alerts.
const WARN = {watermark_s: 5, rollup_s: 60, queue: 10_000, persist: 100_000};

function tile(label, value, {id, warn = false, hint} = {}) {
  return h("div", {class: `tile${warn ? " warn" : ""}`, id, title: hint},
    h("span", {class: "tile-value"}, value), h("span", {class: "tile-label"}, label));
}

function tiles(p) {
  const r = p.rates;
  const rate = (value) => (r.window_s === null ? "measuring…" : perSecond(value));
  return h("div", {class: "tiles"},
    tile("watermark lag (max)", duration(p.watermark_lag_s), {id: "tile-watermark", warn: p.watermark_lag_s > WARN.watermark_s,
      hint: "now - the slowest partition's persist watermark"}),
    tile("rollup lag (max)", duration(p.rollup_lag_s), {id: "tile-rollup-lag", warn: p.rollup_lag_s > WARN.rollup_s,
      hint: "the age of the oldest work not rolled up yet, over the namespaces with pending counters"}),
    tile("rollup queue depth", count(p.rollup_queue?.depth), {id: "tile-queue", warn: p.rollup_queue?.depth > WARN.queue,
      hint: "rollup signals not yet consumed"}),
    tile("persist lag", `${count(p.persist_lag_records)} records`, {id: "tile-persist",
      warn: p.persist_lag_records > WARN.persist, hint: "mutation records not yet committed by the persist group"}),
    tile("dead letters", count(p.dlq?.size), {id: "tile-dlq", warn: p.dlq?.size > 0, hint: `records in ${p.topics.dlq}`}),
    tile("mutation records in", rate(r.mutation_records_per_s), {id: "tile-ingest",
      hint: `records appended to ${p.topics.mutations}, up to ${r.heartbeat_records_per_s}/s of them heartbeats`}),
    tile("records persisted", rate(r.persisted_records_per_s), {id: "tile-persisted"}),
    tile("API requests (this process)", rate(Object.values(r.api_requests_per_s).reduce((a, b) => a + b, 0)),
      {id: "tile-requests"}));
}

function watermarks(p) {
  return card("Persist watermarks per partition", {id: "watermarks"},
    p.watermarks.length
      ? table(["partition", "watermark", "lag", "end offset", "persisted", "behind"],
          p.watermarks.map((w) => h("tr", {class: w.lag_s > WARN.watermark_s ? "warn" : ""},
            h("td", {class: "num"}, w.partition), h("td", {class: "time"}, time(w.watermark)), h("td", {class: "num"}, duration(w.lag_s)),
            h("td", {class: "num"}, count(w.end_offset)), h("td", {class: "num"}, count(w.persisted_offset)),
            h("td", {class: "num"}, count(w.persist_lag_records)))), {class: "grid"})
      : note("No watermark yet: no worker has persisted a heartbeat."));
}

function rollups(p) {
  return card("Rollups per namespace", {id: "rollups"},
    table(["namespace", "pending counters", "rolled up to", "lag"], p.rollups.map((r) => h("tr", null,
      h("td", null, h("a", {href: `#/ns/${encodeURIComponent(r.namespace)}`}, r.namespace)),
      h("td", {class: "num"}, `${count(r.pending_counters)}${r.pending_truncated ? "+" : ""}`),
      h("td", {class: "time"}, time(r.rolled_up_to)), h("td", {class: "num"}, r.pending_counters ? duration(r.lag_s) : "converged"))),
      {class: "grid"}),
    p.rollup_queue
      ? h("p", {class: "note"}, `Rollup queue (${p.topics.rollups}): `, p.rollup_queue.partitions
        .map((q) => `p${q.partition} ${count(q.depth)}`).join(" · "))
      : null);
}

function deadLetters(p) {
  if (!p.dlq) return card("Dead letters", {id: "dead-letters"}, note(p.errors.dlq || "The broker did not answer."));
  const letters = p.dlq.dead_letters;
  return card(`Dead letters (${count(p.dlq.size)} in ${p.dlq.topic})`, {id: "dead-letters"},
    letters.length
      ? table(["time", "reason", "record", "from"], letters.map((d) => h("tr", null,
          h("td", {class: "time"}, time(d.time)), h("td", {class: "reason"}, d.reason),
          h("td", {class: "record"}, d.record), h("td", {class: "note"}, d.source))), {class: "grid", id: "dead-letter-table"})
      : note("No dead letters."),
    h("p", {class: "note"}, "Re-submit them after fixing the cause: ", h("code", null, "counter dlq replay --reason …")));
}

function requests(p) {
  const entries = Object.entries(p.rates.api_requests_per_s).filter(([, v]) => v > 0);
  return card("API requests per endpoint (this process)", {id: "requests"},
    entries.length
      ? table(["endpoint", "rate"], entries.map(([e, v]) => h("tr", null, h("td", null, e), h("td", {class: "num"}, perSecond(v)))),
          {class: "grid"})
      : note(p.rates.window_s === null ? "Measuring… (rates need two samples)" : "No requests in the last minute."));
}

export async function renderHealth(ctx) {
  document.title = "Pipeline health · Counter Abstraction";
  const status = h("span", {class: "note", id: "health-updated"});
  const body = h("div");
  fill(ctx.root, h("h1", null, "Pipeline health ", status), body);
  let timer = null;
  let stopped = false;
  const refresh = async () => {
    try {
      const p = await pipeline();
      if (stopped) return;
      const errors = Object.entries(p.errors).map(([source, why]) => note(`${source}: ${why}`, "error"));
      const warnings = (p.warnings || []).map((text) => note(text, "warn"));
      fill(body, errors, warnings, tiles(p), h("div", {class: "columns"}, watermarks(p), rollups(p)), deadLetters(p), requests(p));
      status.textContent = `updated ${time(p.generated_at)}${p.rates.window_s ? `, rates over ${duration(p.rates.window_s)}` : ""}`;
      ctx.root.dataset.state = "ready";
    } catch (error) {
      if (!stopped) status.textContent = `refresh failed: ${error.detail || error.message}`;
    }
    if (!stopped) timer = setTimeout(refresh, REFRESH_MS);
  };
  await refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
