// The 401/403 page: what the namespace needs, and a field to enter a key (kept in sessionStorage for this tab).

import {getKey, setKey} from "../api.js";
import {fill, h} from "../dom.js";

export function renderAuthRequired(root, {namespace, status = 401, detail}, retry) {
  const forbidden = status === 403;
  const input = h("input", {type: "password", name: "api-key", id: "auth-key", autocomplete: "off",
                            placeholder: "API key", "aria-label": "API key", required: true});
  const form = h("form", {class: "auth-form", onsubmit: (event) => {
    event.preventDefault();
    setKey(input.value.trim());
    retry();
  }}, input, h("button", {type: "submit"}, "Use this key"));
  const what = namespace ? `namespace “${namespace}”` : "this page";
  const message = forbidden
    ? `The API key in use may not read ${what}: it lacks the read scope.`
    : getKey()
      ? `The API key in use is not valid for ${what}.`
      : `${what[0].toUpperCase()}${what.slice(1)} is protected by API keys.`;
  document.title = `${status} · Counter Abstraction`;
  fill(root,
    h("section", {class: "auth card", id: "auth-required", dataset: {status: String(status)}},
      h("p", {class: "status-code"}, String(status)),
      h("h1", null, forbidden ? "Forbidden" : "API key required"),
      h("p", null, message),
      detail ? h("p", {class: "note"}, detail) : null,
      h("p", null, "Enter a key with the read scope. It is kept in this tab only (sessionStorage) and sent as the "
                   + "X-API-Key header; the UI never writes."),
      form,
      h("p", null, h("a", {href: "#/"}, "← all namespaces"))));
  root.dataset.state = "auth";
  input.focus();
}
