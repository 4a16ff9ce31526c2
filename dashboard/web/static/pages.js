// The pages. Each takes the route's parameters and returns a DOM node to show.
import { getJSON } from "./api.js";
import { h, hashLink, routeHref, fmtTime, fmtDur, fmtNum, fmtMetric, fmtBytes, stateBadge, table, section, errorText,
  fmtClock } from "./dom.js";
import { noAgents, noRuns, noTasks, noTraces } from "./empty.js";
import { attemptLogs } from "./logs.js";
import { runArtifacts } from "./artifacts.js";
import { spanParts } from "./spanparts.js";
import { timelineChart, histogram, histRange, metricChart, waterfall, stateTimeline, STATE_COLORS } from "./charts.js";

const STATES = ["PENDING", "SUBMITTED", "RUNNING", "FINISHED", "FAILED"];
// `error_type` groups by the exception class where Ray parsed one (ValueError), else by
// the error type (docs/dashboard.md); the dimension keeps its name for old links.
const DIMENSIONS = { name: "Function name", error_type: "Error", job: "Job", node: "Node", state: "State" };
const FILTER_OF = { name: "name", error_type: "error_type", job: "job", node: "node", state: "state" };
const NO_VALUE = "(none)";  // a filter's value for "without this field" (dashboard/questions/filters.py)

function countLink(filters, n, label) {
  if (!n) return h("span", { class: "muted" }, "0");
  return hashLink("tasks", filters, fmtNum(n), { class: "count-link", title: label || "show these tasks" });
}

function plainCount(n) {
  return n ? h("span", { class: "count-plain" }, fmtNum(n)) : h("span", { class: "muted" }, "0");
}

// -- overview ------------------------------------------------------------------------

export async function overview() {
  const [data, errors] = await Promise.all([
    getJSON("/api/overview"), getJSON("/api/aggregate", { by: "error_type", limit: 50 })]);
  const failed = (data.states.find((s) => s.state === "FAILED") || {}).tasks || 0;
  const failedOps = h("span", { id: "failed-ops" }, "…"), ofOps = h("span", null, "counting ops");
  // Counting ops scans their events: the card fills in when that answer comes.
  getJSON("/api/op_counts").then((ops) => {
    failedOps.textContent = fmtNum(ops.failed);
    failedOps.classList.toggle("error-text", ops.failed > 0);
    ofOps.replaceChildren(ops.ops ? hashLink("runs", {}, `of ${fmtNum(ops.ops)} ops`) : "no training ops");
  }).catch((err) => { ofOps.textContent = err.message; });
  const cards = h("div", { class: "cards" },
    card("Tasks", fmtNum(data.tasks), h("span", null, hashLink("tasks", {}, "all tasks"), driversNote(data.drivers))),
    card("Failed", fmtNum(failed), failed ? hashLink("tasks", { state: "FAILED" }, "failed tasks")
      : h("span", { class: "muted" }, "none")),
    card("Failed ops", failedOps, ofOps),
    card("Events", fmtNum(data.events), `${data.kinds.length} kinds`));
  const states = h("div", { class: "state-counts" }, data.states.map((s) =>
    h("a", { href: routeHref("tasks", { state: s.state }), class: "state-chip", "data-state": s.state },
      h("i", { style: `background:${STATE_COLORS[s.state] || "#999"}` }), s.state || "?", h("b", null, fmtNum(s.tasks)))));
  const kinds = h("p", { class: "muted" }, data.kinds.map((k) => `${k.kind}: ${fmtNum(k.events)}`).join(" · "),
    data.ahead_of_now ? h("span", { class: "error-text", id: "ahead-of-now" },
      ` · ${fmtNum(data.ahead_of_now)} ${data.ahead_of_now === 1 ? "event" : "events"} stamped more than a day after now ${data.ahead_of_now === 1 ? "is" : "are"} not charted: a producer's clock, or the time it sends, is wrong (evagg query sql "SELECT host, pid, source, max(time) FROM events WHERE time > now() + INTERVAL 1 DAY GROUP BY ALL")`) : null);
  return h("div", null, cards,
    section("Tasks by state", states),
    section(`Events over time (${fmtDur(data.bucket_s)} buckets, log scale)`, timelineChart(data.timeline, data.bucket_s), kinds),
    section("Failures by error", errors.rows.length ? groupTable("error_type", errors.rows, errors.no_value)
      : h("p", { class: "muted" }, data.tasks ? "No failed tasks." : "No tasks yet.")));
}

// Counted as Ray counts, Ray's driver tasks are left out of the numbers; say where they are.
function driversNote(drivers) {
  if (!drivers) return null;
  return h("span", { class: "drivers-note", title: "Ray's summary leaves its driver tasks out too; the task table lists them" },
    ` · ${fmtNum(drivers)} Ray driver${drivers === 1 ? "" : "s"} not counted`);
}

function card(title, value, foot) {
  return h("div", { class: "card" }, h("div", { class: "card-title" }, title),
    h("div", { class: "card-value" }, value), h("div", { class: "card-foot" }, foot));
}

// -- aggregated views ----------------------------------------------------------------

export async function groups(params) {
  const by = params.get("by") || "name";
  const data = await getJSON("/api/aggregate", { by });
  const tabs = h("div", { class: "tabs" }, Object.entries(DIMENSIONS).map(([key, label]) =>
    hashLink("groups", { by: key }, label, { class: key === by ? "active" : null })));
  return h("div", null, tabs, section(`Tasks by ${DIMENSIONS[by] || by}`,
    data.rows.length ? groupTable(by, data.rows, data.no_value) : noTasks()));
}

// noValue: what the group without a value holds, as the API names it
function groupTable(by, rows, noValue) {
  const key = FILTER_OF[by];
  const range = histRange(rows);
  // Tasks in no state of STATES (a producer's own state, shown UNKNOWN) get a column of
  // their own where there are any, so that a row's states add up to its tasks.
  const otherOf = (row) => row.tasks - STATES.reduce((n, st) => n + (row[st.toLowerCase()] || 0), 0);
  const others = rows.some((row) => otherOf(row) > 0);
  // A state no row of this table holds is no column (the error groups hold failures
  // only: four columns of 0 pushed the durations off a 1280 px page).
  const held = STATES.filter((st) => rows.some((row) => (row[st.toLowerCase()] || 0) > 0));
  const columns = [
    { key: "value", label: DIMENSIONS[by] || by, cls: "clip name" },
    { key: "tasks", label: "tasks", num: true },
    ...held.map((st) => ({ key: st.toLowerCase(), label: st.toLowerCase(), num: true, state: st })),
    ...(others ? [{ key: "other", label: "other", num: true, head: h("span", { title: "in a state of their own (UNKNOWN in the task table)" }, "other") }] : []),
    { key: "hist", label: "durations (log scale)" },
    { key: "p50_s", label: "p50", num: true }, { key: "p90_s", label: "p90", num: true },
    { key: "p99_s", label: "p99", num: true }, { key: "max_s", label: "max", num: true },
  ];
  return table(columns, rows, (row, c) => {
    // The (none) row's tasks are those without the field, which the filter value
    // "(none)" asks for (docs/queries.md); the error groups hold failures only.
    const none = row.value === null;
    const base = none ? { [key]: NO_VALUE, ...(by === "error_type" ? { state: "FAILED" } : {}) }
      : { [key]: row.value };
    if (c.key === "value") return none ? h("span", { class: "muted" }, noValue) : groupLabel(row.value);
    if (c.key === "tasks") return countLink(base, row.tasks);
    if (c.key === "other") return plainCount(otherOf(row));
    if (c.state) return countLink({ ...base, state: c.state }, row[c.key], `${c.state} tasks`);
    if (c.key === "hist") {
      return Object.values(row.duration_bins || {}).some((n) => Number(n) > 0) ? histogram(row.duration_bins, row, range)
        : h("span", { class: "muted no-durations" }, "no durations: none of these reported a start and an end");
    }
    return fmtDur(row[c.key]);
  }, { class: by === "job" ? "groups jobs" : "groups" });
}

// A Ray job's group is job@session (dashboard/sql/keys.sql): the session goes on a line
// of its own, as a clipped line would cut off what tells two clusters' jobs apart.
function groupLabel(value) {
  const at = value.lastIndexOf("@session_");
  if (at < 0) return h("span", { title: value }, value);
  const [job, session] = [value.slice(0, at), value.slice(at + 1)];
  return h("span", { title: value }, job, " ",
    hashLink("timeline", { job, session }, "timeline", { class: "group-timeline", title: `job ${job}'s Ray timeline` }),
    h("span", { class: "muted group-session" }, session));
}

// -- task table ----------------------------------------------------------------------

// What a row must show without scrolling comes first (duration and error); one compact
// time column (the first state's time: the date only when not the newest row's day);
// long ids are cut with an ellipsis and whole in their tooltip.
const TASK_COLUMNS = [
  { key: "task_id", label: "task", sort: "task_id", cls: "clip id" }, { key: "attempt", label: "try", num: true, sort: "attempt" },
  { key: "name", label: "name", sort: "name", cls: "clip name" }, { key: "final_state", label: "state", sort: "state" },
  { key: "duration_s", label: "duration", num: true, sort: "duration" },
  { key: "error_type", label: "error", sort: "error_type", cls: "clip error" },
  { key: "time", label: "started", sort: "time", cls: "time" },
  { key: "job_id", label: "job", sort: "job", cls: "clip id" }, { key: "node_id", label: "node", sort: "node", cls: "clip id" },
  { key: "worker_id", label: "worker", sort: "worker", cls: "clip id" }, { key: "pid", label: "pid", num: true, sort: "pid" },
];
const STATE_TIMES = ["pending_at", "submitted_at", "running_at", "finished_at", "failed_at"];
const firstTime = (row) => STATE_TIMES.map((k) => row[k]).filter(Boolean).sort()[0] || null;

function clipped(text, attrs = {}) {
  return h("span", { title: text, ...attrs }, text);
}

// An id cut to its column keeps both ends: ids of one producer or job share their start
// (demo-20261206-2108…) and differ at the end, Ray's share their end (the job) and differ
// at the start. Whole in the tooltip.
const ID_CHARS = 14;  // what the column holds at 1280 px
function idText(id) {
  const text = String(id ?? "");
  return text.length <= ID_CHARS ? text : `${text.slice(0, 5)}…${text.slice(-(ID_CHARS - 6))}`;
}
const FILTER_KEYS = ["state", "name", "job", "session", "node", "error_type", "worker", "since", "until"];

export async function tasks(params) {
  const query = Object.fromEntries(params.entries());
  const data = await getJSON("/api/tasks", query);
  const form = h("form", { class: "search", onsubmit: (ev) => {
    ev.preventDefault();
    const q = ev.target.elements.q.value.trim();
    location.hash = routeHref("tasks", { ...query, q, offset: null });
  } }, h("input", { name: "q", type: "search", value: query.q || "", placeholder: "search names, ids, errors, stack traces", "aria-label": "search tasks" }),
    h("button", { type: "submit" }, "Search"));
  const chips = h("div", { class: "chips" }, [...FILTER_KEYS, "q"].filter((k) => query[k]).map((k) =>
    h("span", { class: "chip", "data-filter": k }, `${k}: ${query[k]} `,
      hashLink("tasks", { ...query, [k]: null, offset: null }, "×", { title: "remove filter" }))));
  const sort = query.sort || "time", order = query.order || "desc";
  const columns = TASK_COLUMNS.map((c) => ({ ...c, head: hashLink("tasks",
    { ...query, sort: c.sort, order: sort === c.sort && order === "desc" ? "asc" : "desc", offset: null },
    c.label + (sort === c.sort ? (order === "desc" ? " ▾" : " ▴") : "")) }));
  const newest = data.rows.map(firstTime).filter(Boolean).sort().pop();
  const filtered = [...FILTER_KEYS, "q"].some((k) => query[k]);
  const grid = data.rows.length ? table(columns, data.rows, (row, c) => {
    if (c.key === "task_id") return hashLink("task", taskRoute(row), idText(row.task_id), { class: "mono", title: row.task_id });
    if (c.key === "final_state") return inferredBadge(row);
    if (c.key === "time") { const t = firstTime(row); return t ? h("span", { title: fmtTime(t) }, fmtClock(t, newest)) : ""; }
    if (c.key === "duration_s") return fmtDur(row.duration_s);
    if (c.key === "error_type") {
      // The exception class first (ValueError), where Ray's error type (TASK_EXECUTION_EXCEPTION)
      // would fill the cut column; Ray's type stays in the tooltip and on the task page.
      const shown = errorText(row.exception_class || row.error_type, row.error_message);
      const full = row.exception_class && row.error_type ? `${row.error_type}: ${shown}` : shown;
      return row.error_type || row.error_message  // one click to the attempt: its error and logs
        ? hashLink("task", taskRoute(row),
          clipped(shown, { class: "error-text", title: full }), { class: "error-link" }) : "";
    }
    // a Ray job is its id in its cluster (the groups name it job@session): the session
    // in the tooltip, as two clusters' first jobs are both 01000000
    if (c.key === "job_id" && row.ray_session) return clipped(idText(row.job_id), { title: `${row.job_id}@${row.ray_session}` });
    if (c.cls === "clip id") return clipped(idText(row[c.key]), { title: row[c.key] ?? "" });
    if (c.cls && c.cls.startsWith("clip")) return clipped(row[c.key] ?? "");
    return row[c.key] ?? "";
  }, { class: "tasks" }) : filtered || data.total ? h("p", { class: "muted empty" }, "No tasks match.") : noTasks();
  return h("div", null, form, chips, h("p", { class: "muted", id: "task-count" },
    `${fmtNum(data.total)} task attempt${data.total === 1 ? "" : "s"}`), grid, pager(query, data),
  query.q ? await otherMatches(query.q) : null);
}

// The search box is the dashboard's only one: the training ops and trace spans whose
// names, ids or errors hold the text too (as `evagg query search`), each linked to its
// run or trace, so a failed step's error is found where a task's would be.
async function otherMatches(text) {
  let data;
  try {
    data = await getJSON("/api/search", { q: text, limit: 50 });
  } catch (err) {
    return null;  // the tasks above stand without it: a failed extra search hides only itself
  }
  const rows = data.rows.filter((row) => row.kind === "op" || row.kind === "span");
  if (!rows.length) return null;
  const where = (row) => row.kind === "op"
    ? hashLink("run", { run: row.scope || "" }, row.scope ? `run ${row.scope}` : "(ops without a run id)")
    : hashLink("trace", { trace_id: row.scope }, `trace ${row.scope}`, { class: "mono" });
  return section(`Training ops and trace spans matching “${text}”`, table([{ key: "kind", label: "kind" },
    { key: "name", label: "name", cls: "clip name" }, { key: "state", label: "state" },
    { key: "error_message", label: "error", cls: "clip" }, { key: "scope", label: "in", cls: "clip" },
    { key: "time", label: "time" }], rows, (row, c) => c.key === "state" ? stateBadge(row.state)
    : c.key === "error_message" ? clipped(errorText(row.error_type, row.error_message), { class: "error-text" })
      : c.key === "scope" ? where(row) : c.key === "time" ? fmtTime(row.time) : c.key === "name" ? clipped(row.name || "")
        : row[c.key] ?? "", { class: "other-matches" }));
}

function pager(query, data) {
  const offset = data.offset, limit = data.limit, end = Math.min(offset + data.rows.length, data.total);
  return h("div", { class: "pager" },
    offset > 0 ? hashLink("tasks", { ...query, offset: Math.max(0, offset - limit) }, "‹ previous") : null,
    h("span", null, data.total ? ` ${offset + 1}–${end} of ${fmtNum(data.total)} ` : ""),
    end < data.total ? hashLink("tasks", { ...query, offset: offset + limit }, "next ›") : null);
}

// An end nobody reported, which evagg inferred (docs/ray.md, "Ends readers infer"): a
// dashed badge ending in "*" in tables, the word on the task page; hovering says how.
function inferredBadge(row, { word = false } = {}) {
  if (!row.inferred) return stateBadge(row.final_state);
  const badge = stateBadge(`${row.final_state}${word ? "" : "*"}`);
  badge.classList.add("inferred");
  badge.title = row.inferred;
  return word ? h("span", null, badge, h("span", { class: "muted" }, " inferred by evagg")) : badge;
}

// -- task detail ---------------------------------------------------------------------

// A task's page: Ray's clusters reuse task ids, so a Ray attempt's link names its session.
export function taskRoute(row, session = row.ray_session) {
  return { task_id: row.task_id, attempt: row.attempt, session: session || null };
}

export async function task(params) {
  const data = await getJSON("/api/task", { task_id: params.get("task_id"), attempt: params.get("attempt"),
    session: params.get("session") });
  // one id in two Ray clusters: each attempt says whose it is
  const sessions = new Set(data.attempts.map((a) => a.ray_session || "")).size;
  const parts = data.attempts.map((a) => {
    const meta = ["task_id", "attempt", "name", "function", "task_type", "final_state", "job_id", "node_id", "worker_id",
      "pid", "actor_id", "parent_id", "trace_id", "source", "ray_session", "events", "duration_s", "pending_at",
      "submitted_at", "running_at", "finished_at", "failed_at", "exception_class"]
      .filter((k) => a[k] !== undefined && a[k] !== null)
      .map((k) => [h("dt", null, k), h("dd", null, k === "final_state" ? inferredBadge(a, { word: true }) : k.endsWith("_at") ? fmtTime(a[k]) : k === "duration_s" ? fmtDur(a[k]) : String(a[k]))]);
    const where = a.ray_session && sessions > 1 ? ` (Ray session ${a.ray_session})` : "";
    return h("div", { class: "attempt" }, h("h2", null, `${a.name || "task"} — attempt ${a.attempt}${where}`),
      h("dl", { class: "meta" }, meta),
      a.inferred ? section("How this end is known", h("p", { class: "inferred" }, a.inferred)) : null,
      section("State timeline", stateTimeline(a)),
      a.error_type || a.error_message ? section("Error", h("p", { class: "error-text" }, errorText(a.error_type, a.error_message))) : null,
      a.stack_trace ? section("Stack trace", h("pre", { class: "stack" }, a.stack_trace)) : null,
      attemptLogs(a));
  });
  const events = table([{ key: "time", label: "time" }, { key: "state", label: "state" }, { key: "attempt", label: "try", num: true },
    { key: "node_id", label: "node", cls: "clip id" }, { key: "worker_id", label: "worker", cls: "clip id" },
    { key: "pid", label: "pid", num: true }, { key: "source", label: "source" },
    ...(sessions > 1 ? [{ key: "session", label: "Ray session", cls: "clip id" }] : []),
    { key: "event_id", label: "event id", cls: "clip id" }], data.events,
  (row, c) => c.key === "time" ? fmtTime(row.time) : c.key === "state" ? (row.state ? stateBadge(row.state) : h("span", { class: "muted" }, "definition"))
    : c.cls ? h("span", { title: row[c.key] ?? "" }, row[c.key] ?? "") : row[c.key] ?? "");
  return h("div", null, parts, section("Events (as stored, in time order)", events));
}

// -- training runs -------------------------------------------------------------------

export async function runs() {
  const data = await getJSON("/api/runs");
  if (!data.rows.length) return noRuns();
  return section("Training runs", table([{ key: "run_id", label: "run", cls: "clip name" }, { key: "steps", label: "steps", num: true },
    { key: "ops", label: "ops", num: true }, { key: "failures", label: "failures", num: true },
    // the runs view's `seconds`: its steps' wall times summed (each moment of a step once),
    // not the ops' durations summed, which "op time" read as
    { key: "seconds", label: "wall time", num: true,
      head: h("span", { title: "the steps' wall times summed: the time each step's ops cover, each moment once" }, "wall time") },
    { key: "files", label: "files", num: true,
      head: h("span", { title: "files the agents shipped for the run (profiler traces, checkpoints): its page links them" }, "files") },
    { key: "started_at", label: "started" }, { key: "ended_at", label: "ended" }],
  data.rows, (row, c) => c.key === "run_id" ? runLink(row.run_id, data.no_run)
    : c.key === "seconds" ? fmtDur(row.seconds) : c.key.endsWith("_at") ? fmtTime(row[c.key]) : fmtNum(row[c.key])));
}

// Ops sent without a run_id (Ray ops from ray_op/traced_remote, emitters.op outside a
// run) share one row, run_id ''. Its link keeps `run=` (routeHref drops empty values),
// and it is named for what it holds, not as a training run: in the words the API sends
// (`no_run`), which `evagg query runs` prints too.
const NO_RUN_NOTE = "ops sent without a run_id: Ray ops (ray_op, traced_remote) and emitters.op outside "
  + "a run; emitters.configure(run_id=...) or EVAGG_RUN_ID gives a run its own row";

function runLink(runId, noRun) {
  if (runId) return hashLink("run", { run: runId }, runId, { title: runId });
  return h("span", null, h("a", { href: "#/run?run=", class: "no-run", title: NO_RUN_NOTE }, `(${noRun})`),
    h("span", { class: "muted no-run-note" }, " Ray tasks' ops and others sent without a run_id"));
}

const STEP_ROWS = 200;  // the Run page's steps table: the last this many, and the marked

export async function run(params) {
  const runId = params.get("run") || "";
  let data;
  try {
    data = await getJSON(`/api/steps?run=${encodeURIComponent(runId)}`);
  } catch (err) {
    // a run that sent no ops but whose files were shipped (a profiler's traces written
    // with trace_handler(run_id=...) and no tracker): its page is its files
    const files = err.status === 404 && runId ? await runArtifacts(runId) : null;
    if (!files) throw err;
    return h("div", null, h("h1", null, `Run ${runId}`),
      h("p", { class: "muted", id: "no-steps-note" }, "No steps or ops were sent for this run, "
        + "only its files: a TrainingTracker or emitters.op(...) with this run_id adds them."), files);
  }
  const byMetric = new Map();
  for (const m of data.metrics.rows) {
    if (m.step === null) continue;
    if (!byMetric.has(m.metric)) byMetric.set(m.metric, []);
    byMetric.get(m.metric).push(m);
  }
  const opsByStep = new Map();
  for (const op of data.ops.rows) {
    if (!opsByStep.has(op.step)) opsByStep.set(op.step, []);
    opsByStep.get(op.step).push(op);
  }
  // metric -> steps where it was NaN or infinite (never recorded as a number)
  const badSteps = new Map();
  for (const st of data.steps.rows) {
    for (const metric of nonfiniteOf(st, opsByStep.get(st.step) || [])) {
      if (!badSteps.has(metric)) badSteps.set(metric, []);
      badSteps.get(metric).push(st.step);
    }
  }
  for (const metric of badSteps.keys()) if (!byMetric.has(metric)) byMetric.set(metric, []);
  // Each step's wall time first: a slow step stands out here, whatever its metrics say.
  const wall = data.steps.rows.filter((st) => st.step !== null && st.seconds !== null)
    .map((st) => ({ step: st.step, min: st.seconds, max: st.seconds, mean: st.seconds }));
  const charts = h("div", { class: "metric-charts" },
    wall.length > 1 ? metricChart("step wall time", wall, [], fmtDur) : null,
    [...byMetric.entries()].map(([name, pts]) => metricChart(name, pts, badSteps.get(name) || [])));
  const rowOf = (st) => {
    const ops = opsByStep.get(st.step) || [];
    // one value (one op reported the metric in the step) reads as itself, not "x … x (mean x)"
    const spread = Object.entries(st.metrics || {}).map(([k, v]) => {
      const [lo, hi, mean] = [v.min, v.max, v.mean].map((x) => fmtMetric(k, x));
      return h("div", null, h("b", null, k), lo === hi ? ` ${lo}` : ` ${lo} … ${hi} (mean ${mean})`);
    });
    // a failed step's ops are open: its error shows without a click
    const opList = h("details", { "data-key": `step-${st.step}`, open: st.failures > 0 }, h("summary", null, `${ops.length} ops: ${(st.op_names || []).join(", ")}`),
      h("ul", { class: "ops" }, ops.map((op) => h("li", null, stateBadge(op.state), ` ${op.name} `,
        // the ranks of a distributed job share a run and its step numbers: say whose op
        op.rank !== null && op.rank !== undefined ? h("span", { class: "op-rank", title: `pid ${op.pid ?? "?"}` }, `rank ${op.rank} `) : null,
        h("span", { class: "muted" }, `${fmtDur(op.duration_s)}${op.own_step !== st.step ? ` (own step: ${op.own_step ?? "none"})` : ""}`),
        op.error_type || op.error_message ? h("span", { class: "error-text" }, ` ${errorText(op.error_type, op.error_message)}`) : null,
        (op.nonfinite || []).length ? h("span", { class: "nonfinite" }, ` ${op.nonfinite.join(", ")} NaN/inf`) : null))));
    const bad = nonfiniteOf(st, ops);
    const marks = [bad.length ? "has-nonfinite" : null, st.failures ? "has-failure" : null].filter(Boolean);
    return h("tr", { "data-step": st.step, class: marks.join(" ") || null },
      h("td", { class: "num" }, st.step ?? "—", bad.length ? h("span", { class: "nonfinite-badge", title: `${bad.join(", ")} was NaN or infinite at this step` }, ` ⚠ ${bad.join(", ")} NaN/inf`) : null),
      h("td", null, opList),
      h("td", { class: "num" + (st.failures ? " error-text" : "") }, st.failures), h("td", { class: "num" }, fmtDur(st.seconds)),
      h("td", { class: "num queue" }, st.queue_s === null || st.queue_s === undefined ? "—" : fmtDur(st.queue_s)), h("td", null, spread));
  };
  // A long run's table holds its failed and NaN steps and its last STEP_ROWS, the rest a
  // click away: 5,000 rows took 12 s to draw and a page 250,000 px tall.
  const marked = (st) => st.failures > 0 || nonfiniteOf(st, opsByStep.get(st.step) || []).length > 0;
  const all = data.steps.rows;
  const last = new Set(all.slice(-STEP_ROWS));
  const kept = all.length > STEP_ROWS * 1.25 ? all.filter((st) => last.has(st) || marked(st)) : all;
  const body = h("tbody", null, kept.map(rowOf));
  const hidden = all.length - kept.length;
  const more = hidden ? h("p", { class: "muted", id: "more-steps" },
    `${fmtNum(hidden)} of ${fmtNum(all.length)} steps are not shown (no failure, no NaN, not among the last ${STEP_ROWS}). `,
    h("button", { type: "button", onclick: (event) => {
      body.replaceChildren(...all.map(rowOf));
      event.target.closest("p").remove();
    } }, `show all ${fmtNum(all.length)} steps`)) : null;
  // "wall time": the union of the step's op intervals, so nested ops are not counted twice.
  const heads = [["step"], ["ops"], ["failures"], ["wall time", "time the step's ops cover, each moment once (nested ops are not added twice)"],
    ["queue time", "time the step's work waited in a queue before it started (emitters.queueing)"], ["metric spread (min … max)"]];
  const grid = h("table", { class: "grid steps" }, h("thead", null, h("tr", null,
    heads.map(([t, title]) => h("th", title ? { title } : null, t)))), body);
  // A run that failed says so at its top, each failed step one click from its row (always
  // kept in the table): under the charts and a row per step it was a long scroll away.
  const failedSteps = all.filter((st) => st.failures > 0 && st.step !== null);
  const failedOp = (st) => (opsByStep.get(st.step) || []).filter((op) => op.state === "FAILED")
    .sort((a, b) => Number(!(a.error_type || a.error_message)) - Number(!(b.error_type || b.error_message)))[0];
  const failures = failedSteps.length ? h("p", { class: "run-failures", id: "run-failures" },
    h("b", null, `${fmtNum(failedSteps.length)} failed step${failedSteps.length === 1 ? "" : "s"}: `),
    failedSteps.slice(0, 5).flatMap((st, i) => {
      const op = failedOp(st);
      const text = `step ${st.step}${op ? ` ${op.name}${op.error_type || op.error_message ? `: ${errorText(op.error_type, op.error_message)}` : ""}` : ""}`;
      return [i ? ", " : null, h("button", { type: "button", class: "step-link", "data-step": st.step, onclick: () =>
        body.querySelector(`tr[data-step="${st.step}"]`)?.scrollIntoView({ block: "center" }) }, text)];
    }), failedSteps.length > 5 ? ` and ${fmtNum(failedSteps.length - 5)} more (red in the table)` : null) : null;
  return h("div", null, h("h1", null, runId ? `Run ${runId}` : `Steps of ${data.no_run}`),
    failures,
    runId ? null : h("p", { class: "muted", id: "no-run-note" }, NO_RUN_NOTE),
    runId ? await requestLedger(runId) : null,
    runId ? await runArtifacts(runId) : null,
    section("Metrics over steps", byMetric.size ? charts : h("p", { class: "muted" }, "No metrics.")),
    section("Steps", h("div", null, more, grid)));
}

// The run's requests (emitters.queueing): counts, and those enqueued long ago that never
// got an answer. Nothing is shown for a run without requests.
async function requestLedger(runId) {
  let data;
  try {
    data = await getJSON("/api/ledger", { run: runId });
  } catch (err) {
    return null;
  }
  const [summary] = data.summary.rows;
  if (!summary) return null;
  const counts = ["enqueued", "started", "answered", "failed", "outstanding"].map((key) =>
    h("div", { class: "tile" + (key === "outstanding" && summary[key] ? " error-text" : ""), "data-ledger": key },
      h("div", { class: "tile-value" }, fmtNum(summary[key])), h("div", { class: "muted" }, key)));
  const waiting = data.outstanding.rows.length
    ? table([{ key: "request_id", label: "request" }, { key: "state", label: "state" },
      { key: "age_s", label: "waiting", num: true }], data.outstanding.rows,
    (row, c) => c.key === "age_s" ? fmtDur(row.age_s) : row[c.key])
    : h("p", { class: "muted" }, "No outstanding requests.");
  return section("Requests", h("div", { class: "tiles" }, counts), waiting);
}

// -- traces --------------------------------------------------------------------------

export async function traces() {
  const data = await getJSON("/api/traces", { limit: 200 });
  if (!data.rows.length) return noTraces();
  return section("Traces", table([{ key: "trace_id", label: "trace" }, { key: "root_name", label: "root", cls: "clip name" },
    { key: "spans", label: "spans", num: true }, { key: "failures", label: "failed", num: true },
    { key: "duration_s", label: "duration", num: true }, { key: "services", label: "services", cls: "clip name" },
    { key: "started_at", label: "started" }],
  data.rows, (row, c) => c.key === "trace_id" ? hashLink("trace", { trace_id: row.trace_id }, row.trace_id, { class: "mono" })
    : c.key === "root_name" ? clipped(row.root_name || row.first_name || "") : c.key === "duration_s" ? fmtDur(row.duration_s)
      : c.key === "services" ? clipped((row.services || []).filter(Boolean).join(", "))
        : c.key === "started_at" ? fmtTime(row.started_at) : fmtNum(row[c.key])));
}

export async function trace(params) {
  const traceId = params.get("trace_id");
  const data = await getJSON("/api/trace", { trace_id: traceId });
  const detail = h("div", { class: "span-detail muted" }, "Click a span for its details.");
  const pick = (sp) => {
    detail.dataset.picked = sp.span_id;  // picked again after an auto-refresh (app.js)
    const [parts, attrs] = spanParts(sp);  // events and links apart from the attributes
    // replaceChildren writes a null out as the text "null": only the parts a span has
    detail.replaceChildren(...[h("dl", { class: "meta" }, ["name", "span_id", "parent_span_id", "state", "service", "span_kind",
      "start_at", "duration_s", "node_id", "error_type", "error_message"].filter((k) => sp[k] !== null && sp[k] !== undefined)
      .map((k) => [h("dt", null, k), h("dd", null, k === "duration_s" ? fmtDur(sp[k]) : k === "start_at" ? fmtTime(sp[k]) : String(sp[k]))])),
    sp.stack_trace ? h("details", { open: true }, h("summary", null, "stack trace"), h("pre", { class: "stack" }, sp.stack_trace)) : null,
    ...parts,
    attrs.length ? h("details", null, h("summary", null, `attributes (${attrs.length})`),
      h("dl", { class: "meta attrs" }, attrs.map(([k, v]) => [h("dt", null, k), h("dd", null, String(v))]))) : null]
      .filter(Boolean));
  };
  const started = data.rows.map((sp) => sp.start_at).filter(Boolean).sort()[0];
  const services = [...new Set(data.rows.map((sp) => sp.service).filter(Boolean))].sort();
  return h("div", null, h("h1", null, "Trace ", h("span", { class: "mono" }, traceId)),
    h("p", { class: "muted trace-when" }, [started ? `started ${fmtTime(started)}` : null,
      services.length ? `services: ${services.join(", ")}` : null].filter(Boolean).join(" · ")),
    section(`Waterfall (${fmtNum(data.rows.length)} span${data.rows.length === 1 ? "" : "s"})`, waterfall(data.rows, pick)), detail);
}

// -- agents --------------------------------------------------------------------------

// An agent silent for longer than it said it may be: readers take its node for dead
// and end what was open there (docs/ray.md, "Ends readers infer").
// A final heartbeat (STOPPING) means the agent was stopped, not lost: it reads "stopped"
// at once, and is not shown as an error once silent.
function agentState(row) {
  const ended = "tasks left open on this node read as ended with it";
  if (row.state === "STOPPING") {
    return h("span", { class: "muted", title: "its final heartbeat: the agent was stopped"
      + (row.silent ? `; ${ended}` : "") }, "stopped");
  }
  if (!row.silent) return row.state ?? "";
  return h("span", { class: "error-text", title: `no heartbeat for over ${fmtDur(row.silent_after_s)}; `
    + ended }, "silent: taken for dead");
}

// A stopped agent's last heartbeat was written as it began to stop, before it delivered
// what its spool held: say so, rather than read as data left behind.
function spoolCell(row) {
  if (row.state !== "STOPPING") return fmtBytes(row.spool_bytes);
  return h("span", { class: "muted", title: "the spool as the agent began to stop, before it "
    + "delivered what it held; its last log line says whether everything went" },
  `${fmtBytes(row.spool_bytes)} at stop`);
}

// A restart is a heartbeat of another agent process: the counters shown are the new
// agent's, so say when it restarted.
function restartsCell(row) {
  if (!row.restarts) return h("span", { class: "muted" }, "0");
  return h("span", { class: "warn-text", title: `a new agent process, last at ${fmtTime(row.restarted_at)}; `
    + "the counts shown are since then" }, fmtNum(row.restarts),
  h("div", { class: "cell-note" }, `last ${fmtClock(row.restarted_at, row.last_seen)}`));
}

// The longest time between two heartbeats; over 1.5x the agent's interval it missed beats.
function gapCell(row) {
  if (row.longest_gap_s === null || row.longest_gap_s === undefined) return "";
  const interval = row.heartbeat_interval_s ?? 30;
  if (!row.missed_gaps) return h("span", { title: `heartbeats every ${fmtDur(interval)}` }, fmtDur(row.longest_gap_s));
  return h("span", { class: "error-text", title: `${fmtNum(row.missed_gaps)} gap${row.missed_gaps === 1 ? "" : "s"} over 1.5x `
    + `the ${fmtDur(interval)} heartbeat interval: the agent was down or could not write` },
  fmtDur(row.longest_gap_s), h("div", { class: "cell-note" }, `${fmtNum(row.missed_gaps)} missed`));
}

// What the agents' delivered counter adds up (evagg_delivered_events_total, every sink).
const DELIVERED_NOTE = "events every sink delivered per second, all sinks added";

export async function agents() {
  const data = await getJSON("/api/agents");
  const now = Date.now();
  const agentTable = data.agents.rows.length ? table([{ key: "node_id", label: "node" }, { key: "last_seen", label: "last heartbeat" },
    { key: "state", label: "state" }, { key: "version", label: "version" }, { key: "heartbeats", label: "beats", num: true },
    { key: "received_total", label: "received", num: true, title: "events this agent process took in since it started, as its last heartbeat said" },
    { key: "received_per_s", label: "recv/s", num: true, title: "events taken in per second between its last two heartbeats" },
    { key: "delivered_per_s", label: "deliv/s", num: true, title: `${DELIVERED_NOTE} between its last two heartbeats` },
    { key: "dropped_total", label: "dropped", num: true },
    { key: "lost_events", label: "lost", num: true }, { key: "spool_bytes", label: "spool", num: true },
    { key: "restarts", label: "restarts", num: true }, { key: "longest_gap_s", label: "longest gap", num: true }], data.agents.rows,
  (row, c) => c.key === "last_seen" ? `${fmtTime(row.last_seen)} (${fmtDur((now - Date.parse(row.last_seen)) / 1000)} ago)`
    : c.key === "state" ? agentState(row)
    : c.key === "restarts" ? restartsCell(row) : c.key === "longest_gap_s" ? gapCell(row)
    : c.key === "spool_bytes" ? spoolCell(row) : c.key === "lost_events" && row.lost_events ? h("span", { class: "error-text" }, fmtNum(row.lost_events))
      : typeof row[c.key] === "number" ? fmtNum(row[c.key]) : row[c.key] ?? "")
    : noAgents();
  const lossTable = data.losses.rows.length ? table([{ key: "time", label: "time" }, { key: "node_id", label: "node" },
    { key: "reason", label: "reason" }, { key: "source", label: "source" }, { key: "events", label: "events lost", num: true }], data.losses.rows,
  (row, c) => c.key === "time" ? fmtTime(row.time) : typeof row[c.key] === "number" ? fmtNum(row[c.key]) : row[c.key] ?? "") : h("p", { class: "muted" }, "No losses reported.");
  const note = data.agents.rows.length ? h("p", { class: "muted", id: "agents-note" }, `Counts are each agent process's own, `
    + `from its last heartbeat. deliv/s: ${DELIVERED_NOTE}, so it differs from recv/s while a sink catches up, and an event `
    + "two sinks take counts twice.") : null;
  return h("div", null, section("Node agents", agentTable, note), section("Losses", lossTable));
}

// The metrics of a step that were NaN or infinite: the step's own list where the API
// gives one, else what its ops reported.
function nonfiniteOf(step, ops) {
  const names = new Set(step.nonfinite || []);
  for (const op of ops) for (const name of op.nonfinite || []) names.add(name);
  return [...names].sort();
}
