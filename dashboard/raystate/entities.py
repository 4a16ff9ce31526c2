"""Ray's `actors`, `jobs`, `nodes`, `workers` and `placement_groups` from the stored events.

A session has few of these (its nodes, workers and actors, not its tasks), so each is
folded here in Python from its definition row and its lifecycle rows, in time order:
the latest transition gives the state, the definition the names, the DEAD transition the
death. Placement groups are stored whole (kind "ray", attrs ray_raw) and exported by
Ray only with RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES=ALL.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from dashboard.lake.store import Store
from dashboard.raystate.inferred import EXPORTED_END, JOB_END, add_inferred_ends
from dashboard.raystate.options import ListOptions, list_response, matches
from dashboard.raystate.rows import b64_to_hex, camel_to_snake, json_or, ms_floor, to_int
from dashboard.raystate.schema import shape

Row = dict[str, Any]
ENTITY_ROWS = """
SELECT DISTINCT ON (event_id) event_id, kind, name, state, epoch_us(time) AS us, job_id,
       node_id, worker_id, actor_id, error_type, error_message, attrs
FROM events_raw
WHERE (source = 'ray' OR attrs['evagg_inferred'] IS NOT NULL)
  AND coalesce(attrs['ray_session'], '') = $session
  AND (kind IN ('actor', 'job', 'node', 'worker')
       OR (kind = 'ray' AND attrs['ray_event_type'] LIKE 'PLACEMENT_GROUP_%'))
"""
ID_OF = {"actor": "actor_id", "job": "job_id", "node": "node_id", "worker": "worker_id"}


def entity_rows(store: Store, session: str) -> dict[str, dict[str, list[Row]]]:
    """kind -> entity id -> its rows in time order."""
    rows = store.execute(ENTITY_ROWS, {"session": session}).records()
    rows.sort(key=lambda r: r["us"] or 0)
    grouped: dict[str, dict[str, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["kind"] == "ray":
            raw = json_or((row["attrs"] or {}).get("ray_raw"), {})
            payload = next((v for v in raw.values() if isinstance(v, dict)), {})
            key = b64_to_hex(str(payload.get("placementGroupId")
                                 or payload.get("placement_group_id") or ""))
            grouped["placement_group"][key].append({**row, "payload": camel_to_snake(payload)})
        elif row[ID_OF[row["kind"]]]:
            grouped[row["kind"]][row[ID_OF[row["kind"]]]].append(row)
    return grouped


def _parts(rows: list[Row]) -> tuple[Row, dict[str, str], list[Row]]:
    """(definition row, its attrs merged with later ones', transitions in time order)."""
    definition = next((r for r in rows if r["state"] == "DEFINED"), rows[0])
    attrs: dict[str, str] = {}
    for r in rows:
        attrs.update(r["attrs"] or {})
    attrs.update(definition["attrs"] or {})
    return definition, attrs, [r for r in rows if r["state"] not in (None, "DEFINED")]


def _real_first(moves: list[Row], state: str) -> Row | None:
    """The first move to `state` Ray exported, else the first an agent inferred
    (attrs evagg_inferred): a real end wins whenever it arrives."""
    found = [r for r in moves if r["state"] == state]
    real = [r for r in found if not _inferred_text(r)]
    return (real or found)[0] if found else None


def _inferred_text(row: Row) -> str | None:
    return (row["attrs"] or {}).get("evagg_inferred")


def _last(rows: list[Row], pick: Callable[[Row], Any]) -> Any:
    return next((pick(r) for r in reversed(rows) if pick(r) not in (None, "")), None)


def actor(rows: list[Row]) -> Row:
    definition, attrs, moves = _parts(rows)
    class_name = attrs.get("ray_class_name") or definition["name"] or ""
    dead = _real_first(moves, "DEAD")
    death = json_or((dead["attrs"] or {}).get("ray_death"), None) if dead else None
    if dead and death is None and _inferred_text(dead):
        death = {"actorDiedErrorContext": {"reason": dead["error_type"] or "WORKER_DIED",
                                           "errorMessage": _inferred_text(dead)}}
    restarts = sum(r["state"] == "RESTARTING" for r in moves)
    return {
        "actor_id": definition["actor_id"], "class_name": class_name,
        "state": "DEAD" if dead else (moves[-1]["state"] if moves else "DEPENDENCIES_UNREADY"),
        "job_id": definition["job_id"] or _last(rows, lambda r: r["job_id"]),
        "name": "" if definition["name"] == class_name else (definition["name"] or ""),
        "node_id": _last(moves, lambda r: r["node_id"]),
        "pid": to_int(_last(moves, lambda r: (r["attrs"] or {}).get("worker_pid")), 0),
        "ray_namespace": attrs.get("ray_namespace", ""),
        "serialized_runtime_env": attrs.get("ray_runtime_env", "{}"),
        "required_resources": json_or(attrs.get("ray_required_resources"), {}),
        "death_cause": camel_to_snake(death, ids=True) if death else None,
        "is_detached": attrs.get("ray_is_detached") == "true",
        "placement_group_id": attrs.get("ray_placement_group_id"),
        "repr_name": _last(moves, lambda r: (r["attrs"] or {}).get("ray_repr_name")) or "",
        # Ray's int64 counters arrive as JSON strings (protobuf's mapping); so here.
        "num_restarts": str(restarts),
        "num_restarts_due_to_lineage_reconstruction": str(sum(
            (r["attrs"] or {}).get("ray_restart_reason") == "LINEAGE_RECONSTRUCTION"
            for r in moves)),
        "num_restarts_due_to_node_preemption": str(sum(
            (r["attrs"] or {}).get("ray_restart_reason") == "NODE_PREEMPTION" for r in moves)),
        "call_site": attrs.get("ray_call_site"),
        "label_selector": json_or(attrs.get("ray_label_selector"), {}),
        "fallback_strategy": json_or(attrs.get("ray_fallback_strategy"), None),
    }


def node(rows: list[Row]) -> Row:
    definition, attrs, moves = _parts(rows)
    resources = json_or(_last(moves, lambda r: (r["attrs"] or {}).get("ray_resources")), {})
    dead = next((r for r in reversed(moves) if r["state"] == "DEAD"), None)
    alive = next((r for r in moves if r["state"] == "ALIVE"), None)
    start = _iso_ms(attrs.get("ray_start_timestamp"))
    return {
        "node_id": definition["node_id"],
        "node_ip": attrs.get("ray_node_ip_address", ""),
        "is_head_node": "node:__internal_head__" in resources,
        "state": moves[-1]["state"] if moves else "ALIVE",
        "state_message": dead["error_message"] if dead else None,
        "node_name": definition["name"] or attrs.get("ray_node_name", ""),
        "resources_total": resources,
        "labels": json_or(attrs.get("ray_labels"), {}),
        "start_time_ms": start if start is not None else (ms_floor(alive["us"]) if alive else 0),
        "end_time_ms": ms_floor(dead["us"]) if dead else 0,
    }


def _iso_ms(text: str | None) -> int | None:
    if not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(when.timestamp() * 1000)


def worker(rows: list[Row], node_ips: dict[str, str]) -> Row:
    definition, attrs, moves = _parts(rows)
    dead = next((r for r in reversed(moves) if r["state"] == "DEAD"), None)
    node_id = definition["node_id"] or _last(rows, lambda r: r["node_id"])

    def ms(key: str, default: int | None) -> int | None:
        return to_int(_last(rows, lambda r: (r["attrs"] or {}).get(key)), default)

    return {
        "worker_id": definition["worker_id"],
        "is_alive": bool(moves) and moves[-1]["state"] == "ALIVE",
        "worker_type": attrs.get("ray_worker_type", "WORKER"),
        "exit_type": dead["error_type"] if dead else None,
        "node_id": node_id, "ip": node_ips.get(node_id or "", ""),
        "pid": to_int(attrs.get("worker_pid"), 0),
        "exit_detail": dead["error_message"] if dead else None,
        "worker_launch_time_ms": ms("ray_worker_launch_time_ms", -1),
        "worker_launched_time_ms": ms("ray_worker_launched_time_ms", -1),
        "start_time_ms": ms("ray_start_time_ms", 0), "end_time_ms": ms("ray_end_time_ms", 0),
        "debugger_port": None, "num_paused_threads": None,
    }


def job(rows: list[Row], node_ips: dict[str, str]) -> Row:
    definition, attrs, moves = _parts(rows)
    created = next((r for r in moves if r["state"] == "CREATED"), None)
    end = next((r for r in moves if r["event_id"] == JOB_END), None)
    return {
        "type": "DRIVER", "job_id": definition["job_id"], "submission_id": None,
        "driver_info": {"id": definition["job_id"],
                        "node_ip_address": node_ips.get(definition["node_id"] or "", ""),
                        "pid": attrs.get("ray_driver_pid", "")},
        # The `jobs` view's end (inferred.JOB_END): without one the job still reads
        # RUNNING, as Ray said last.
        "status": "SUCCEEDED" if end else "RUNNING",
        "entrypoint": definition["name"] or "",
        "message": _end_message(end), "error_type": None,
        # Ray's job table stamps its start a moment before the GCS exports the job, and
        # the export carries no start time of its own: the earliest exported stamp is
        # the closest (the same millisecond, or one or two after).
        "start_time": ms_floor(min(created["us"], definition["us"]) if created
                               else definition["us"]),
        "end_time": ms_floor(end["us"]) if end else 0,
        "metadata": json_or(attrs.get("ray_job_metadata"), {}),
        "runtime_env": json_or(attrs.get("ray_runtime_env"), {}),
        "driver_agent_http_address": None, "driver_node_id": None, "driver_exit_code": None,
    }


def _end_message(end: Row | None) -> str | None:
    """None where Ray exported the job's own end, as Ray says; else how evagg knows (the
    `jobs` view's how_known, which the end row carries)."""
    if end is None or end["error_message"] == EXPORTED_END:
        return None
    return str(end["error_message"])


def placement_group(rows: list[Row]) -> Row:
    definition: Row = next((r["payload"] for r in rows
                       if "DEFINITION" in (r["attrs"] or {}).get("ray_event_type", "")), {})
    moves = [t for r in rows if "LIFECYCLE" in (r["attrs"] or {}).get("ray_event_type", "")
             for t in r["payload"].get("state_transitions") or []]
    moves.sort(key=lambda t: str(t.get("timestamp") or ""))
    return {
        "placement_group_id": b64_to_hex(str(definition.get("placement_group_id") or "")),
        "name": definition.get("name", ""),
        "creator_job_id": b64_to_hex(str(definition.get("creator_job_id") or "")),
        "state": moves[-1].get("state", "PENDING") if moves else "PENDING",
        "bundles": camel_to_snake(definition.get("bundles") or [], ids=True),
        "is_detached": bool(definition.get("is_detached")),
        "stats": None, "topology_strategy": {}, "topology_assignments": {},
    }


def list_entities(store: Store, session: str, resource: str, options: ListOptions) -> Row:
    grouped = entity_rows(store, session)
    add_inferred_ends(store, session, grouped)
    ips = {node_id: node(rows)["node_ip"] for node_id, rows in grouped["node"].items()}
    build: dict[str, tuple[str, Callable[[list[Row]], Row], str]] = {
        "actors": ("actor", actor, "actor_id"),
        "nodes": ("node", node, "node_id"),
        "workers": ("worker", lambda rows: worker(rows, ips), "worker_id"),
        "jobs": ("job", lambda rows: job(rows, ips), "job_id"),
        "placement_groups": ("placement_group", placement_group, "placement_group_id"),
    }
    kind, make, key = build[resource]
    every = [make(rows) for rows in grouped[kind].values()]
    kept = sorted((r for r in every if matches(r, options.filters)), key=lambda r: r[key] or "")
    page = [shape(resource, r, options.detail) for r in kept[:options.limit]]
    return list_response(page, total=len(every), filtered=len(kept))


def summarize_actors(store: Store, session: str, options: ListOptions) -> Row:
    """Ray's ActorSummaries.to_summary: actors per class name and state."""
    listed = list_entities(store, session, "actors", options)
    summary: dict[str, Row] = {}
    for a in listed["result"]:
        entry = summary.setdefault(a["class_name"], {"class_name": a["class_name"],
                                                     "state_counts": {}})
        entry["state_counts"][a["state"]] = entry["state_counts"].get(a["state"], 0) + 1
    cluster = {"summary": summary, "total_actors": len(listed["result"]), "summary_by": "class"}
    return {**{k: listed[k] for k in ("total", "num_after_truncation", "num_filtered")},
            "result": {"node_id_to_summary": {"cluster": cluster}},
            "partial_failure_warning": "", "warnings": None}
