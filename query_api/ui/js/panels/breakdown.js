// A counter broken down by one of its namespace's dimensions, with an optional filter on the others.

import {card, fill, h, note, table} from "../dom.js";
import {FEATURES} from "../features.js";
import {count, time} from "../format.js";
import {WINDOWS, bar, parseFilter, unavailableNote} from "./common.js";

export function renderBreakdown(el, ns, counter) {
  const feature = FEATURES.breakdown;
  const body = h("div", {class: "panel-body"}, note("Loading…"));
  fill(el, card(feature.title, {id: "breakdown", dataset: {feature: "breakdown"}}, body));
  return feature.check(ns).then((check) => {
    if (!check.available) {
      fill(body, unavailableNote("breakdown", check.reason));
      return;
    }
    const keys = feature.keys(ns);
    const key = h("select", {name: "dimension", "aria-label": "dimension"}, keys.map((k) => h("option", {value: k}, k)));
    const windowSelect = h("select", {name: "window", "aria-label": "window"},
      h("option", {value: ""}, "total"), WINDOWS.map(([v, label]) => h("option", {value: v}, label)));
    const filter = h("input", {type: "text", name: "filter", spellcheck: "false", placeholder: "other=value, …",
                               "aria-label": "dimension filter"});
    const result = h("div");
    const load = async () => {
      try {
        const data = await feature.load(ns, counter, {key: key.value, filter: parseFilter(filter.value, keys),
                                                      window: windowSelect.value ? {last: windowSelect.value} : null});
        const groups = [...data.groups].sort((a, b) => Number(b.count) - Number(a.count));
        const max = Math.max(0, ...groups.map((g) => Number(g.count)));
        fill(result, groups.length
          ? table([key.value, "count", ""], groups.map((g) => h("tr", null, h("td", null, g.value),
              h("td", {class: "num count"}, count(g.count)), h("td", {class: "bar-cell"}, bar(g.count, max)))),
              {class: "grid", id: "breakdown-table"})
          : note("No value of this dimension was counted."),
          data.as_of ? note(`exact up to ${time(data.as_of)}`) : null);
      } catch (error) {
        fill(result, note(error.detail || error.message, "error"));
      }
    };
    for (const input of [key, windowSelect, filter]) input.addEventListener("change", load);
    fill(body, h("form", {class: "controls", onsubmit: (e) => { e.preventDefault(); load(); }},
      h("label", null, "by ", key), h("label", null, "window ", windowSelect), h("label", null, "filter ", filter)), result);
    return load();
  });
}
