"""Placement groups through Ray's own `ray list placement-groups`, against evagg.

A local Ray 2.60 exports no placement-group events (tests/dashboard/test_raystate_live.py
meets the empty list), so these are written here, beside the job's tasks, from its schema
(shared/ray_samples/schema_ray_2.60.0_events.txt: PlacementGroupDefinitionEvent and
PlacementGroupLifecycleEvent), POSTed to a real agent's /ray/events as Ray's exporter
posts them, and read back with Ray's CLI from `evagg dashboard`'s State API: what a
user runs after the cluster is gone.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from dashboard.lake.store import Store, StoreOptions
from tests.agentproc import AgentProcess
from tests.dashboard.ray_export import DRIVER, JOB, NIL_ACTOR, NODE, at, attempt, b64, envelope
from tests.dashboard.serve import serving
from tests.raycli import ray_list

TRAINING = bytes.fromhex("7d1f3c0a9b2e4f6d8c1a5b3e") + JOB + bytes(2)  # 18 bytes, as Ray's
SCRATCH = bytes.fromhex("0c4b7a2e9d1f3a6b5c8e0d2f") + JOB + bytes(2)


def group(pg_id: bytes, name: str, bundles: list[dict[str, float]],
          states: list[tuple[str, float]], detached: bool = False) -> list[dict[str, Any]]:
    """A group's definition, then its lifecycle, as the GCS exports them."""
    definition = {"placementGroupId": b64(pg_id), "name": name, "rayNamespace": "anonymous",
                  "strategy": "PACK", "isDetached": detached, "creatorJobId": b64(JOB),
                  "bundles": [{"bundleIndex": i, "unitResources": r}
                              for i, r in enumerate(bundles)],
                  "creationRequestReceivedNs": "1796558723000000000"}
    transitions = [{"state": state, "timestamp": at(t), "schedulingState": "FINISHED",
                    "bundlePlacements": [{"bundleIndex": i, "nodeId": b64(NODE)}
                                         for i in range(len(bundles))]}
                   for state, t in states]
    for event in (e := [envelope("PLACEMENT_GROUP_DEFINITION_EVENT",
                                 "placementGroupDefinitionEvent", definition, at(states[0][1])),
                        envelope("PLACEMENT_GROUP_LIFECYCLE_EVENT",
                                 "placementGroupLifecycleEvent",
                                 {"placementGroupId": b64(pg_id),
                                  "stateTransitions": transitions}, at(states[-1][1]))]):
        event["sourceType"] = "GCS"
    return e


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # the job's driver and a task it ran in the training group: a cluster's tasks name
    # its session (dashboard/raystate/sessions.py)
    train = attempt(bytes(8) + NIL_ACTOR, "train", start=2.5, run_s=4.0)
    train[0]["taskDefinitionEvent"]["placementGroupId"] = b64(TRAINING)
    body = json.dumps(
        attempt(DRIVER, "", task_type="DRIVER_TASK", start=0.0, run_s=10.0) + train
        + group(TRAINING, "training", [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 4.0, "GPU": 1.0}],
              [("PENDING", 1.0), ("CREATED", 2.0)], detached=True)
        + group(SCRATCH, "scratch", [{"CPU": 1.0}],
                [("PENDING", 3.0), ("CREATED", 3.5), ("REMOVED", 9.0)])).encode()
    agent = AgentProcess(tmp_path_factory.mktemp("agent")).start()
    try:
        request = urllib.request.Request(f"{agent.http_url}/ray/events", data=body,
                                         method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
        assert agent.stop() == 0  # drains what it took to Parquet
    finally:
        if agent.running:
            agent.kill()
    with serving(Store(StoreOptions(str(agent.lake_dir)))) as url:
        yield url


def test_ray_list_placement_groups_shows_each_group_as_its_events_left_it(
        dashboard: str) -> None:
    groups = {g["name"]: g for g in ray_list(dashboard, "placement-groups")}
    assert set(groups) == {"training", "scratch"}
    training, scratch = groups["training"], groups["scratch"]
    assert training["placement_group_id"] == TRAINING.hex()
    assert training["creator_job_id"] == JOB.hex()
    assert (training["state"], scratch["state"]) == ("CREATED", "REMOVED")  # the last move
    assert (training["is_detached"], scratch["is_detached"]) == (True, False)
    assert [b["unit_resources"] for b in training["bundles"]] == [
        {"CPU": 4.0, "GPU": 1.0}, {"CPU": 4.0, "GPU": 1.0}]


def test_rays_filter_on_state_is_answered_by_evagg(dashboard: str) -> None:
    def named(state_filter: str) -> list[str]:
        return [g["name"] for g in ray_list(dashboard, "placement-groups", "--filter",
                                            state_filter)]

    assert named("state=CREATED") == ["training"]
    assert named("state!=CREATED") == ["scratch"]
