// What each page shows when it has nothing to show: what is missing and the commands
// that fill it. An empty store is no error: one neutral message, whatever page was asked.
import { emptyState } from "./dom.js";

const SEND_TASKS = [
  "evagg run                      # the agent, if it is not running yet",
  "evagg emit --kind task --name hello --state FINISHED --field duration_s=0.8",
  "# or from Python:",
  'emitters.emit(kind="task", name="load_shard", state="FINISHED", duration_s=0.8)',
];

// The store has no files yet (the server's NoData message).
const NO_FILES = /^no Parquet files under (.*) yet$/;
export function isEmptyStore(err) {
  return err && err.status === 404 && NO_FILES.test(err.message || "");
}

export function emptyStore(err) {
  const where = (err.message.match(NO_FILES) || [])[1] || "the store";
  return emptyState("No events yet",
    `Nothing has been written to ${where} yet. An agent writes here when one of its [[sinks]] is ` +
    `type = "parquet" with url = "${where}"; an agent with no config file writes to its default ` +
    "directory, which evagg dashboard reads when started without --data. Events show here once the agent " +
    "closes its next file (its roll_interval), and this page refreshes by itself.", SEND_TASKS);
}

export function noTasks() {
  return emptyState("No tasks yet", "Tasks come from events of kind task. A task event without a task_id is a " +
    "task of its own; give one task_id to a task's RUNNING and FINISHED events to fold them into one row.", SEND_TASKS);
}

export function noRuns() {
  return emptyState("No training runs yet", "A training run is the op events that share a run_id: each op with its " +
    "step and metrics (docs/pytorch.md for the torch hooks).", ["import emitters", 'emitters.configure(run_id="exp-42")',
    'with emitters.op("optimizer.step", step=12) as op:', "    op.metric(loss=0.31)", "emitters.flush(2.0)"]);
}

export function noTraces() {
  return emptyState("No traces yet", "Traces are span events. Send them from Python through the agent's socket, " +
    "or from anything that speaks OTLP/HTTP to the agent's /v1/traces (docs/opentelemetry.md).",
  ["from emitters import otel", 'otel.init_telemetry("my-service")          # spans go to the agent',
    'with otel.get_tracer(__name__).start_as_current_span("request"):', "    ...",
    "# other languages: OTLP/HTTP exporter to http://127.0.0.1:4040/v1/traces"]);
}

export function noAgents() {
  return emptyState("No agent heartbeats yet", "Every running agent writes a heartbeat event each heartbeat_interval " +
    "(30 s by default); start one on each node.", ["evagg run"]);
}

// The store holds events but none from Ray (the server's NotFound for Ray's routes).
const NO_RAY = /^no Ray tasks in /;
export function isNoRayTasks(err) {
  return err && err.status === 404 && NO_RAY.test(err.message || "");
}

export function noRayTasks() {
  return emptyState("No Ray tasks yet", "This page draws the tasks Ray exports through its Event Export. " +
    "Point each Ray node's exporter at its agent before the node starts (docs/ray.md, \"Turn it on\"); " +
    "tasks show here once the agent has written them.",
  ["export RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR=http://127.0.0.1:4040/ray/events",
    "export RAY_enable_core_worker_ray_event_to_aggregator=1 RAY_enable_ray_event=1",
    "ray start --head            # or ray.init() with these in os.environ"]);
}
