// The namespaces: type, whether keys guard them, and the settings operators look at first.

import {namespaceInfo, namespaces} from "../api.js";
import {fill, h, note, table} from "../dom.js";
import {duration, setting} from "../format.js";

export const nsHref = (name) => `#/ns/${encodeURIComponent(name)}`;
export const counterHref = (ns, counter) => `${nsHref(ns)}/c/${encodeURIComponent(counter)}`;

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
