"""The shipped Kubernetes manifests as the API server would read them: every field checked
against the official client's models, and the environment a container's process gets."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes.client as k8s  # type: ignore[import-untyped]
import yaml  # type: ignore[import-untyped]

from aggregator.config import load_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict[(\[]str, (.+)[)\]]$")
_PRIMITIVES: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "bool": bool,
                                                   "float": (int, float)}


def check_strictly(data: Any, type_name: str, where: str) -> list[str]:
    """Problems of `data` as the model `type_name`: unknown fields and wrong types.

    The client's own deserializer drops unknown fields silently; this does not."""
    if match := _LIST.match(type_name):
        if not isinstance(data, list):
            return [f"{where}: expected a list"]
        return [p for i, item in enumerate(data)
                for p in check_strictly(item, match.group(1), f"{where}[{i}]")]
    if match := _DICT.match(type_name):
        if not isinstance(data, dict):
            return [f"{where}: expected a map"]
        value_type = match.group(1)
        if where.endswith((".limits", ".requests")):  # Quantity: a number or a string
            value_type = "object"
        return [p for key, value in data.items()
                for p in check_strictly(value, value_type, f"{where}.{key}")]
    if type_name in _PRIMITIVES:
        ok = isinstance(data, _PRIMITIVES[type_name])
        return [] if ok else [f"{where}: expected {type_name}, got {data!r}"]
    if type_name == "object":
        return []  # int-or-string and the like
    model = getattr(k8s, type_name)
    if not isinstance(data, dict):
        return [f"{where}: expected an object ({type_name})"]
    by_json = {json: attr for attr, json in model.attribute_map.items()}
    problems = []
    for key, value in data.items():
        if key not in by_json:
            problems.append(f"{where}.{key}: not a field of {type_name}")
            continue
        problems += check_strictly(value, model.openapi_types[by_json[key]], f"{where}.{key}")
    return problems


def as_model(doc: dict[str, Any]) -> Any:
    group_version = doc["apiVersion"].split("/")[-1].capitalize()
    type_name = f"{group_version}{doc['kind']}"
    assert check_strictly(doc, type_name, doc["kind"]) == []
    # The client's models then check required fields and enumerations on construction.
    return k8s.ApiClient()._ApiClient__deserialize(doc, type_name)


def daemonset_parts() -> tuple[Any, Any, Any]:
    """The agent's ConfigMap, its DaemonSet and the DaemonSet's one container, as models."""
    docs = {doc["kind"]: as_model(doc) for doc in documents("evagg-daemonset.yaml")}
    config_map, daemonset = docs["ConfigMap"], docs["DaemonSet"]
    (container,) = daemonset.spec.template.spec.containers
    return config_map, daemonset, container


_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def container_env(container: Any) -> dict[str, str]:
    """A container's variables as its process sees them: `$(NAME)` expanded from the
    variables before it, as the kubelet does; a value from the downward API or a Secret
    stands as `<status.hostIP>` or `<secret evagg-ingest-token/token>`."""
    env: dict[str, str] = {}
    for var in container.env or []:
        if var.value_from is None:
            env[var.name] = _REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)),
                                           var.value or "")
        elif var.value_from.field_ref is not None:
            env[var.name] = f"<{var.value_from.field_ref.field_path}>"
        else:
            ref = var.value_from.secret_key_ref
            env[var.name] = f"<secret {ref.name}/{ref.key}>"
    return env


def configmap_config(config_map: Any, tmp_path: Path) -> Any:
    """Load the ConfigMap's TOML as the pod would, with the token Secret mounted here."""
    token = tmp_path / "token"
    token.write_text("test-token\n")
    text = config_map.data["evagg.toml"].replace("/etc/evagg-token/token", str(token))
    assert text != config_map.data["evagg.toml"], "the DaemonSet must require an ingest token"
    path = tmp_path / "evagg.toml"
    path.write_text(text)
    return load_config(path, env={})
