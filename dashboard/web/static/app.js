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

function currentRoute() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [route, query] = hash.split("?");
  return { route: route || "", params: new URLSearchParams(query || "") };
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
  clear(page).append(node);
  page.dataset.route = route || "overview";
  // UTC on a 24-hour clock, as every time on the pages is
  document.getElementById("updated").textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC`;
  if (keepScroll) window.scrollTo(0, scroll);
}

async function poll() {
  let delay = 5000;
  try {
    const info = await getJSON("/api/info");
    delay = Math.max(2000, (info.refresh_s || 5) * 1000);
    const files = `${info.files} file${info.files === 1 ? "" : "s"}`;
    const where = `${info.location} · ${info.engine} · ${files} · ${fmtBytes(info.bytes)}`;
    const storeInfo = document.getElementById("store-info");
    storeInfo.textContent = where;
    storeInfo.title = where;
    // The page itself says when the store is empty: the banner does not repeat it.
    const message = info.files ? info.message : "";
    const banner = document.getElementById("banner");
    banner.hidden = !message && !info.note;
    banner.textContent = message || info.note || "";
    const auto = document.getElementById("auto-refresh").checked;
    if (version !== null && info.version !== version && auto) await render({ keepScroll: true });
    version = info.version;
  } catch (err) {
    document.getElementById("store-info").textContent = err.message;
  }
  setTimeout(poll, delay);
}

window.addEventListener("hashchange", () => render());
render();
poll();
