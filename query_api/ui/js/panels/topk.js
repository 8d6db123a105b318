// Top-K of a namespace for a chosen window and dimension filter, refreshed every few seconds while "live".

import {card, fill, h, note, table} from "../dom.js";
import {FEATURES} from "../features.js";
import {count, time} from "../format.js";
import {counterHref} from "../pages/namespaces.js";
import {WINDOWS, bar, parseFilter, unavailableNote} from "./common.js";

const REFRESH_MS = 5000;

/** Draw the panel into `el`; returns a function that stops its refresh. */
export function renderTopK(el, ns, query = {}) {
  const feature = FEATURES.topK;
  const body = h("div", {class: "panel-body"}, note("Loading…"));
  fill(el, card(feature.title, {id: "topk", dataset: {feature: "topK"}}, body));
  let timer = null;
  let stopped = false;

  feature.check(ns).then((check) => {
    if (stopped) return;
    if (!check.available) {
      fill(body, unavailableNote("topK", check.reason));
      return;
    }
    const keys = ns.config?.dimensions?.keys || [];
    const windowSelect = h("select", {name: "window", "aria-label": "window"},
      WINDOWS.map(([v, label]) => h("option", {value: v, selected: v === (query.topk_window || "24h")}, label)));
    const k = h("input", {type: "number", name: "k", min: 1, max: 100, value: query.k || "10", "aria-label": "K"});
    const filter = h("input", {type: "text", name: "filter", value: query.filter || "", spellcheck: "false",
                               placeholder: keys.length ? `${keys[0]}=…` : "no dimensions", disabled: !keys.length,
                               "aria-label": "dimension filter"});
    const live = h("input", {type: "checkbox", name: "live", checked: true});
    const status = h("span", {class: "note"});
    const result = h("div", {class: "topk-result"});
    const refresh = async () => {
      clearTimeout(timer);
      try {
        const data = await feature.load(ns, {k: Number(k.value) || 10, window: {last: windowSelect.value},
                                             filter: parseFilter(filter.value, keys)});
        if (stopped) return;
        const max = Math.max(0, ...data.items.map((i) => Number(i.count)));
        fill(result, data.items.length
          ? table(["#", "counter", "count", ""], data.items.map((item, i) => h("tr", null,
              h("td", {class: "num"}, i + 1),
              h("td", null, h("a", {href: counterHref(ns.name, item.counter)}, item.counter)),
              h("td", {class: "num count"}, count(item.count)),
              h("td", {class: "bar-cell"}, bar(item.count, max)))), {class: "grid", id: "topk-table"})
          : note("Nothing counted in this window."));
        status.textContent = `updated ${time(Date.now())}${data.as_of ? `, exact up to ${time(data.as_of)}` : ""}`;
      } catch (error) {
        if (stopped) return;
        fill(result, note(error.detail || error.message, "error"));
      }
      if (live.checked && !stopped) timer = setTimeout(refresh, REFRESH_MS);
    };
    for (const input of [windowSelect, k, live]) input.addEventListener("change", refresh);
    filter.addEventListener("change", refresh);
    fill(body, h("form", {class: "controls", onsubmit: (e) => { e.preventDefault(); refresh(); }},
      h("label", null, "window ", windowSelect), h("label", null, "K ", k), h("label", null, "filter ", filter),
      h("label", {class: "live"}, live, " live"), status), result);
    refresh();
  });
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
