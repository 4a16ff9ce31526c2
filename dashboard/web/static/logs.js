// A Ray attempt's stdout and stderr on its task page, from Ray's own log route that the
// dashboard serves from the lake (docs/ray-logs.md): the last lines at once, all of them
// one click away. Ray writes nothing of a task's exception into its stderr range: the
// stored error above says what raised.
import { h, section } from "./dom.js";

export const SHOWN_LINES = 200;

export function logUrl(attempt, suffix, lines) {
  const base = attempt.ray_session ? `/ray/${encodeURIComponent(attempt.ray_session)}` : "";
  const query = new URLSearchParams({ task_id: attempt.task_id, attempt_number: attempt.attempt ?? 0,
    suffix, lines, filter_ansi_code: "true", download_filename: `${attempt.task_id}-${attempt.attempt ?? 0}.${suffix}` });
  return `${base}/api/v0/logs/file?${query}`;
}

export function attemptLogs(attempt) {
  if (attempt.source !== "ray" || !attempt.task_id) return null;
  return h("div", { class: "task-logs" }, ["out", "err"].map((suffix) => streamLog(attempt, suffix)));
}

function streamLog(attempt, suffix) {
  const name = suffix === "out" ? "stdout" : "stderr";
  const note = h("p", { class: "muted log-note" }, "loading…");
  const body = h("pre", { class: "log", "data-stream": suffix });
  const all = h("a", { href: logUrl(attempt, suffix, -1), target: "_blank", rel: "noopener",
    class: "log-all" }, `all of ${name}`);
  fetch(logUrl(attempt, suffix, SHOWN_LINES)).then(async (answer) => {
    const text = await answer.text();
    if (!answer.ok) {
      note.textContent = text;  // what the store lacks and why, in Ray's words
      body.remove();
      all.remove();
      return;
    }
    const lines = text.split("\n").length - (text.endsWith("\n") ? 1 : 0);
    body.textContent = text;
    note.textContent = !text ? `Nothing on ${name}.`
      : lines >= SHOWN_LINES ? `The last ${SHOWN_LINES} lines:` : `${lines} line${lines === 1 ? "" : "s"}:`;
    if (!text) body.remove();
  }).catch((err) => { note.textContent = `could not load ${name}: ${err.message}`; });
  return section(`Output: ${name}`, note, body, h("p", null, all));
}
