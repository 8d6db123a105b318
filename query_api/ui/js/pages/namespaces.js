// The namespaces (type, whether keys guard them, the settings operators look at first) and one namespace (its
// configuration, its counters, its Top-K).

import {counters, namespaceInfo, namespaces} from "../api.js";
import {append, card, counterHref, fill, h, note, nsHref, table} from "../dom.js";
import {duration, setting} from "../format.js";
import {renderTopK} from "../panels/features.js";

/** The namespace's listing entry when the key may read it; otherwise draws the 401 or "unknown" page, returns null. */
export async function readableNamespace(ctx, name) {
  const info = await namespaceInfo(name);
  if (!ctx.current()) return null;
  if (!info) {
    fill(ctx.root, h("h1", null, "Unknown namespace"),
         note(`No namespace “${name}” is configured.`, "error"), h("p", null, h("a", {href: "#/"}, "← all namespaces")));
    ctx.root.dataset.state = "not-found";
    return null;
  }
  if (!info.readable) {  // the listing says what the API would answer, without a failing request
    ctx.authRequired(info.key_valid
      ? {namespace: name, status: 403, detail: `this API key lacks the read scope for namespace '${name}'`}
      : {namespace: name, status: 401, detail: `namespace '${name}' requires an API key (X-API-Key header)`});
    return null;
  }
  return info;
}

function windowsText(config) {
  const w = config?.windows;
  if (!w || !w.granularities?.length) return "none";
  return w.granularities.map((g) => {
    const kept = w.retention_s?.[g];
    return `${g} (${kept === null || kept === undefined ? "forever" : duration(kept)})`;
  }).join(", ");
}

function row(ns) {
  const c = ns.config;
  const lock = ns.requires_key ? h("span", {class: "badge lock", title: "API keys guard this namespace"},
                                   ns.readable ? "key ✓" : "key required") : null;
  const cells = c
    ? [c.cardinality, windowsText(c), setting("accept_limit_s", c.accept_limit_s),
       c.queue ? `${c.queue.coalesce_ms} ms` : "–", setting("delete_after_s", c.retention?.delete_after_s),
       (c.dimensions?.keys || []).join(", ") || "–"]
    : Array(6).fill("–");
  return h("tr", {dataset: {namespace: ns.name}},
    h("td", null, h("a", {href: nsHref(ns.name), class: "ns-link"}, ns.name), " ", lock),
    h("td", null, h("span", {class: `badge type-${ns.counter_type.toLowerCase()}`}, ns.counter_type)),
    cells.map((v) => h("td", null, v)));
}

export async function renderNamespaces(ctx) {
  document.title = "Namespaces · Counter Abstraction";
  const list = await namespaces({fresh: true});
  if (!ctx.current()) return;
  fill(ctx.root,
    h("h1", null, "Namespaces"),
    h("p", {class: "lede"}, `${list.length} configured. A namespace guarded by API keys shows its settings once `
      + "a key with the read scope is entered above."),
    h("section", {class: "card"},
      list.length
        ? table(["namespace", "type", "cardinality", "windows (kept for)", "accept limit", "coalesce", "events kept",
                 "dimensions"], list.map(row), {id: "namespaces", class: "grid"})
        : note("No namespaces are configured.")));
  ctx.root.dataset.state = "ready";
}

// -- one namespace -----------------------------------------------------------------------------------------

/** Nested settings as flat rows: queue.coalesce_ms -> 200. */
function flatten(obj, prefix = "", out = []) {
  for (const [name, value] of Object.entries(obj || {})) {
    const path = prefix ? `${prefix}.${name}` : name;
    if (value && typeof value === "object" && !Array.isArray(value)) flatten(value, path, out);
    else out.push([path, setting(path, value)]);
  }
  return out;
}

function configCard(ns) {
  return card("Configuration", {id: "config"},
    h("dl", {class: "settings"}, flatten(ns.config).map(([name, value]) => [h("dt", null, name), h("dd", null, value)])));
}

function countersCard(ns) {
  const list = h("ul", {class: "counters", id: "counters"});
  const more = h("button", {type: "button", hidden: true}, "More counters");
  let after = null;
  const load = async () => {
    more.disabled = true;
    const page = await counters(ns.name, after);
    append(list, page.counters.map((c) => h("li", null, h("a", {href: counterHref(ns.name, c)}, c))));
    if (!list.children.length) append(list, h("li", {class: "note"}, "No counter has stored events yet."));
    after = page.next_after;
    more.hidden = !after;
    more.disabled = false;
  };
  const input = h("input", {type: "text", name: "counter", placeholder: "counter name", "aria-label": "counter name",
                            required: true, spellcheck: "false"});
  const open = h("form", {class: "inline", onsubmit: (event) => {
    event.preventDefault();
    if (input.value.trim()) location.hash = counterHref(ns.name, input.value.trim());
  }}, input, h("button", {type: "submit"}, "Open"));
  const body = ns.counter_type === "BEST_EFFORT"
    ? [note("BEST_EFFORT counters live in memcached only: there is no list of them. Open one by name."), open]
    : [open, list, more];
  more.addEventListener("click", load);
  return {element: card("Counters", {id: "counters-card"}, ...body),
          ready: ns.counter_type === "BEST_EFFORT" ? Promise.resolve() : load()};
}

export async function renderNamespace(ctx) {
  const name = ctx.params.namespace;
  document.title = `${name} · Counter Abstraction`;
  const ns = await readableNamespace(ctx, name);
  if (!ns) return;
  const list = countersCard(ns);
  const topk = h("div");
  fill(ctx.root,
    h("p", {class: "crumbs"}, h("a", {href: "#/"}, "Namespaces"), " / ", name),
    h("h1", null, name, " ", h("span", {class: `badge type-${ns.counter_type.toLowerCase()}`}, ns.counter_type)),
    h("div", {class: "columns"}, h("div", null, list.element, topk), configCard(ns)));
  const stopTopK = renderTopK(topk, ns, ctx.query);
  await list.ready;
  ctx.root.dataset.state = "ready";
  return stopTopK;
}
