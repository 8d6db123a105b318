// What the feature panels share: the "not available" state, dimension filters, bars.

import {h, note} from "../dom.js";
import {NOT_AVAILABLE} from "../features.js";

/** The panel body of a feature the namespace (or the API) does not have. */
export function unavailableNote(feature, reason) {
  return h("div", {class: "unavailable", dataset: {feature}},
    note(`${NOT_AVAILABLE}${reason ? ` (${reason})` : ""}.`));
}

/** "country=US, device=tv" -> {country: "US", device: "tv"}; throws on a key the namespace does not declare. */
export function parseFilter(text, keys) {
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
export function bar(value, max) {
  const el = h("span", {class: "bar"});
  el.style.width = `${max > 0 ? Math.max(1, (100 * Number(value)) / max) : 0}%`;
  return h("span", {class: "bar-track"}, el);
}

/** Windows offered by the Top-K and breakdown panels. */
export const WINDOWS = [["1h", "last hour"], ["24h", "last 24 hours"], ["7d", "last 7 days"], ["30d", "last 30 days"]];
