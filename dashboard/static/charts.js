// Charts drawn as inline SVG: no library, nothing fetched from elsewhere.
import { h, s, fmtDur, fmtNum, fmtTime } from "./dom.js";

const PALETTE = ["#3b6fd4", "#e07b39", "#3aa27a", "#b5527b", "#8a6fd1", "#c9a227", "#4bb0c8", "#7a7a7a"];
export const STATE_COLORS = {
  PENDING: "#b0b7c3", SUBMITTED: "#8fa3bf", RUNNING: "#3b6fd4", FINISHED: "#3aa27a", FAILED: "#d14b4b",
};

export function colorOf(key, keys) {
  return PALETTE[Math.max(0, keys.indexOf(key)) % PALETTE.length];
}

// Events over time: one stacked bar per bucket, one colour per kind.
export function timelineChart(points, bucketS) {
  const width = 900, height = 190, left = 48, bottom = 22, top = 8;
  const kinds = [...new Set(points.map((p) => p.kind || "?"))].sort();
  const buckets = new Map();
  for (const p of points) {
    if (!buckets.has(p.t)) buckets.set(p.t, {});
    buckets.get(p.t)[p.kind || "?"] = p.events;
  }
  const times = [...buckets.keys()].sort();
  if (!times.length) return h("p", { class: "muted" }, "No events.");
  const first = Date.parse(times[0]), last = Date.parse(times[times.length - 1]);
  const slots = Math.max(1, Math.round((last - first) / (bucketS * 1000)) + 1);
  const totals = times.map((t) => Object.values(buckets.get(t)).reduce((a, b) => a + b, 0));
  const peak = Math.max(...totals, 1);
  const plotW = width - left - 8, plotH = height - top - bottom, barW = Math.max(1, plotW / slots);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart timeline", role: "img",
    "aria-label": "events over time" });
  svg.append(s("text", { x: left - 6, y: top + 10, "text-anchor": "end", class: "axis" }, fmtNum(peak)));
  svg.append(s("text", { x: left - 6, y: top + plotH, "text-anchor": "end", class: "axis" }, "0"));
  svg.append(s("line", { x1: left, x2: width - 8, y1: top + plotH, y2: top + plotH, class: "axis-line" }));
  for (const t of times) {
    const slot = Math.round((Date.parse(t) - first) / (bucketS * 1000));
    let y = top + plotH;
    for (const kind of kinds) {
      const n = buckets.get(t)[kind] || 0;
      if (!n) continue;
      const barH = (n / peak) * plotH;
      y -= barH;
      svg.append(s("rect", { x: left + slot * barW, y, width: Math.max(1, barW - 1), height: barH,
        fill: colorOf(kind, kinds) }, s("title", null, `${fmtTime(t)} ${kind}: ${n}`)));
    }
  }
  svg.append(s("text", { x: left, y: height - 6, class: "axis" }, fmtTime(times[0])));
  svg.append(s("text", { x: width - 8, y: height - 6, "text-anchor": "end", class: "axis" },
    fmtTime(times[times.length - 1])));
  const legend = h("div", { class: "legend" }, kinds.map((k) =>
    h("span", null, h("i", { style: `background:${colorOf(k, kinds)}` }), k)));
  return h("div", null, svg, legend);
}

// Duration distribution of one row: 28 quarter-decade bins from 1 ms (the SQL's
// duration_bin), with ticks at p50, p90 and p99.
const BINS = 28, BIN_W = 4;
function binX(seconds) {
  const v = Math.max(Number(seconds), 1e-3);
  return Math.min(BINS, Math.max(0, (Math.log10(v) + 3) * 4)) * BIN_W;
}

export function histogram(bins, row) {
  const height = 26, width = BINS * BIN_W;
  const counts = Array.from({ length: BINS }, (_, i) => Number((bins || {})[i] || 0));
  const peak = Math.max(...counts, 1);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, width, height, class: "histogram" });
  svg.append(s("rect", { x: 0, y: 0, width, height, class: "hist-bg" }));
  counts.forEach((n, i) => {
    if (!n) return;
    const barH = Math.max(1, (n / peak) * (height - 4));
    svg.append(s("rect", { x: i * BIN_W, y: height - barH, width: BIN_W - 0.5, height: barH,
      class: "hist-bar" }, s("title", null, `${n} in ${fmtDur(10 ** (i / 4 - 3))}–${fmtDur(10 ** ((i + 1) / 4 - 3))}`)));
  });
  for (const [key, cls] of [["p50_s", "q50"], ["p90_s", "q90"], ["p99_s", "q99"]]) {
    if (row[key] === null || row[key] === undefined) continue;
    const x = binX(row[key]);
    svg.append(s("line", { x1: x, x2: x, y1: 0, y2: height, class: `quantile ${cls}` },
      s("title", null, `${key.replace("_s", "")}: ${fmtDur(row[key])}`)));
  }
  return svg;
}

// One metric over steps: the mean as a line, min..max as a band.
export function metricChart(metric, points) {
  const width = 420, height = 170, left = 50, right = 10, top = 22, bottom = 24;
  const steps = points.map((p) => p.step);
  const lo = Math.min(...points.map((p) => p.min)), hi = Math.max(...points.map((p) => p.max));
  const x0 = Math.min(...steps), x1 = Math.max(...steps);
  const xs = (step) => left + (x1 === x0 ? 0.5 : (step - x0) / (x1 - x0)) * (width - left - right);
  const ys = (v) => top + (hi === lo ? 0.5 : 1 - (v - lo) / (hi - lo)) * (height - top - bottom);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart metric", role: "img",
    "aria-label": `${metric} over steps` });
  svg.append(s("text", { x: left, y: 14, class: "chart-title" }, metric));
  svg.append(s("text", { x: left - 6, y: top + 8, "text-anchor": "end", class: "axis" }, fmtNum(hi)));
  svg.append(s("text", { x: left - 6, y: height - bottom, "text-anchor": "end", class: "axis" }, fmtNum(lo)));
  svg.append(s("text", { x: left, y: height - 6, class: "axis" }, `step ${x0}`));
  svg.append(s("text", { x: width - right, y: height - 6, "text-anchor": "end", class: "axis" }, `step ${x1}`));
  const band = points.map((p) => `${xs(p.step)},${ys(p.max)}`)
    .concat([...points].reverse().map((p) => `${xs(p.step)},${ys(p.min)}`)).join(" ");
  svg.append(s("polygon", { points: band, class: "band" }));
  svg.append(s("polyline", { points: points.map((p) => `${xs(p.step)},${ys(p.mean)}`).join(" "), class: "line" }));
  for (const p of points) {
    svg.append(s("circle", { cx: xs(p.step), cy: ys(p.mean), r: 2.5, class: "dot" },
      s("title", null, `step ${p.step}: mean ${fmtNum(p.mean)} (min ${fmtNum(p.min)}, max ${fmtNum(p.max)}, n ${p.n})`)));
  }
  return svg;
}

// Span tree of one trace as a waterfall: rows in depth-first order, bars on one time axis.
export function waterfall(spans, onPick) {
  const byParent = new Map(), ids = new Set(spans.map((sp) => sp.span_id));
  for (const sp of spans) {
    const parent = ids.has(sp.parent_span_id) ? sp.parent_span_id : null;
    if (!byParent.has(parent)) byParent.set(parent, []);
    byParent.get(parent).push(sp);
  }
  const ordered = [];
  const walk = (parent, depth) => {
    for (const sp of (byParent.get(parent) || []).sort((a, b) => a.offset_ms - b.offset_ms)) {
      ordered.push({ ...sp, depth });
      walk(sp.span_id, depth + 1);
    }
  };
  walk(null, 0);
  const total = Math.max(...ordered.map((sp) => sp.offset_ms + (sp.duration_s || 0) * 1000), 1e-3);
  const rowH = 24, labelW = 280, width = 960, barArea = width - labelW - 90;
  const svg = s("svg", { viewBox: `0 0 ${width} ${ordered.length * rowH + 24}`, class: "chart waterfall" });
  svg.append(s("text", { x: labelW, y: 14, class: "axis" }, "0 ms"));
  svg.append(s("text", { x: labelW + barArea, y: 14, "text-anchor": "end", class: "axis" }, fmtDur(total / 1000)));
  ordered.forEach((sp, i) => {
    const y = 24 + i * rowH;
    const x = labelW + (sp.offset_ms / total) * barArea;
    const w = Math.max(2, ((sp.duration_s || 0) * 1000 / total) * barArea);
    const row = s("g", { class: `span-row${sp.state === "FAILED" ? " failed" : ""}`, "data-span": sp.span_id,
      onclick: () => onPick(sp) });
    row.append(s("rect", { x: 0, y, width, height: rowH, class: "row-bg" }));
    row.append(s("text", { x: 6 + sp.depth * 14, y: y + 16, class: "span-name" }, sp.name || sp.span_id));
    row.append(s("rect", { x, y: y + 5, width: w, height: rowH - 10, rx: 2, class: "span-bar" },
      s("title", null, `${sp.name}: ${fmtDur(sp.duration_s)} at +${fmtNum(sp.offset_ms)} ms`)));
    row.append(s("text", { x: Math.min(x + w + 4, width - 86), y: y + 16, class: "axis" }, fmtDur(sp.duration_s)));
    svg.append(row);
  });
  return svg;
}

// One task attempt's states on a time line.
export function stateTimeline(attempt) {
  const marks = ["pending_at", "submitted_at", "running_at", "finished_at", "failed_at"]
    .filter((k) => attempt[k]).map((k) => ({ state: k.replace("_at", "").toUpperCase(), t: Date.parse(attempt[k]), iso: attempt[k] }))
    .sort((a, b) => a.t - b.t);
  if (!marks.length) return h("p", { class: "muted" }, "No state times.");
  const width = 900, height = 70, left = 20, right = 20;
  const t0 = marks[0].t, t1 = marks[marks.length - 1].t;
  const xs = (t) => left + (t1 === t0 ? 0 : (t - t0) / (t1 - t0)) * (width - left - right);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart state-timeline" });
  marks.forEach((m, i) => {
    const next = marks[i + 1];
    if (next) svg.append(s("line", { x1: xs(m.t), x2: xs(next.t), y1: 30, y2: 30, stroke: STATE_COLORS[m.state] || "#999", "stroke-width": 6 }));
  });
  marks.forEach((m, i) => {
    const anchor = i === 0 ? "start" : i === marks.length - 1 ? "end" : "middle";
    svg.append(s("circle", { cx: xs(m.t), cy: 30, r: 7, fill: STATE_COLORS[m.state] || "#999" }, s("title", null, `${m.state} ${fmtTime(m.iso)}`)));
    svg.append(s("text", { x: xs(m.t), y: 14 + (i % 2) * 44, "text-anchor": anchor, class: "axis" },
      i === 0 ? m.state : `${m.state} +${fmtDur((m.t - t0) / 1000)}`));
  });
  return svg;
}
