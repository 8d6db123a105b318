// A unique-count estimate with its error bounds, where the namespace counts distinct items.

import {card, fill, h, note} from "../dom.js";
import {FEATURES} from "../features.js";
import {count, time} from "../format.js";
import {unavailableNote} from "./common.js";

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
