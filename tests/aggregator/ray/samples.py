"""Ray's Event Export for the Ray room's tests: the payloads captured from Ray
(tests/fixtures/ray, from shared/ray_samples) and bodies made from them the way a busy
node sends them."""

from __future__ import annotations

import base64
import copy
import json
import os
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ray"
ALL_FIXTURES = sorted(FIXTURES.glob("*.json"))


def load(name: str) -> list[dict[str, Any]]:
    data = json.loads((FIXTURES / name).read_text())
    events: list[dict[str, Any]] = data["events"] if isinstance(data, dict) else data
    return events


def all_samples() -> list[dict[str, Any]]:
    return [event for path in ALL_FIXTURES for event in load(path.name)]


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def generated_events(count: int) -> list[dict[str, Any]]:
    """Bodies the way a busy Ray node sends them: per task its definition, the owner's
    lifecycle event and the executor's RUNNING event; one task in 5 fails."""
    running, _, definition, owner, _, failed = load(
        "02_excerpt_task_lifecycle_normal_and_failed.json")
    out: list[dict[str, Any]] = []
    for task in range(count // 3 + 1):
        task_id = b64(os.urandom(8) + b"\xff" * 12 + b"\x01\x00\x00\x00")
        for template in (definition, failed if task % 5 == 4 else owner, running):
            event = copy.deepcopy(template)
            event["eventId"] = b64(os.urandom(28))
            payload = event.get("taskLifecycleEvent") or event["taskDefinitionEvent"]
            payload["taskId"] = task_id
            out.append(event)
    return out[:count]
