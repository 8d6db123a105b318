// Formatting numbers, times and durations the same way on every page. Times are shown in UTC, like the API's.

const grouping = new Intl.NumberFormat("en-US");

/** A count with thousands separators; BigInt-safe (the API's counts are int64). */
export function count(value) {
  if (value === null || value === undefined) return "–";
  return grouping.format(value);
}

/** A rate per second, with sensible precision. */
export function rate(value) {
  if (value === null || value === undefined) return "–";
  if (value >= 100) return `${grouping.format(Math.round(value))}/s`;
  return `${value.toFixed(value >= 10 ? 1 : 2)}/s`;
}

/** "2026-11-23 14:05:09Z" from an RFC 3339 string or epoch milliseconds. */
export function time(value) {
  if (value === null || value === undefined) return "–";
  const d = typeof value === "number" ? new Date(value) : new Date(value);
  if (Number.isNaN(d.getTime())) return String(value);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

/** Seconds as "850 ms", "4.2 s", "3 min", "2.5 h", "6 d". */
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.abs(seconds);
  if (s < 1) return `${Math.round(seconds * 1000)} ms`;
  if (s < 60) return `${seconds.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 3600) return `${(seconds / 60).toFixed(s < 600 ? 1 : 0)} min`;
  if (s < 86400) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

/** How long ago an RFC 3339 time was: "12 s ago". */
export function ago(value) {
  if (!value) return "";
  const seconds = (Date.now() - new Date(value).getTime()) / 1000;
  return seconds >= 0 ? `${duration(seconds)} ago` : `in ${duration(-seconds)}`;
}

/** A configuration value for display, by its dotted path: durations in seconds (`accept_limit_s`,
 * `windows.retention_s.hour`) get a unit (null: forever), nested objects a compact form. */
export function setting(path, value) {
  const seconds = /_s(\.|$)/.test(path);
  if (value === null || value === undefined) return seconds ? "forever" : "–";
  if (typeof value === "number" && seconds) return duration(value);
  if (Array.isArray(value)) return value.length ? value.join(", ") : "none";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}
