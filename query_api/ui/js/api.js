// The API as the pages use it: the same endpoints and keys as any client, read calls only.
//
// The key the user types is kept in sessionStorage (gone when the tab closes) and sent as X-API-Key with every
// request. Pages ask `namespaces()` first: it says which namespaces the key may read, so a page shows the 401
// page instead of making a request that would fail (a failed request is a console error in the browser).
//
// This module imports nothing and index.html loads it first, on its own: it starts the requests every page begins
// with (the namespaces listing, the API's description) while the rest of the page's code still downloads.

const KEY_STORAGE = "counter-ui.api-key";

export class ApiError extends Error {
  constructor(status, detail, path) {
    super(`${status} ${detail}`);
    this.status = status;
    this.detail = detail;
    this.path = path;
  }
}

export function getKey() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

export function setKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
  namespacesCache = null;
}

// Counts are int64: integers beyond 2^53 are kept exact as BigInt (JSON.parse's source text access).
function exactIntegers(_key, value, context) {
  if (typeof value === "number" && !Number.isSafeInteger(value) && context && /^-?\d+$/.test(context.source)) {
    return BigInt(context.source);
  }
  return value;
}

function detailOf(data) {
  const detail = data && data.detail;
  if (Array.isArray(detail)) return detail.map((d) => `${(d.loc || []).slice(1).join(".")}: ${d.msg}`).join("; ");
  return typeof detail === "string" ? detail : JSON.stringify(data);
}

// A request the API does not answer in this time fails (status 0): the health page said nothing for as long as a
// hung API kept its request open, showing its last figures as current (a review).
export const REQUEST_TIMEOUT_MS = 10_000;

async function request(method, path, body) {
  const headers = {Accept: "application/json"};
  const key = getKey();
  if (key) headers["X-API-Key"] = key;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  try {
    return await read(fetch(path, {method, headers, cache: "no-store", signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
                                   body: body === undefined ? undefined : JSON.stringify(body)}), path);
  } catch (error) {
    if (error && error.name === "TimeoutError") {
      throw new ApiError(0, `no answer from the API within ${REQUEST_TIMEOUT_MS / 1000} s`, path);
    }
    throw error;
  }
}

/** The JSON of a response (ApiError unless 2xx). */
async function read(responsePromise, path) {
  const response = await responsePromise;
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text, exactIntegers) : null;
  } catch {
    data = {detail: text};
  }
  if (!response.ok) throw new ApiError(response.status, detailOf(data), path);
  return data;
}

const get = (path) => request("GET", path);
const post = (path, body) => request("POST", path, body);
const q = (params) => {
  const search = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") search.set(k, v);
  const text = search.toString();
  return text ? `?${text}` : "";
};
const seg = encodeURIComponent;

let namespacesCache = null; // {at, promise}: one listing shared by the pages for a few seconds
let openapi = null;

// Started when this module loaded (see the top), each taken once; the listing only while the key is the same.
const early = {key: getKey(), "/v1/namespaces": get("/v1/namespaces"), "/openapi.json": get("/openapi.json")};
for (const path of ["/v1/namespaces", "/openapi.json"]) early[path].catch(() => {});  // a page may not take it

function booted(path) {
  const started = early[path];
  early[path] = null;
  return started && (path !== "/v1/namespaces" || early.key === getKey()) ? started : null;
}

/** Every namespace with its type, whether the key may read it, and its configuration when it may. */
export function namespaces({fresh = false} = {}) {
  if (fresh || !namespacesCache || Date.now() - namespacesCache.at > 10_000) {
    const promise = (booted("/v1/namespaces") || get("/v1/namespaces")).then((r) => r.namespaces);
    namespacesCache = {at: Date.now(), promise};
    promise.catch(() => { namespacesCache = null; });
  }
  return namespacesCache.promise;
}

/** One namespace from the listing, or null when it does not exist. */
export async function namespaceInfo(name) {
  return (await namespaces()).find((n) => n.name === name) || null;
}

function openapiDoc() {
  openapi ??= (booted("/openapi.json") || get("/openapi.json")).catch(() => ({paths: {}}));
  return openapi;
}

/** Whether the API serves `path` (read once from /openapi.json): panels of endpoints still being built check it. */
export async function hasEndpoint(path) {
  return path in ((await openapiDoc()).paths || {});
}

// The property names of a schema, following $ref, allOf, anyOf and oneOf.
function properties(doc, schema, out = new Set(), depth = 0) {
  if (!schema || depth > 8) return out;
  if (schema.$ref) {
    const name = schema.$ref.split("/").pop();
    return properties(doc, doc.components?.schemas?.[name], out, depth + 1);
  }
  for (const name of Object.keys(schema.properties || {})) out.add(name);
  for (const part of [...(schema.allOf || []), ...(schema.anyOf || []), ...(schema.oneOf || [])]) {
    properties(doc, part, out, depth + 1);
  }
  return out;
}

/** The fields a POST endpoint's JSON body accepts (empty when it does not exist). */
export async function requestFields(path) {
  const doc = await openapiDoc();
  return properties(doc, doc.paths?.[path]?.post?.requestBody?.content?.["application/json"]?.schema);
}

/** The fields of a POST endpoint's 200 JSON response (empty when it does not exist). */
export async function responseFields(path) {
  const doc = await openapiDoc();
  return properties(doc, doc.paths?.[path]?.post?.responses?.["200"]?.content?.["application/json"]?.schema);
}

export const counters = (ns, after, limit = 100) => get(`/v1/namespaces/${seg(ns)}/counters${q({after, limit})}`);
export const audit = (ns, counter, before, limit = 50) =>
  get(`/v1/namespaces/${seg(ns)}/audit${q({counter_name: counter, before, limit})}`);
export const pipeline = () => get("/v1/pipeline");
export const getCount = (ns, counter, window) =>
  post("/v1/GetCount", window ? {namespace: ns, counter_name: counter, window} : {namespace: ns, counter_name: counter});
export const getSeries = (ns, counter, granularity, start, end) =>
  post("/v1/GetCountSeries", {namespace: ns, counter_name: counter, granularity, start, ...(end ? {end} : {})});
export {post};
