// The panels of the features issue 15 added (js/features.js maps them to their endpoints): Top-K of a namespace
// (refreshed every few seconds while "live"), a counter's breakdown by one dimension, its unique-count estimate.
// Each says "not available for this namespace" when the API or the namespace lacks the feature.

import {card, counterHref, fill, h, note, table} from "../dom.js";
import {FEATURES, NOT_AVAILABLE} from "../features.js";
import {count, time} from "../format.js";

// -- shared ------------------------------------------------------------------------------------------------

/** The panel body of a feature the namespace (or the API) does not have. */
function unavailableNote(feature, reason) {
  return h("div", {class: "unavailable", dataset: {feature}},
    note(`${NOT_AVAILABLE}${reason ? ` (${reason})` : ""}.`));
}

/** "country=US, device=tv" -> {country: "US", device: "tv"}; throws on a key the namespace does not declare. */
function parseFilter(text, keys) {
  const filter = {};
  for (const part of text.split(",").map((p) => p.trim()).filter(Boolean)) {
    const [key, ...rest] = part.split("=");
    const value = rest.join("=").trim();
    if (!key.trim() || !value) throw new Error(`“${part}” is not key=value`);
    if (keys.length && !keys.includes(key.trim())) throw new Error(`“${key.trim()}” is not a dimension of this namespace (${keys.join(", ")})`);
    filter[key.trim()] = value;
  }
  return filter;
}

/** A horizontal bar for `value` out of `max` (CSSOM width: the CSP forbids style attributes). */
function bar(value, max) {
  const el = h("span", {class: "bar"});
  el.style.width = `${max > 0 ? Math.max(1, (100 * Number(value)) / max) : 0}%`;
  return h("span", {class: "bar-track"}, el);
}

/** Windows offered by the Top-K and breakdown panels. */
const WINDOWS = [["1h", "last hour"], ["24h", "last 24 hours"], ["7d", "last 7 days"], ["30d", "last 30 days"]];

// -- Top-K -------------------------------------------------------------------------------------------------

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

// -- breakdown by a dimension ------------------------------------------------------------------------------

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
        // compared exactly: counts beyond 2^53 are BigInts, and close ones would tie as floats (a review)
        const groups = [...data.groups].sort((a, b) => (BigInt(b.count) > BigInt(a.count)) - (BigInt(b.count) < BigInt(a.count)));
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

// -- unique count ------------------------------------------------------------------------------------------

export function renderUnique(el, ns, counter) {
  const feature = FEATURES.unique;
  const body = h("div", {class: "panel-body"}, note("Loading…"));
  fill(el, card(feature.title, {id: "unique", dataset: {feature: "unique"}}, body));
  return feature.check(ns).then(async (check) => {
    if (!check.available) {
      fill(body, unavailableNote("unique", check.reason));
      return;
    }
    try {
      const u = await feature.load(ns, counter);
      fill(body,
        h("p", {class: "figure"}, h("span", {class: "big", id: "unique-estimate"}, `≈ ${count(u.estimate)}`)),
        h("p", {id: "unique-bounds"}, `between ${count(u.lower)} and ${count(u.upper)}`),
        u.as_of ? note(`exact up to ${time(u.as_of)}`) : null);
    } catch (error) {
      fill(body, note(error.detail || error.message, "error"));
    }
  });
}
