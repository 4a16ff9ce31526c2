// A run's shipped files (profiler traces, NCCL flight-recorder dumps: `[[files]]` in the
// agent's config) with a download link each, from /api/artifacts (docs/dashboard.md).
// Nothing is shown for a run without any.
import { getJSON } from "./api.js";
import { h, fmtTime, fmtBytes, table, section } from "./dom.js";

export function artifactUrl(row) {
  return `/api/artifact?${new URLSearchParams({ name: row.name, version: row.version, node: row.node_id })}`;
}

export async function runArtifacts(runId) {
  let data;
  try {
    data = await getJSON("/api/artifacts", { run: runId });
  } catch (err) {
    return null;
  }
  if (!data.rows.length) return null;
  const columns = [{ key: "name", label: "file" }, { key: "version", label: "version", num: true },
    { key: "artifact_kind", label: "kind" }, { key: "size_bytes", label: "size", num: true },
    { key: "node_id", label: "node" }, { key: "finished", label: "finished" }, { key: "sha256", label: "sha256" }];
  return section("Files", table(columns, data.rows, (row, c) => {
    if (c.key === "name") return h("a", { href: artifactUrl(row), download: row.name.split("/").pop(), class: "artifact-link" }, row.name);
    if (c.key === "size_bytes") return fmtBytes(row.size_bytes);
    if (c.key === "finished") return fmtTime(row.finished);
    if (c.key === "sha256") return h("code", { title: row.sha256 }, (row.sha256 || "").slice(0, 12));
    return row[c.key] ?? "";
  }, { class: "artifacts" }));
}
