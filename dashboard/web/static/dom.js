// Small DOM helpers. Text always goes in through textContent, never innerHTML:
// names, error messages and stack traces come from producers and are untrusted.

const SVG_NS = "http://www.w3.org/2000/svg";

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  return node;
}

export function h(tag, attrs, ...children) {
  return append(setAttrs(document.createElement(tag), attrs), children);
}

export function s(tag, attrs, ...children) {
  return append(setAttrs(document.createElementNS(SVG_NS, tag), attrs), children);
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export function hashLink(route, params, text, attrs = {}) {
  return h("a", { href: routeHref(route, params), ...attrs }, text);
}

export function routeHref(route, params) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== "") query.set(k, v);
  }
  const text = query.toString();
  return `#/${route}${text ? "?" + text : ""}`;
}

export function fmtTime(iso) {
  if (!iso) return "";
  return iso.replace("T", " ").replace(/(\.\d{3})\d*Z$/, "$1").replace(/Z$/, "");
}

export function fmtDur(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const v = Number(seconds);
  if (v < 1e-5) return `${Number((v * 1e6).toFixed(1))} µs`;  // a data wait of 0.8 µs, not 1
  if (v < 1e-3) return `${(v * 1e6).toFixed(0)} µs`;
  if (v < 1) return `${(v * 1e3).toFixed(1)} ms`;
  if (v < 120) return `${v.toFixed(2)} s`;
  if (v < 7200) return `${(v / 60).toFixed(1)} min`;
  if (v < 172800) return `${(v / 3600).toFixed(1)} h`;
  return `${(v / 86400).toFixed(1)} d`;
}

export function fmtNum(value, digits = 3) {
  if (value === null || value === undefined) return "";
  if (Number.isInteger(value)) return value.toLocaleString("en-US");
  const v = Number(value);
  // thousands grouped, as whole numbers are: 3,931,860.6 tokens/s, not 3931860.6
  if (Math.abs(v) >= 1000) return v.toLocaleString("en-US", { maximumFractionDigits: 1 });
  // below 0.0001 always as 1.34e-6: toPrecision writes 0.00000134 down to 1e-6 and
  // 8.14e-7 below it, two ways in one column (0.000692 stays whole)
  if (v !== 0 && Math.abs(v) < 1e-4) return v.toExponential(digits - 1).replace(/\.?0+e/, "e");
  return v.toPrecision(digits).replace(/\.?0+$/, "");
}

// A metric's value: one whose name ends in _s is seconds (the tracker's data_wait_s,
// queue_s) and reads as a duration, unless it is a rate (tokens_per_s, samples_per_s);
// any other as a number.
export function isSecondsMetric(name) {
  return /_s$/.test(name) && !/per_s$/.test(name);
}

export function fmtMetric(name, value) {
  return isSecondsMetric(name) ? fmtDur(value) : fmtNum(value);
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n), i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function stateBadge(state) {
  const name = String(state || "none").toLowerCase().replace(/\*$/, "");
  return h("span", { class: `badge state-${name}` }, state || "—");
}

export function table(columns, rows, render, options = {}) {
  // columns: [{key, label, num, sort, cls, title}], render(row, col) -> node/text
  const cls = (c) => [c.num ? "num" : null, c.cls || null].filter(Boolean).join(" ") || null;
  const head = h("tr", null, columns.map((c) => h("th", { class: cls(c), "data-col": c.key, title: c.title || null },
    c.head || c.label)));
  const body = rows.map((row) => h("tr", null, columns.map((c) =>
    h("td", { class: cls(c), "data-col": c.key }, render(row, c)))));
  return h("div", { class: "grid-wrap" },
    h("table", { class: ["grid", options.class].filter(Boolean).join(" ") }, h("thead", null, head), h("tbody", null, body)));
}

export function section(title, ...children) {
  return h("section", null, h("h2", null, title), ...children);
}

// "ValueError: bad shard": the type once, though many producers (Ray among them) already
// start the message with it.
export function errorText(type, message) {
  const text = message || "";
  if (!type) return text;
  if (text === type || text.startsWith(`${type}:`)) return text;
  return text ? `${type}: ${text}` : type;
}

// A time in one compact column: the time of day to the millisecond, with the date in
// front only when it is not the day of `reference` (the newest time on the page).
export function fmtClock(iso, reference) {
  if (!iso) return "";
  const full = fmtTime(iso);
  const [day, clock] = full.split(" ");
  const refDay = reference ? fmtTime(reference).split(" ")[0] : day;
  return day === refDay ? clock : `${day.slice(5)} ${clock}`;
}

// What an empty page says: what is missing, and the commands that fill it.
export function emptyState(title, text, commands = []) {
  return h("div", { class: "empty-state", role: "status" }, h("h2", null, title), h("p", null, text),
    commands.length ? h("pre", { class: "commands" }, commands.join("\n")) : null);
}
