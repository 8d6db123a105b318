// The single-page app: a hash router (#/, #/ns/<namespace>, #/ns/<namespace>/c/<counter>, #/health), the API key
// bar, and the page lifecycle (a page returns a function that stops its timers when the user leaves it).

import {ApiError, getKey, setKey} from "./api.js";
import {fill, h, note} from "./dom.js";
import {renderAuthRequired} from "./pages/auth.js";
import {renderCounter} from "./pages/counter.js";
import {renderHealth} from "./pages/health.js";
import {renderNamespace, renderNamespaces} from "./pages/namespaces.js";

const main = document.getElementById("main");
let dispose = null;
let generation = 0;

/** A path part as written, when it is no valid percent-encoding (`%E0%A4%A` threw a URIError before the page's own
 * error handling, leaving the previous page on screen: a review); the page then says what it could not find. */
function decodePart(part) {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
}

/** The current route: {page, params, query}. */
export function route() {
  const [path, search = ""] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodePart);
  const query = Object.fromEntries(new URLSearchParams(search));
  if (parts[0] === "health") return {page: "health", params: {}, query};
  if (parts[0] === "ns" && parts.length >= 4 && parts[2] === "c") {
    return {page: "counter", params: {namespace: parts[1], counter: parts.slice(3).join("/")}, query};
  }
  if (parts[0] === "ns" && parts[1]) return {page: "namespace", params: {namespace: parts[1]}, query};
  return {page: "namespaces", params: {}, query};
}

const PAGES = {namespaces: renderNamespaces, namespace: renderNamespace, counter: renderCounter, health: renderHealth};

async function show() {
  const mine = ++generation;
  dispose?.();
  dispose = null;
  const {page, params, query} = route();
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === page);
  const root = h("div", {class: "page", dataset: {page, state: "loading"}});
  fill(main, root);
  const ctx = {
    root,
    params,
    query,
    // a page still loading when the user moved on must not draw over the next one
    current: () => mine === generation,
    authRequired: (details) => renderAuthRequired(root, details, show),
  };
  try {
    dispose = (await PAGES[page](ctx)) || null;
    if (mine !== generation) dispose?.();
  } catch (error) {
    if (mine !== generation) return;
    if (error instanceof ApiError && (error.status === 401 || error.status === 403)) {
      renderAuthRequired(root, {namespace: params.namespace, status: error.status, detail: error.detail}, show);
    } else {
      fill(root, h("h1", null, "Something went wrong"), note(error instanceof ApiError ? `${error.status}: ${error.detail}` : String(error), "error"));
      root.dataset.state = "error";
    }
  }
}

function keyBar() {
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  const state = document.getElementById("key-state");
  const forget = document.getElementById("key-forget");
  const refresh = () => {
    const has = Boolean(getKey());
    state.textContent = has ? "key set for this tab" : "no key";
    forget.hidden = !has;
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    setKey(input.value.trim());
    input.value = "";
    refresh();
    show();
  });
  forget.addEventListener("click", () => {
    setKey("");
    refresh();
    show();
  });
  refresh();
}

keyBar();
window.addEventListener("hashchange", show);
show();
