// The panels whose endpoints issue 15 is adding: breakdown by a dimension, unique-count estimates, Top-K.
//
// Each feature says whether it is available for a namespace (the API serves it, checked in /openapi.json, and the
// namespace is configured for it) and how to load it, mapping the API's answer to what its panel draws:
//   breakdown -> {groups: [{value, count}], as_of}
//   unique    -> {estimate, lower, upper, as_of}
//   topK      -> {items: [{counter, count}], window, as_of}
// Until an endpoint exists its panel says "not available for this namespace" and why. Wiring one in is a change
// to its entry below (request body, response fields), nothing in the pages. The response readers accept the
// likely field names so a small difference in the final shape does not break the panel.

import {hasEndpoint, post, requestFields, responseFields} from "./api.js";

export const NOT_AVAILABLE = "not available for this namespace";

const unavailable = (reason) => ({available: false, reason});
const AVAILABLE = {available: true};

const first = (obj, names) => names.map((n) => obj?.[n]).find((v) => v !== undefined && v !== null);
const rolledUp = (ns) => ns.counter_type !== "BEST_EFFORT";

function entries(list, keyNames, valueNames) {
  if (Array.isArray(list)) {
    return list.map((e) => ({key: first(e, keyNames), count: first(e, valueNames)}));
  }
  if (list && typeof list === "object") return Object.entries(list).map(([key, count]) => ({key, count}));
  return [];
}

export const FEATURES = {
  breakdown: {
    title: "Breakdown by dimension",
    // GetCount grouped by one of the namespace's dimension keys: {"group_by": "country"} (issue 15)
    async check(ns) {
      if (!rolledUp(ns) || !(ns.config?.dimensions?.keys || []).length) return unavailable("it declares no dimensions");
      if (!(await requestFields("/v1/GetCount")).has("group_by")) return unavailable("the API does not group by a dimension yet");
      return AVAILABLE;
    },
    keys: (ns) => ns.config?.dimensions?.keys || [],
    async load(ns, counter, {key, filter, window}) {
      const body = {namespace: ns.name, counter_name: counter, group_by: key};
      if (filter && Object.keys(filter).length) body.dimensions = filter;
      if (window) body.window = window;
      const r = await post("/v1/GetCount", body);
      const list = first(r, ["groups", "breakdown", "by", "values"]);
      return {groups: entries(list, ["value", "key", "dimension_value"], ["count", "value"])
                .map((g) => ({value: g.key, count: g.count})), as_of: r.as_of};
    },
  },

  unique: {
    title: "Unique count",
    // An estimate with its error bounds, where the namespace counts distinct items (issue 15)
    async check(ns) {
      const fields = await responseFields("/v1/GetCount");
      if (!["estimate", "unique", "lower", "upper"].some((f) => fields.has(f))) return unavailable("the API has no unique counts yet");
      const u = ns.config?.unique ?? ns.config?.unique_counts;
      if (ns.config?.aggregation !== "UNIQUE" && !u) return unavailable("it does not count unique items");
      return AVAILABLE;
    },
    async load(ns, counter, {window} = {}) {
      const r = await post("/v1/GetCount", {namespace: ns.name, counter_name: counter, ...(window ? {window} : {})});
      const u = r.unique && typeof r.unique === "object" ? r.unique : r;
      const bounds = first(u, ["bounds", "error_bounds"]) || {};
      // count: the estimate rounded; the bounds widened to whole items
      return {estimate: first(u, ["count", "estimate"]), lower: Math.floor(first(u, ["lower", "lower_bound"]) ?? bounds.lower),
              upper: Math.ceil(first(u, ["upper", "upper_bound"]) ?? bounds.upper), as_of: r.as_of};
    },
  },

  topK: {
    title: "Top-K",
    // The namespace's K largest counters over a window, optionally filtered by dimensions (issue 15)
    async check(ns) {
      if (!(await hasEndpoint("/v1/GetTopK"))) return unavailable("the API has no GetTopK yet");
      if (!rolledUp(ns)) return unavailable("BEST_EFFORT namespaces keep no windows");
      // GetTopK refuses these (422): unique counts are estimates without rank lists, and a ranking needs buckets
      if (ns.config?.aggregation === "UNIQUE") return unavailable("it counts unique items, which are not ranked");
      if (!(ns.config?.windows?.granularities || []).length) return unavailable("it keeps no time windows");
      const t = ns.config?.top_k ?? ns.config?.topk;
      if (t === null || t === false || (t && t.enabled === false)) return unavailable("it keeps no Top-K");
      return AVAILABLE;
    },
    async load(ns, {k, window, filter}) {
      const body = {namespace: ns.name, k};
      if (window) body.window = window;
      if (filter && Object.keys(filter).length) body.dimensions = filter;
      const r = await post("/v1/GetTopK", body);
      const list = first(r, ["items", "top", "results", "counters", "entries"]);
      return {items: entries(list, ["counter_name", "counter", "name", "key"], ["count", "value", "estimate"])
                .map((e) => ({counter: e.key, count: e.count})), window: r.window, as_of: r.as_of};
    },
  },
};
