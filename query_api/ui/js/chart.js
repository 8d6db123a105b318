// A counter's series as a chart: uPlot (vendored, MIT, loaded as a classic script before the modules), in UTC.
//
// The uPlot instance is kept on its element (`el.uplot`): its `data` are exactly the plotted points, which the
// browser test compares with the series the API returned.

const HEIGHT = 260;

function cssVar(name, fallback) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || fallback;
}

const utc = (seconds) => globalThis.uPlot.tzDate(new Date(seconds * 1000), "Etc/UTC");

/** Render `buckets` ([{start, count}]) into `el`; returns {destroy}. Replaces a chart already there. */
export function seriesChart(el, buckets, {granularity = "hour"} = {}) {
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
      {label: "count", stroke: accent, fill: `${accent}22`, width: 1.5,
       points: {show: xs.length <= 120, size: 4}, value: (_u, v) => (v === null ? "–" : v.toLocaleString("en-US"))},
    ],
    axes: [{...axis}, {...axis, size: 70}],
  };
  const u = new globalThis.uPlot(opts, [xs, ys], el);
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
