// Router, header status and auto-refresh. Pages live in pages.js.
import { getJSON } from "./api.js";
import { h, clear, fmtBytes } from "./dom.js";
import * as pages from "./pages.js";
import { emptyStore, isEmptyStore, isNoRayTasks, noRayTasks } from "./empty.js";
import { timeline } from "./timeline.js";

const ROUTES = {
  "": pages.overview, overview: pages.overview, groups: pages.groups, tasks: pages.tasks, task: pages.task,
  runs: pages.runs, run: pages.run, traces: pages.traces, trace: pages.trace, agents: pages.agents,
  timeline,
};
const NAV_OF = { task: "tasks", run: "runs", trace: "traces", "": "overview" };
let version = null, rendering = 0;

// Each page's parameter by the column's name too (run_id for run, task for task_id): a
// link written from a query's column must open that page, not another one's empty state.
const PARAM_ALIASES = { run_id: "run", job_id: "job", task: "task_id", trace: "trace_id" };

function currentRoute() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [route, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  for (const [alias, name] of Object.entries(PARAM_ALIASES)) {
    if (params.has(alias) && !params.has(name)) params.set(name, params.get(alias));
  }
  return { route: route || "", params };
}

async function render({ keepScroll = false } = {}) {
  const { route, params } = currentRoute();
  const page = document.getElementById("page");
  const ticket = ++rendering;
  const scroll = window.scrollY;
  const navRoute = NAV_OF[route] ?? route;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.route === navRoute);
  const view = ROUTES[route];
  let node;
  try {
    node = view ? await view(params) : h("p", { class: "error" }, `No page ${route}.`);
  } catch (err) {
    // An empty store is no error: one neutral message saying how to send data.
    node = isEmptyStore(err) ? emptyStore(err) : isNoRayTasks(err) ? noRayTasks()
      : h("div", { class: "error-box", role: "alert" }, h("b", null, "Could not load this page: "), err.message);
  }
  if (ticket !== rendering) return;  // a newer navigation won
  const kept = keepScroll ? readerState(page) : null;
  clear(page).append(node);
  if (kept) restoreReaderState(page, kept);
  page.dataset.route = route || "overview";
  // UTC on a 24-hour clock, as every time on the pages is
  document.getElementById("updated").textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC`;
  if (keepScroll) window.scrollTo(0, scroll);
}

// What the reader is in the middle of, kept across an auto-refresh (a new file every
// heartbeat would otherwise wipe a half-typed search, a step's opened ops or a picked span
// every 30 s): named inputs' text and focus, <details data-key> that are open, and the
// span picked on a trace (data-picked).
function readerState(page) {
  const active = document.activeElement;
  const focused = active && page.contains(active) && active.name ? active : null;
  return {
    inputs: [...page.querySelectorAll("input[name]")].map((el) => [el.name, el.value]),
    focus: focused && { name: focused.name, start: focused.selectionStart, end: focused.selectionEnd },
    open: [...page.querySelectorAll("details[open][data-key]")].map((el) => el.dataset.key),
    picked: [...page.querySelectorAll("[data-picked]")].map((el) => el.dataset.picked),
  };
}

function restoreReaderState(page, state) {
  const named = (name) => page.querySelector(`input[name="${CSS.escape(name)}"]`);
  for (const [name, value] of state.inputs) {
    const input = named(name);
    if (input) input.value = value;
  }
  const focus = state.focus && named(state.focus.name);
  if (focus) {
    focus.focus();
    if (state.focus.start !== null) focus.setSelectionRange(state.focus.start, state.focus.end);
  }
  for (const key of state.open) {
    const details = page.querySelector(`details[data-key="${CSS.escape(key)}"]`);
    if (details) details.open = true;
  }
  for (const span of state.picked) {
    page.querySelector(`[data-span="${CSS.escape(span)}"]`)?.dispatchEvent(new MouseEvent("click"));
  }
}

async function poll() {
  let delay = 5000;
  try {
    const info = await getJSON("/api/info");
    delay = Math.max(2000, (info.refresh_s || 5) * 1000);
    const files = `${info.files} file${info.files === 1 ? "" : "s"}`;
    const facts = `· ${info.engine} · ${files} · ${fmtBytes(info.bytes)}`;
    showStore(info.location, facts);
    // The page itself says when the store is empty: the banner does not repeat it.
    const message = info.files ? info.message : "";
    const banner = document.getElementById("banner");
    banner.hidden = !message && !info.note;
    banner.textContent = message || info.note || "";
    const auto = document.getElementById("auto-refresh").checked;
    if (version !== null && info.version !== version && auto) await render({ keepScroll: true });
    version = info.version;
  } catch (err) {
    showStore(err.message, "");
  }
  setTimeout(poll, delay);
}

// The store's location, cut at the header's edge, then its facts, which are never cut.
function showStore(where, facts) {
  document.getElementById("store-where").textContent = where;
  document.getElementById("store-facts").textContent = facts;
  document.getElementById("store-info").title = facts ? `${where} ${facts}` : where;
}

window.addEventListener("hashchange", () => render());
render();
poll();
