// A counter's minute/hour/day series with a range picker; the range lives in the URL so a view can be shared.

import {getSeries} from "../api.js";
import {card, fill, h, note} from "../dom.js";
import {seriesChart} from "../chart.js";
import {count, time} from "../format.js";

const H = 3600;
const D = 86400;
// At most 1,440 buckets per GetCountSeries call: every preset stays within it.
export const RANGES = {
  minute: [["1h", H], ["6h", 6 * H], ["24h", D]],
  hour: [["24h", D], ["7d", 7 * D], ["30d", 30 * D], ["60d", 60 * D]],
  day: [["30d", 30 * D], ["90d", 90 * D], ["1y", 365 * D], ["3y", 1095 * D]],
};
const DEFAULT_RANGE = {minute: "6h", hour: "30d", day: "90d"};

/** The view the URL asks for, within what the namespace keeps: {granularity, range} or {granularity, from, to}. */
export function seriesView(ns, query) {
  const kept = ns.config?.windows?.granularities || [];
  const granularity = kept.includes(query.g) ? query.g : (kept.includes("hour") ? "hour" : kept[0]);
  if (!granularity) return null;
  if (query.from) return {granularity, from: query.from, to: query.to || ""};
  const range = RANGES[granularity].some(([r]) => r === query.r) ? query.r : DEFAULT_RANGE[granularity];
  return {granularity, range};
}

function viewHash(view) {
  const [path] = location.hash.split("?");
  const params = new URLSearchParams({g: view.granularity});
  if (view.from) {
    params.set("from", view.from);
    if (view.to) params.set("to", view.to);
  } else {
    params.set("r", view.range);
  }
  return `${path}?${params}`;
}

const utcInput = (iso) => (iso ? iso.slice(0, 16) : "");
const fromInput = (value) => (value ? `${value}:00Z` : "");

/** Draw the panel; resolves with the series once the chart shows it. `onView` hears of a new view. */
export async function renderSeries(el, ns, counter, view) {
  const body = h("div", {class: "panel-body"});
  fill(el, card("Series", {id: "series"}, body));
  if (!view) {
    fill(body, note(ns.counter_type === "BEST_EFFORT"
      ? "BEST_EFFORT namespaces keep no time windows."
      : "This namespace keeps no time windows (windows: in its configuration)."));
    return null;
  }
  const kept = ns.config.windows.granularities;
  const chartEl = h("div", {class: "chart", id: "series-chart"});
  const summary = h("p", {class: "note", id: "series-summary"});
  const granularity = h("select", {name: "granularity", "aria-label": "granularity"},
    kept.map((g) => h("option", {value: g, selected: g === view.granularity}, g)));
  const ranges = h("span", {class: "ranges", role: "group", "aria-label": "range"});
  const from = h("input", {type: "datetime-local", name: "from", value: utcInput(view.from), "aria-label": "from (UTC)"});
  const to = h("input", {type: "datetime-local", name: "to", value: utcInput(view.to), "aria-label": "to (UTC)"});
  let chart = null;

  const load = async (v) => {
    history.replaceState(null, "", viewHash(v));
    fill(ranges, RANGES[v.granularity].map(([r]) => h("button", {
      type: "button", class: !v.from && r === v.range ? "active" : "", dataset: {range: r},
      onclick: () => load({granularity: v.granularity, range: r})}, r)));
    const seconds = v.from ? 0 : RANGES[v.granularity].find(([r]) => r === v.range)[1];
    const start = v.from ? fromInput(v.from) : new Date(Date.now() - seconds * 1000).toISOString();
    const end = v.from && v.to ? fromInput(v.to) : undefined;
    try {
      const s = await getSeries(ns.name, counter, v.granularity, start, end);
      chart?.destroy();
      chart = await seriesChart(chartEl, s.buckets, {granularity: v.granularity});
      const total = s.buckets.reduce((sum, b) => sum + BigInt(b.count), 0n);
      summary.textContent = `${s.buckets.length} ${v.granularity} buckets from ${time(s.start)} to ${time(s.end)}: `
        + `${count(total)} in all, exact up to ${time(s.as_of)}`;
      return s;
    } catch (error) {
      chart?.destroy();
      chart = null;
      fill(chartEl);
      summary.textContent = error.detail || error.message;
      summary.classList.add("error");
      return null;
    }
  };
  granularity.addEventListener("change", () => load({granularity: granularity.value, range: DEFAULT_RANGE[granularity.value]}));
  const custom = h("form", {class: "inline", onsubmit: (e) => {
    e.preventDefault();
    if (from.value) load({granularity: granularity.value, from: from.value, to: to.value});
  }}, h("label", null, "from ", from), h("label", null, "to ", to), h("button", {type: "submit"}, "Apply"),
    h("span", {class: "note"}, "UTC"));
  fill(body, h("div", {class: "controls"}, granularity, ranges, custom), chartEl, summary);
  return load(view);
}
