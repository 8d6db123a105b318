// One namespace: its configuration, its counters (paged), and its Top-K, refreshing live.

import {counters} from "../api.js";
import {append, card, fill, h, note} from "../dom.js";
import {setting} from "../format.js";
import {renderTopK} from "../panels/topk.js";
import {counterHref, readableNamespace} from "./namespaces.js";

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
