// Building the DOM without innerHTML: every value becomes a text node or a property, so a counter name, a dead
// letter's record or an error message can never be read as markup (the page's CSP forbids inline script too).

/** Make an element: h("a", {href: "#/", class: "nav"}, "text", child, [more children]). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else if (name === "value" || name === "checked" || name === "selected") el[name] = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

/** Append children (nodes, strings, numbers, nested arrays); null, undefined and false are skipped. */
export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** Replace an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** A card: a titled section of a page. `body` is what goes under the title. */
export function card(title, attrs, ...body) {
  return h("section", {class: "card", ...attrs}, h("h2", null, title), ...body);
}

/** A table from column titles and rows of cells (nodes or text). */
export function table(columns, rows, attrs) {
  return h("table", attrs,
    h("thead", null, h("tr", null, columns.map((c) => h("th", {scope: "col"}, c)))),
    h("tbody", null, rows));
}

/** A muted line of text: loading, empty, or a panel that is not available. */
export function note(text, cls = "") {
  return h("p", {class: `note ${cls}`.trim()}, text);
}

/** Links of the app's pages (the router is in app.js). */
export const nsHref = (name) => `#/ns/${encodeURIComponent(name)}`;
export const counterHref = (ns, counter) => `${nsHref(ns)}/c/${encodeURIComponent(counter)}`;
