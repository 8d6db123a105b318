// A counter: its count and as_of (refreshed live), its series, its breakdown and unique estimate where the
// namespace has them, and its newest events. The page marks `counter-page-ready` (Performance API) once the count,
// the chart and the audit table are drawn: the browser test reads it as the page's load time.

import {getCount} from "../api.js";
import {card, fill, h, nsHref} from "../dom.js";
import {ago, count, time} from "../format.js";
import {renderAudit} from "../panels/audit.js";
import {renderBreakdown, renderUnique} from "../panels/features.js";
import {renderSeries, seriesView} from "../panels/series.js";
import {readableNamespace} from "./namespaces.js";

const REFRESH_MS = 5000;

function countCard(ns, counter) {
  const value = h("span", {class: "big", id: "count"}, "…");
  const asOf = h("span", {id: "as-of"});
  const since = h("span", {class: "note"});
  const upTo = h("span", null, "exact up to ");  // blank before the first rollup ("exact up to not rolled up yet")
  const element = card("Count", {id: "count-card"},
    h("p", {class: "figure"}, value),
    h("p", null, ns.counter_type === "BEST_EFFORT" ? "approximate (memcached)" : [upTo, asOf, " ", since]));
  const load = async () => {
    const c = await getCount(ns.name, counter);
    value.textContent = count(c.count);
    value.dataset.value = String(c.count);
    upTo.textContent = c.as_of ? "exact up to " : "";
    asOf.textContent = c.as_of ? time(c.as_of) : "not rolled up yet";
    asOf.dataset.value = c.as_of || "";
    since.textContent = c.as_of ? `(${ago(c.as_of)})` : "";
  };
  return {element, load};
}

export async function renderCounter(ctx) {
  const {namespace, counter} = ctx.params;
  document.title = `${counter} · ${namespace} · Counter Abstraction`;
  const ns = await readableNamespace(ctx, namespace);
  if (!ns) return;
  const countPart = countCard(ns, counter);
  const series = h("div");
  const breakdown = h("div");
  const unique = h("div");
  const audit = h("div");
  fill(ctx.root,
    h("p", {class: "crumbs"}, h("a", {href: "#/"}, "Namespaces"), " / ", h("a", {href: nsHref(namespace)}, namespace),
      " / ", counter),
    h("h1", null, counter, " ", h("span", {class: `badge type-${ns.counter_type.toLowerCase()}`}, ns.counter_type)),
    h("div", {class: "columns counter"}, h("div", null, countPart.element, unique), series),
    h("div", {class: "columns"}, breakdown, audit));
  await Promise.all([countPart.load(), renderSeries(series, ns, counter, seriesView(ns, ctx.query)),
                     renderAudit(audit, ns, counter), renderBreakdown(breakdown, ns, counter),
                     renderUnique(unique, ns, counter)]);
  if (!ctx.current()) return;
  performance.mark("counter-page-ready");
  ctx.root.dataset.state = "ready";
  let stopped = false;
  let timer = null;
  const tick = () => {
    timer = setTimeout(() => countPart.load().catch(() => {}).finally(() => { if (!stopped) tick(); }), REFRESH_MS);
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
