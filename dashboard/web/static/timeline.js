// The Ray task timeline: every attempt of a job as a bar on its worker's lane, drawn on
// one canvas (100,000 bars are 100,000 fillRect calls, not DOM nodes). Wheel zooms
// around the pointer, dragging pans, a click on a bar opens that task's page.
import { getJSON } from "./api.js";
import { h, fmtDur, fmtNum, routeHref } from "./dom.js";

const COLORS = { FINISHED: "#2e9d6a", FAILED: "#d0463b", RUNNING: "#3b6fd4" };
const OTHER = "#9aa3b3";
// A lane is tall enough to hover; the gutter is as wide as its longest label.
const ROW = 20, AXIS = 22, LABEL_FONT = "12px system-ui, sans-serif";

export async function timeline(params) {
  const session = params.get("session") || "";
  const job = params.get("job") || "";
  const [known, data] = await Promise.all([
    getJSON("/api/ray/sessions"), getJSON("/api/ray/timeline", { session, job })]);
  const form = h("form", { class: "filters", onsubmit: (e) => {
    e.preventDefault();
    const f = new FormData(e.target);
    location.hash = routeHref("timeline", { session: f.get("session"), job: f.get("job") });
  } },
  h("label", null, "Ray session ", h("select", { name: "session" },
    known.sessions.map((s) => h("option", { value: s.session, selected: s.session === data.session },
      s.session)))),
  h("label", null, " job ", h("input", { name: "job", value: job, placeholder: "every job", size: 10 })),
  h("button", { type: "submit" }, "Show"));
  const legend = h("div", { class: "legend" }, data.states.map((s) =>
    h("span", null, h("i", { style: `background:${COLORS[s] || OTHER}` }), s)));
  const info = h("p", { class: "muted", id: "timeline-count" },
    `${fmtNum(data.count)} task attempts on ${fmtNum(data.lanes.length)} workers`
    + (data.untimed ? ` (${fmtNum(data.untimed)} without times left out)` : "")
    + (data.cut_from ? ` · the first ${fmtNum(data.count)} to start of ${fmtNum(data.cut_from)}: choose a job to see all of one` : "")
    + ` · times are UTC, the job's clock: its first task started ${clockAt(data.t0_us, 0, 1).date} ${clockAt(data.t0_us, 0, 0.001).time}`
    + " · wheel to zoom, drag to pan, double-click to reset, click a bar for its task");
  const tip = h("div", { class: "timeline-tip", hidden: true });
  const canvas = h("canvas", { class: "timeline-canvas", "data-bars": "0" });
  const wrap = h("div", { class: "timeline-wrap" }, canvas, tip);
  const view = new TimelineView(canvas, tip, data);
  requestAnimationFrame(() => view.fit());
  return h("div", null, h("h1", null, "Ray task timeline"), form, info, legend, wrap);
}

class TimelineView {
  constructor(canvas, tip, data) {
    this.canvas = canvas;
    this.tip = tip;
    this.data = data;
    const bars = data.bars;
    const n = data.count;
    this.start = Float64Array.from(bars.start || []);
    this.dur = Float64Array.from(bars.dur || []);
    this.lane = Int32Array.from(bars.lane || []);
    this.state = Int32Array.from(bars.state || []);
    this.end = this.start.map((s, i) => s + this.dur[i]);
    this.span = Math.max(1, n ? Math.max(...chunkMax(this.end)) : 1);
    // Per lane, the bars in start order, for hit tests by binary search.
    this.byLane = Array.from({ length: data.lanes.length }, () => []);
    for (let i = 0; i < n; i++) this.byLane[this.lane[i]].push(i);
    for (const list of this.byLane) list.sort((a, b) => this.start[a] - this.start[b]);
    this.t0 = 0;
    this.t1 = this.span;
    this.labels = data.lanes.map(laneLabel);
    this.listen();
  }

  fit() {
    const width = Math.max(400, (this.canvas.parentElement?.clientWidth || window.innerWidth - 60));
    const height = AXIS + Math.max(1, this.data.lanes.length) * ROW + 4;
    const ratio = window.devicePixelRatio || 1;
    const measure = this.canvas.getContext("2d");
    measure.font = LABEL_FONT;
    this.gutter = Math.ceil(Math.max(60, ...this.labels.map((l) => measure.measureText(l).width))) + 12;
    this.width = width;
    this.height = height;
    this.canvas.width = width * ratio;
    this.canvas.height = height * ratio;
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${height}px`;
    this.ctx = this.canvas.getContext("2d");
    this.ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    this.draw();
  }

  x(t) { return this.gutter + (t - this.t0) / (this.t1 - this.t0) * (this.width - this.gutter); }
  t(x) { return this.t0 + (x - this.gutter) / (this.width - this.gutter) * (this.t1 - this.t0); }

  draw() {
    const { ctx, data } = this;
    ctx.clearRect(0, 0, this.width, this.height);
    ctx.fillStyle = "#f3f5f9";  // every other lane shaded, so a bar's lane is easy to follow
    for (let i = 1; i < data.lanes.length; i += 2) ctx.fillRect(0, AXIS + i * ROW, this.width, ROW);
    ctx.font = LABEL_FONT;
    ctx.fillStyle = "#4a5160";
    this.labels.forEach((label, i) => ctx.fillText(label, 4, AXIS + i * ROW + 14));
    this.canvas.dataset.gutter = String(this.gutter);
    this.canvas.dataset.rowPx = String(ROW);
    ctx.font = "11px system-ui, sans-serif";
    this.axis();
    let drawn = 0;
    // One pass per colour: a fillStyle change per bar would cost more than the bars.
    data.states.forEach((name, code) => {
      ctx.fillStyle = COLORS[name] || OTHER;
      ctx.beginPath();
      for (let i = 0; i < this.start.length; i++) {
        if (this.state[i] !== code || this.end[i] < this.t0 || this.start[i] > this.t1) continue;
        const left = Math.max(this.gutter, this.x(this.start[i]));
        const right = Math.min(this.width, this.x(this.end[i]));
        ctx.rect(left, AXIS + this.lane[i] * ROW + 2, Math.max(1, right - left), ROW - 4);
        drawn++;
      }
      ctx.fill();
    });
    this.canvas.dataset.bars = String(drawn);
  }

  axis() {
    const { ctx } = this;
    ctx.strokeStyle = "#dde1e8";
    ctx.fillStyle = "#6b7385";
    const step = niceStep((this.t1 - this.t0) / 8);
    let labelsEnd = 0, flipped = 0;
    const shown = [], ticks = [];
    // Ticks on whole steps of UTC (the one labelled 04:33:26 is that second), not whole
    // steps from the job's first bar, which starts at some fraction of a second.
    const stepUs = Math.round(step * 1000);
    const phase = stepUs >= 1 ? (this.data.t0_us % stepUs) / 1000 : 0;
    for (let t = Math.ceil((this.t0 + phase) / step) * step - phase; t <= this.t1; t += step) {
      const x = this.x(t);
      ticks.push(Math.round(this.data.t0_us + t * 1000));
      ctx.beginPath();
      ctx.moveTo(x, AXIS - 4);
      ctx.lineTo(x, this.height);
      ctx.stroke();
      const label = clockAt(this.data.t0_us, t, step).time;
      shown.push(label);
      // A tick near the right edge puts its label on the left of its line, not past the edge.
      const labelWidth = ctx.measureText(label).width;
      const fits = x + 2 + labelWidth <= this.width;
      ctx.textAlign = fits ? "left" : "right";
      flipped += fits ? 0 : 1;
      ctx.fillText(label, fits ? x + 2 : x - 2, 12);
      labelsEnd = Math.max(labelsEnd, fits ? x + 2 + labelWidth : x - 2);
    }
    ctx.textAlign = "left";
    this.canvas.dataset.axisLabelsEnd = String(Math.ceil(labelsEnd));
    this.canvas.dataset.axisLabelsFlipped = String(flipped);
    this.canvas.dataset.axisLabels = shown.join(" ");
    this.canvas.dataset.axisTicksUs = ticks.join(" ");
    this.canvas.dataset.axisStepUs = String(stepUs);
  }

  hit(event) {
    const rect = this.canvas.getBoundingClientRect();
    const x = event.clientX - rect.left, y = event.clientY - rect.top;
    const laneIndex = this.laneAt(y);
    if (x < this.gutter || laneIndex < 0) return -1;
    const t = this.t(x), slack = (this.t1 - this.t0) / (this.width - this.gutter) * 2;
    const list = this.byLane[laneIndex];
    let lo = 0, hi = list.length;
    while (lo < hi) {  // the last bar starting before t + slack
      const mid = (lo + hi) >> 1;
      if (this.start[list[mid]] <= t + slack) lo = mid + 1; else hi = mid;
    }
    for (let k = lo - 1; k >= 0 && k >= lo - 50; k--) {
      const i = list[k];
      if (this.end[i] >= t - slack) return i;
    }
    return -1;
  }

  laneAt(y) {
    const index = Math.floor((y - AXIS) / ROW);
    return index >= 0 && index < this.byLane.length ? index : -1;
  }

  listen() {
    const c = this.canvas;
    c.addEventListener("wheel", (e) => {
      e.preventDefault();
      const rect = c.getBoundingClientRect();
      const at = this.t(e.clientX - rect.left);
      const factor = e.deltaY < 0 ? 0.8 : 1.25;
      this.t0 = at - (at - this.t0) * factor;
      this.t1 = at + (this.t1 - at) * factor;
      this.draw();
    }, { passive: false });
    let drag = null;
    c.addEventListener("mousedown", (e) => { drag = { x: e.clientX, t0: this.t0, t1: this.t1, moved: false }; });
    window.addEventListener("mouseup", () => { setTimeout(() => { drag = null; }, 0); });
    c.addEventListener("mousemove", (e) => {
      if (drag && e.buttons) {
        const dt = (e.clientX - drag.x) / (this.width - this.gutter) * (drag.t1 - drag.t0);
        if (Math.abs(e.clientX - drag.x) > 3) drag.moved = true;
        this.t0 = drag.t0 - dt;
        this.t1 = drag.t1 - dt;
        this.draw();
        return;
      }
      this.showTip(e);
    });
    c.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    c.addEventListener("dblclick", () => { this.t0 = 0; this.t1 = this.span; this.draw(); });
    c.addEventListener("click", (e) => {
      if (drag && drag.moved) return;
      const i = this.hit(e);
      if (i < 0) return;
      const bars = this.data.bars;
      location.hash = routeHref("task", { task_id: bars.task_id[i], attempt: bars.attempt[i],
        session: this.data.session });
    });
  }

  showTip(e) {
    const rect = this.canvas.getBoundingClientRect();
    const i = this.hit(e);
    // Over a lane's label: the node and worker in full.
    const lane = i < 0 && e.clientX - rect.left < this.gutter ? this.laneAt(e.clientY - rect.top) : -1;
    this.tip.hidden = i < 0 && lane < 0;
    this.canvas.style.cursor = i < 0 ? "default" : "pointer";
    if (i < 0 && lane < 0) return;
    const bars = this.data.bars;
    this.tip.textContent = i < 0 ? laneTip(this.data.lanes[lane])
      : `${this.data.names[bars.name[i]]} · ${this.data.states[this.state[i]]}`
      + ` · ${fmtDur(this.dur[i] / 1000)} · ${bars.task_id[i]} attempt ${bars.attempt[i]}`;
    this.tip.style.left = `${e.clientX - rect.left + 12}px`;
    this.tip.style.top = `${e.clientY - rect.top + 12}px`;
  }
}

// A lane by the node's ip and the worker's pid, as `ray list workers` shows them; the ids
// (cut) only where Ray never said the ip or the pid.
function laneLabel(lane) {
  const node = lane.ip || `node ${lane.node_id.slice(0, 8)}…`;
  const worker = lane.pid !== null && lane.pid !== undefined ? `pid ${lane.pid}` : `worker ${lane.worker_id.slice(0, 8)}…`;
  return `${node} · ${worker}`;
}

function laneTip(lane) {
  return `node ${lane.node_id}${lane.ip ? ` (${lane.ip})` : ""} · worker ${lane.worker_id}`
    + `${lane.pid !== null && lane.pid !== undefined ? ` (pid ${lane.pid})` : ""}`;
}

// The time of day (UTC) `ms` after the job's first bar (t0_us), with as many decimals as
// a tick `stepMs` apart needs, and the date.
function clockAt(t0us, ms, stepMs) {
  const us = Math.round(t0us + ms * 1000);  // a tick's sum may fall a hair short
  const iso = new Date(Math.floor(us / 1000)).toISOString();
  const digits = stepMs >= 1000 ? 0 : stepMs >= 1 ? 3 : 6;
  const micro = String(Math.floor(((us % 1e6) + 1e6) % 1e6)).padStart(6, "0");
  const time = iso.slice(11, 19) + (digits ? `.${micro.slice(0, digits)}` : "");
  return { date: iso.slice(0, 10), time };
}

function chunkMax(values) {  // Math.max(...hugeArray) overflows the stack
  const out = [];
  for (let i = 0; i < values.length; i += 50000) out.push(Math.max(...values.subarray(i, i + 50000)));
  return out;
}

function niceStep(raw) {
  const p = 10 ** Math.floor(Math.log10(Math.max(raw, 1e-6)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}
