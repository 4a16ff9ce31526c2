// A span's events and links, which evagg stores as JSON text in the attributes
// `otel.events` and `otel.links` (docs/opentelemetry.md, "The span row"): shown as
// Jaeger shows them, events at their offset into the span, links leading to their trace.
import { h, hashLink, fmtDur } from "./dom.js";

const EVENTS = "otel.events";
const LINKS = "otel.links";
const LINK_ID = /^([0-9a-f]{32})-([0-9a-f]{16})$/;

// JSON text's list, or null where it is not one (a list cut at the value limit no
// longer parses: it then stays an attribute, as `evagg export-traces` leaves it).
function storedList(text) {
  try {
    const value = JSON.parse(text);
    return Array.isArray(value) ? value : null;
  } catch (err) {
    return null;
  }
}

// Nanoseconds since the epoch of an ISO time with microseconds, as the API sends
// start_at: Date.parse stops at milliseconds.
function isoNs(iso) {
  const micros = /\.\d{3}(\d{1,3})/.exec(iso || "");
  return Date.parse(iso) * 1e6 + (micros ? Number(micros[1].padEnd(3, "0")) * 1e3 : 0);
}

function keyValues(attributes) {
  return Object.entries(attributes || {}).map(([k, v]) => `${k}=${v}`).join("  ");
}

function eventsPart(events, startAt) {
  const start = isoNs(startAt);
  const rows = events.map((ev) => h("tr", { class: "span-event" },
    h("td", { class: "num" }, `+${fmtDur(Math.max(0, (Number(ev.time_unix_nano) - start) / 1e9))}`),
    h("td", null, String(ev.name ?? "")), h("td", { class: "mono" }, keyValues(ev.attributes))));
  return h("details", { open: true, class: "span-events" }, h("summary", null, `events (${events.length})`),
    h("table", null, h("tbody", null, rows)));
}

function linksPart(links) {
  const rows = links.map((link) => {
    const id = typeof link === "string" ? link : link.id;
    const found = LINK_ID.exec(id || "");
    const target = found ? hashLink("trace", { trace_id: found[1] }, found[1], { class: "mono" }) : String(id);
    return h("tr", { class: "span-link" }, h("td", null, target),
      h("td", { class: "mono" }, found ? found[2] : ""), h("td", { class: "mono" }, keyValues(link.attributes)));
  });
  return h("details", { open: true, class: "span-links" }, h("summary", null, `links (${links.length})`),
    h("table", null, h("tbody", null, rows)));
}

// The span's events and links as their own parts, and its attributes less those two
// where they read: [parts, remaining attribute entries].
export function spanParts(span) {
  const attrs = { ...(span.attrs || {}) };
  const parts = [];
  const events = attrs[EVENTS] ? storedList(attrs[EVENTS]) : null;
  if (events) {
    parts.push(eventsPart(events, span.start_at));
    delete attrs[EVENTS];
  }
  const links = attrs[LINKS] ? storedList(attrs[LINKS]) : null;
  if (links) {
    parts.push(linksPart(links));
    delete attrs[LINKS];
  }
  return [parts, Object.entries(attrs).sort(([a], [b]) => a.localeCompare(b))];
}
