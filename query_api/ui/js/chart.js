// A counter's series as a chart: uPlot (vendored, MIT; a classic script loading in parallel with the modules), in UTC.
//
// The uPlot instance is kept on its element (`el.uplot`): its `data` are exactly the plotted points, which the
// browser test compares with the series the API returned.

import {count} from "./format.js";

const HEIGHT = 260;

function cssVar(name, fallback) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || fallback;
}

const utc = (seconds) => globalThis.uPlot.tzDate(new Date(seconds * 1000), "Etc/UTC");

/** uPlot, once its script (index.html, async) has run. */
function uPlotLoaded() {
  if (globalThis.uPlot) return Promise.resolve(globalThis.uPlot);
  const script = document.getElementById("uplot-script");
  return new Promise((resolve, reject) => {
    script.addEventListener("load", () => resolve(globalThis.uPlot), {once: true});
    script.addEventListener("error", () => reject(new Error("the chart library did not load")), {once: true});
  });
}

/** Render `buckets` ([{start, count}]) into `el`; resolves with {destroy}. Replaces a chart already there. */
export async function seriesChart(el, buckets, {granularity = "hour"} = {}) {
  const uPlot = await uPlotLoaded();
  el.uplot?.destroy();
  const xs = buckets.map((b) => Date.parse(b.start) / 1000);
  const ys = buckets.map((b) => Number(b.count));
  const accent = cssVar("--accent", "#2563eb");
  const grid = {stroke: cssVar("--grid", "#e5e7eb"), width: 1};
  const axis = {stroke: cssVar("--muted", "#6b7280"), grid, ticks: grid};
  const opts = {
    width: Math.max(el.clientWidth, 320),
    height: HEIGHT,
    tzDate: utc,
    scales: {x: {time: true}},
    cursor: {points: {size: 6}},
    legend: {live: true},
    series: [
      {label: `${granularity} (UTC)`},
      // the point's height is a float (beyond 2^53 it is close, not exact); the legend prints the bucket's exact
      // count (a BigInt there), as the count card and the series total do: 2^53 + 1 read 2^53 here (a review)
      {label: "count", stroke: accent, fill: `${accent}22`, width: 1.5,
       points: {show: xs.length <= 120, size: 4},
       value: (_u, v, _series, i) => (v === null ? "–" : count(i == null ? v : buckets[i].count))},
    ],
    axes: [{...axis}, {...axis, size: 70}],
  };
  const u = new uPlot(opts, [xs, ys], el);
  el.uplot = u;
  const resize = new ResizeObserver(() => {
    const width = Math.max(el.clientWidth, 320);
    if (width !== u.width) u.setSize({width, height: HEIGHT});
  });
  resize.observe(el);
  return {
    destroy() {
      resize.disconnect();
      u.destroy();
      if (el.uplot === u) delete el.uplot;
    },
  };
}
