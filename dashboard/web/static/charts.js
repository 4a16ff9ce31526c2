// Charts drawn as inline SVG: no library, nothing fetched from elsewhere.
import { h, s, fmtDur, fmtNum, fmtMetric, fmtTime } from "./dom.js";

export const STATE_COLORS = {
  PENDING: "#b0b7c3", SUBMITTED: "#8fa3bf", RUNNING: "#3b6fd4", FINISHED: "#3aa27a", FAILED: "#d14b4b",
};

// Each kind keeps its colour from page to page and hour to hour, whichever kinds are
// beside it: the known kinds have one each, any other kind takes one from its name.
const KIND_COLORS = {
  task: "#3b6fd4", op: "#e07b39", span: "#3aa27a", worker: "#b5527b", agent: "#7a7a7a",
  loss: "#d14b4b", actor: "#8a6fd1", job: "#c9a227", node: "#4bb0c8", ray: "#5b8c3a",
};
const OTHER_KIND_COLORS = ["#a0522d", "#2f7f8f", "#e68fac", "#556b8d", "#9c8a4a", "#6b3fa0"];

export function colorOf(key) {
  if (Object.hasOwn(KIND_COLORS, key)) return KIND_COLORS[key];  // not "constructor" & co.
  let hash = 0;
  for (const c of String(key)) hash = (hash * 31 + c.codePointAt(0)) >>> 0;
  return OTHER_KIND_COLORS[hash % OTHER_KIND_COLORS.length];
}

// Events over time: one stacked bar per bucket, one colour per kind, on a log scale so
// that one burst does not flatten every other bucket: a bar's height is log10(1 + total),
// split between its kinds in proportion to their counts.
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
  const ceiling = 10 ** Math.max(1, Math.ceil(Math.log10(Math.max(...totals, 1))));
  const plotW = width - left - 8, plotH = height - top - bottom, barW = Math.max(1, plotW / slots);
  const yOf = (n) => (Math.log10(1 + n) / Math.log10(1 + ceiling)) * plotH;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart timeline log-scale", role: "img",
    "aria-label": "events over time, log scale" });
  for (let tick = 1; tick <= ceiling; tick *= 10) {
    const y = top + plotH - yOf(tick);
    svg.append(s("line", { x1: left, x2: width - 8, y1: y, y2: y, stroke: "#edf0f4" }));
    svg.append(s("text", { x: left - 6, y: y + 3, "text-anchor": "end", class: "axis y-tick" }, fmtNum(tick)));
  }
  svg.append(s("text", { x: left - 6, y: top + plotH, "text-anchor": "end", class: "axis" }, "0"));
  svg.append(s("line", { x1: left, x2: width - 8, y1: top + plotH, y2: top + plotH, class: "axis-line" }));
  times.forEach((t, index) => {
    const slot = Math.round((Date.parse(t) - first) / (bucketS * 1000));
    const total = totals[index], barH = yOf(total);
    let y = top + plotH;
    for (const kind of kinds) {
      const n = buckets.get(t)[kind] || 0;
      if (!n) continue;
      const partH = (n / total) * barH;
      y -= partH;
      svg.append(s("rect", { x: left + slot * barW, y, width: Math.max(1, barW - 1), height: partH,
        fill: colorOf(kind), class: "bar" }, s("title", null, `${fmtTime(t)} ${kind}: ${fmtNum(n)} (of ${fmtNum(total)})`)));
    }
  });
  svg.append(s("text", { x: left, y: height - 6, class: "axis" }, fmtTime(times[0])));
  svg.append(s("text", { x: width - 8, y: height - 6, "text-anchor": "end", class: "axis" },
    fmtTime(times[times.length - 1])));
  const legend = h("div", { class: "legend" }, kinds.map((k) =>
    h("span", null, h("i", { style: `background:${colorOf(k)}` }), k)));
  return h("div", null, svg, legend);
}

// Duration distribution of one row: quarter-decade bins from 1 µs (the SQL's duration_bin:
// bin b holds [10^(b/4-6), 10^((b+1)/4-6)) s, bin 0 also anything shorter, the last also
// anything longer), with an axis at each decade and p50, p90 and p99 marked. Every row of
// a table shares one range of bins (histRange), so rows compare at a glance.
export const HIST_BINS = 40;
const HIST_W = 300, HIST_H = 80, HIST_TOP = 14, HIST_AXIS = 16;
const binEdge = (b) => 10 ** (b / 4 - 6);
const binOf = (seconds) => Math.min(HIST_BINS, Math.max(0, (Math.log10(Math.max(Number(seconds), 1e-6)) + 6) * 4));

function binLabel(b) {
  if (b <= 0) return `under ${fmtDur(binEdge(1))}`;
  if (b >= HIST_BINS - 1) return `${fmtDur(binEdge(HIST_BINS - 1))} or longer`;
  return `${fmtDur(binEdge(b))}–${fmtDur(binEdge(b + 1))}`;
}

// A decade's label, within a few percent of it: 100 s stays "100 s" (as "2 min" it put
// a 61 s quantile next to two minutes), 10^4 s reads "2.8 h".
function tickLabel(seconds) {
  if (seconds < 1e-3) return `${Math.round(seconds * 1e6)} µs`;
  if (seconds < 1) return `${Math.round(seconds * 1e3)} ms`;
  if (seconds < 1000) return `${Math.round(seconds)} s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  return `${Number((seconds / 3600).toPrecision(2))} h`;
}

// The bins every histogram of `rows` shows: those holding a duration or a quantile, one
// more on each side, and at least 12 (three decades).
export function histRange(rows) {
  let lo = HIST_BINS, hi = -1;
  for (const row of rows) {
    for (const [bin, n] of Object.entries(row.duration_bins || {})) {
      if (Number(n) > 0) { lo = Math.min(lo, Number(bin)); hi = Math.max(hi, Number(bin)); }
    }
  }
  if (hi < 0) return { lo: 0, hi: HIST_BINS - 1 };
  lo = Math.max(0, lo - 1); hi = Math.min(HIST_BINS - 1, hi + 1);
  while (hi - lo + 1 < 12) {
    if (lo > 0) lo -= 1;
    if (hi - lo + 1 < 12 && hi < HIST_BINS - 1) hi += 1;
  }
  return { lo, hi };
}

// Where the quantile labels go: over their lines where there is room, else pushed apart
// (rightwards, and back leftwards from the edge), so that none lies on another.
const QUANTILE_LABEL_GAP = 24, QUANTILE_LABEL_MARGIN = 11;  // "p99" at 9 px is about 16 px wide
function labelCenters(xs) {
  const centers = [];
  for (const x of xs) centers.push(Math.max(x, QUANTILE_LABEL_MARGIN, (centers.at(-1) ?? -Infinity) + QUANTILE_LABEL_GAP));
  for (let i = centers.length - 1; i >= 0; i--) {
    const limit = i === centers.length - 1 ? HIST_W - QUANTILE_LABEL_MARGIN : centers[i + 1] - QUANTILE_LABEL_GAP;
    centers[i] = Math.min(centers[i], limit);
  }
  return centers;
}

export function histogram(bins, row, range = { lo: 0, hi: HIST_BINS - 1 }) {
  const { lo, hi } = range, count = hi - lo + 1;
  const plotH = HIST_H - HIST_TOP - HIST_AXIS, bw = HIST_W / count;
  const xOf = (binPosition) => Math.min(HIST_W, Math.max(0, (binPosition - lo) * bw));
  const counts = Array.from({ length: count }, (_, i) => Number((bins || {})[lo + i] || 0));
  const peak = Math.max(...counts, 1);
  const svg = s("svg", { viewBox: `0 0 ${HIST_W} ${HIST_H}`, width: HIST_W, height: HIST_H, class: "histogram",
    role: "img", "aria-label": "durations, log scale" });
  svg.append(s("rect", { x: 0, y: HIST_TOP, width: HIST_W, height: plotH, class: "hist-bg" }));
  counts.forEach((n, i) => {
    if (!n) return;
    const barH = Math.max(1.5, (n / peak) * (plotH - 2));
    svg.append(s("rect", { x: i * bw + 0.5, y: HIST_TOP + plotH - barH, width: Math.max(1, bw - 1), height: barH,
      class: "hist-bar", "data-bin": lo + i }, s("title", null, `${fmtNum(n)} ${n === 1 ? "task" : "tasks"} ${binLabel(lo + i)}`)));
  });
  const axisY = HIST_TOP + plotH;
  svg.append(s("line", { x1: 0, x2: HIST_W, y1: axisY, y2: axisY, stroke: "#9aa3b2" }));
  const every = 4 * bw >= 44 ? 1 : 4 * bw >= 22 ? 2 : 3;  // label every decade that fits
  for (let decade = Math.ceil(lo / 4) * 4; decade <= hi + 1; decade += 4) {
    const x = xOf(decade);
    svg.append(s("line", { x1: x, x2: x, y1: axisY, y2: axisY + 3, stroke: "#9aa3b2" }));
    if ((decade / 4) % every !== 0) continue;
    const anchor = x < 12 ? "start" : x > HIST_W - 12 ? "end" : "middle";
    svg.append(s("text", { x, y: axisY + 13, "text-anchor": anchor, "font-size": 10, fill: "#6b7385",
      class: "hist-tick" }, tickLabel(binEdge(decade))));
  }
  const marks = [["p50_s", "q50", "p50"], ["p90_s", "q90", "p90"], ["p99_s", "q99", "p99"]]
    .filter(([key]) => row[key] !== null && row[key] !== undefined)
    .map(([key, cls, name]) => ({ key, cls, name, x: xOf(binOf(row[key])) }));
  const centers = labelCenters(marks.map((m) => m.x));
  marks.forEach(({ key, cls, name, x }, i) => {
    svg.append(s("line", { x1: x, x2: x, y1: HIST_TOP - 2, y2: axisY, class: `quantile ${cls}` },
      s("title", null, `${name}: ${fmtDur(row[key])}`)));
    svg.append(s("text", { x: centers[i], y: HIST_TOP - 4, "text-anchor": "middle", "font-size": 9,
      class: `quantile-label ${cls}` }, name));
  });
  return svg;
}

// One metric over steps: the mean as a line, min..max as a band; a red mark at each step
// where the metric was NaN or infinite (those values are never drawn as numbers). The
// left margin is as wide as the y labels (0.000692 whole, not .000692); a metric that
// never changed is labelled once, on its line.
const AXIS_CHAR_PX = 6.2;  // 10 px system-ui digits are under 6 px wide
export function metricChart(metric, points, nanSteps = [], format = null) {
  const steps = points.map((p) => p.step).concat(nanSteps);
  const lo = points.length ? Math.min(...points.map((p) => p.min)) : 0;
  const hi = points.length ? Math.max(...points.map((p) => p.max)) : 0;
  const fmt = format || ((v) => fmtMetric(metric, v));
  const hiText = fmt(hi), loText = fmt(lo);
  const width = 420, height = 170, right = 10, top = 22, bottom = 24;
  const left = Math.max(50, Math.ceil(12 + AXIS_CHAR_PX * Math.max(hiText.length, loText.length)));
  const x0 = Math.min(...steps), x1 = Math.max(...steps);
  const xs = (step) => left + (x1 === x0 ? 0.5 : (step - x0) / (x1 - x0)) * (width - left - right);
  const ys = (v) => top + (hi === lo ? 0.5 : 1 - (v - lo) / (hi - lo)) * (height - top - bottom);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart metric", role: "img",
    "aria-label": `${metric} over steps` });
  svg.append(s("text", { x: left, y: 14, class: "chart-title" }, metric));
  if (!points.length) {
    // NaN or infinite at every step (a loss that diverged from the start): there is no
    // value to put on the axis; a "0" there read as a loss of 0 at every step
    svg.append(s("text", { x: (left + width - right) / 2, y: (top + height - bottom) / 2 + 4,
      "text-anchor": "middle", class: "axis no-finite" }, "no finite value at any step"));
  } else if (hi === lo) {
    svg.append(s("g", { class: "constant" }, s("title", null, `${metric} was ${hiText} at every step`),
      s("text", { x: left - 6, y: ys(lo) + 3, "text-anchor": "end", class: "axis y-label" }, hiText)));
  } else {
    svg.append(s("text", { x: left - 6, y: top + 8, "text-anchor": "end", class: "axis y-label" }, hiText));
    svg.append(s("text", { x: left - 6, y: height - bottom, "text-anchor": "end", class: "axis y-label" }, loText));
  }
  svg.append(s("text", { x: left, y: height - 6, class: "axis" }, `step ${x0}`));
  svg.append(s("text", { x: width - right, y: height - 6, "text-anchor": "end", class: "axis" }, `step ${x1}`));
  const band = points.map((p) => `${xs(p.step)},${ys(p.max)}`)
    .concat([...points].reverse().map((p) => `${xs(p.step)},${ys(p.min)}`)).join(" ");
  svg.append(s("polygon", { points: band, class: "band" }));
  svg.append(s("polyline", { points: points.map((p) => `${xs(p.step)},${ys(p.mean)}`).join(" "), class: "line" }));
  for (const p of points) {
    svg.append(s("circle", { cx: xs(p.step), cy: ys(p.mean), r: 2.5, class: "dot" },
      s("title", null, `step ${p.step}: mean ${fmt(p.mean)} (min ${fmt(p.min)}, max ${fmt(p.max)}, n ${p.n})`)));
  }
  for (const step of nanSteps) {
    const x = xs(step);
    svg.append(s("g", { class: "nan-mark", "data-step": step },
      s("line", { x1: x, x2: x, y1: top, y2: height - bottom, stroke: "#d14b4b", "stroke-dasharray": "3 2" }),
      // beside its line, under the title (above the plot it lay on the title at the first
      // step, and half outside the chart at the last)
      s("text", { x: x > width - right - 30 ? x - 3 : x + 3, y: top + 10,
        "text-anchor": x > width - right - 30 ? "end" : "start", "font-size": 10, fill: "#d14b4b" }, "NaN"),
      s("title", null, `step ${step}: ${metric} was NaN or infinite`)));
  }
  return svg;
}

// Span tree of one trace as a waterfall: rows in depth-first order, bars on one time axis.
const LABEL_CHAR_PX = 7;  // a span name's characters at the label's 12 px

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
  // as wide as the page (the docs' promise: a wide screen shows more, not a margin)
  const width = Math.max(960, (document.documentElement.clientWidth || 1280) - 40);
  const rowH = 24, labelW = 280, barArea = width - labelW - 90;
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
    // a step's spans say which step (300 train_step rows alike told nothing); a name
    // longer than the label column is cut, whole in the bar's tooltip
    const label = `${sp.name || sp.span_id}${sp.step !== null && sp.step !== undefined ? ` ${sp.step}` : ""}`;
    const room = Math.max(8, Math.floor((labelW - 12 - sp.depth * 14) / LABEL_CHAR_PX));
    row.append(s("text", { x: 6 + sp.depth * 14, y: y + 16, class: "span-name" },
      label.length > room ? `${label.slice(0, room - 1)}…` : label));
    row.append(s("rect", { x, y: y + 5, width: w, height: rowH - 10, rx: 2, class: "span-bar" },
      s("title", null, `${sp.name}: ${fmtDur(sp.duration_s)} at +${fmtNum(sp.offset_ms)} ms`)));
    row.append(s("text", { x: Math.min(x + w + 4, width - 86), y: y + 16, class: "axis" }, fmtDur(sp.duration_s)));
    svg.append(row);
  });
  return svg;
}

// One task attempt's states on a time line. States at the same time share one label
// ("PENDING · SUBMITTED"); labels go in rows under the line, each in the first row where
// it clears the labels before it, so no two ever overlap.
const LABEL_FONT = 11, LABEL_GAP = 10, ROW_H = 15;
let measureContext = null;
function textWidth(text) {
  measureContext = measureContext || document.createElement("canvas").getContext("2d");
  measureContext.font = `${LABEL_FONT}px system-ui, -apple-system, "Segoe UI", sans-serif`;
  return measureContext.measureText(text).width * 1.1 + 2;  // a margin for font differences
}

// An ISO time in microseconds since the epoch (Date keeps only milliseconds, and states
// a few microseconds apart are common).
function isoMicros(iso) {
  const fraction = (iso.match(/\.(\d+)/) || [, ""])[1];
  return Date.parse(iso) * 1000 + Number((fraction + "000000").slice(3, 6));
}

export function stateTimeline(attempt) {
  const marks = ["pending_at", "submitted_at", "running_at", "finished_at", "failed_at"]
    .filter((k) => attempt[k]).map((k) => ({ state: k.replace("_at", "").toUpperCase(), t: isoMicros(attempt[k]), iso: attempt[k] }))
    .sort((a, b) => a.t - b.t);
  if (!marks.length) return h("p", { class: "muted" }, "No state times.");
  const width = 900, left = 20, right = 20, lineY = 22;
  const t0 = marks[0].t, t1 = marks[marks.length - 1].t;
  const xs = (t) => left + (t1 === t0 ? 0 : (t - t0) / (t1 - t0)) * (width - left - right);
  const groups = [];
  for (const m of marks) {
    const last = groups[groups.length - 1];
    if (last && last.t === m.t) last.states.push(m.state);
    else groups.push({ t: m.t, states: [m.state] });
  }
  const rowEnds = [];
  const labels = groups.map((g, i) => {
    const text = g.states.join(" · ") + (i === 0 ? "" : ` +${fmtDur((g.t - t0) / 1e6)}`);
    const w = textWidth(text);
    const x = Math.min(width - right - w, Math.max(left, xs(g.t) - w / 2));
    let row = rowEnds.findIndex((end) => end + LABEL_GAP <= x);
    if (row < 0) { row = rowEnds.length; rowEnds.push(0); }
    rowEnds[row] = x + w;
    return { text, x, row };
  });
  const height = lineY + 20 + rowEnds.length * ROW_H;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart state-timeline" });
  marks.forEach((m, i) => {
    const next = marks[i + 1];
    if (next) svg.append(s("line", { x1: xs(m.t), x2: xs(next.t), y1: lineY, y2: lineY, stroke: STATE_COLORS[m.state] || "#999", "stroke-width": 6 }));
  });
  for (const m of marks) {
    svg.append(s("circle", { cx: xs(m.t), cy: lineY, r: 7, fill: STATE_COLORS[m.state] || "#999" }, s("title", null, `${m.state} ${fmtTime(m.iso)}`)));
  }
  for (const label of labels) {
    svg.append(s("text", { x: label.x, y: lineY + 24 + label.row * ROW_H, "font-size": LABEL_FONT,
      fill: "#4a5160", class: "state-label" }, label.text));
  }
  return svg;
}
