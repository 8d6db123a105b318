// A counter's newest events (increments and clears with their tokens), newest first, paging back on demand.

import {audit} from "../api.js";
import {append, card, fill, h, note, table} from "../dom.js";
import {time} from "../format.js";

function entryRow(e) {
  return h("tr", {class: e.clear ? "clear" : ""},
    h("td", {class: "time"}, time(e.event_time)),
    h("td", {class: "num delta"}, e.clear ? "clear" : (Number(e.delta) > 0 ? `+${e.delta}` : String(e.delta))),
    h("td", {class: "token"}, e.token),
    h("td", null, e.item_key || ""));
}

/** Draw the panel; resolves once the first page is shown. */
export async function renderAudit(el, ns, counter) {
  const body = h("div", {class: "panel-body"}, note("Loading…"));
  fill(el, card("Latest events (audit)", {id: "audit"}, body));
  if (ns.counter_type === "BEST_EFFORT") {
    fill(body, note("BEST_EFFORT counters keep no events: there is nothing to audit."));
    return;
  }
  const rows = h("tbody");
  const more = h("button", {type: "button", hidden: true}, "Older events");
  let before = null;
  const load = async () => {
    more.disabled = true;
    const page = await audit(ns.name, counter, before, 50);
    append(rows, page.entries.map(entryRow));
    before = page.next_before;
    more.hidden = !before;
    more.disabled = false;
    return page;
  };
  more.addEventListener("click", load);
  const first = await load();
  if (!first.entries.length) {
    fill(body, note("No events held for this counter (never written, or older than the namespace keeps events)."));
    return;
  }
  const t = table(["event time (UTC)", "delta", "token", "item key"], [], {class: "grid", id: "audit-table"});
  t.replaceChild(rows, t.tBodies[0]);
  fill(body, t, more);
}
