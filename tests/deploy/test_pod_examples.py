"""The example pods in deploy/ reach the node's agent the ways the docs describe: the
socket through the hostPath directory, OTLP and Ray's Event Export through the agent's
hostPort on the node's address, with the ingest token."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from emitters.otel import default_otlp_endpoint
from tests.deploy.manifests import (
    REPO,
    as_model,
    configmap_config,
    container_env,
    daemonset_parts,
    documents,
)

EXAMPLES = ["training-pod-example.yaml", "ray-pod-example.yaml"]
TOKEN = "<secret evagg-ingest-token/token>"


def example_container(name: str) -> tuple[Any, Any]:
    (pod,) = [as_model(doc) for doc in documents(name)]
    (container,) = pod.spec.containers
    return pod, container


def agent_on_the_node() -> str:
    """host:port where a pod on the node reaches the agent: the node's address, as the
    downward API gives it, and the DaemonSet's hostPort."""
    _, _, agent = daemonset_parts()
    (http,) = [p for p in agent.ports if p.name == "http"]
    assert http.host_port == http.container_port
    return f"<status.hostIP>:{http.host_port}"


@pytest.mark.parametrize("name", EXAMPLES)
def test_pod_example_reaches_the_agent_socket(name: str, tmp_path: Path) -> None:
    config_map, daemonset, _ = daemonset_parts()
    config = configmap_config(config_map, tmp_path)
    pod, container = example_container(name)
    assert container_env(container)["EVAGG_SOCKET"] == str(config.socket)
    agent_dirs = {v.host_path.path for v in daemonset.spec.template.spec.volumes if v.host_path}
    socket_dir = str(PurePosixPath(config.socket).parent)
    (mount,) = [m for m in container.volume_mounts if m.mount_path == socket_dir]
    (volume,) = [v for v in pod.spec.volumes if v.name == mount.name]
    assert volume.host_path.path in agent_dirs
    # the pod may land on a node before the agent's pod has made the directory
    assert volume.host_path.type == "DirectoryOrCreate"
    assert config.socket_mode & 0o006 == 0o006  # pods run as any uid


def test_trainer_sends_otlp_to_the_agent_on_its_node_with_the_token(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, trainer = example_container("training-pod-example.yaml")
    env = container_env(trainer)
    node = agent_on_the_node()
    assert env["EVAGG_HTTP_LISTEN"] == node
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://{node}"
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == f"Authorization=Bearer%20{TOKEN}"
    # emitters.otel's OTLP exporter takes its endpoint from EVAGG_HTTP_LISTEN.
    monkeypatch.setenv("EVAGG_HTTP_LISTEN", node.replace("<status.hostIP>", "10.1.2.3"))
    assert default_otlp_endpoint() == f"http://10.1.2.3:{node.rpartition(':')[2]}/v1/traces"


def ray_md_switches() -> dict[str, str]:
    """The variables docs/ray.md's "Turn it on" table sets, with their values."""
    text = (REPO / "docs" / "ray.md").read_text()
    section = text.split("## Turn it on", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Za-z_]+)` \| `([^`]+)`", section, re.MULTILINE)
    return dict(rows)


def test_ray_pod_exports_ray_events_to_the_agent_on_its_node() -> None:
    _, ray = example_container("ray-pod-example.yaml")
    env = container_env(ray)
    switches = ray_md_switches()
    assert "RAY_enable_ray_event" in switches  # the table was read
    for name, value in switches.items():
        if value == "1":
            assert env.get(name) == "1", f"{name} is not turned on"
    documented = switches["RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR"]
    route = "/" + documented.split("/", 3)[3]
    # Ray's exporter sends no headers: the token goes in the URL, on this route only.
    assert env["RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR"] == (
        f"http://{agent_on_the_node()}{route}?token={TOKEN}")
    (token_ref,) = [v.value_from.secret_key_ref for v in ray.env
                    if v.value_from and v.value_from.secret_key_ref]
    assert not token_ref.optional  # without it Ray's POSTs get 401 and are retried forever


def test_ray_pod_writes_its_logs_where_the_agent_reads_them() -> None:
    _, daemonset, agent = daemonset_parts()
    pod, ray = example_container("ray-pod-example.yaml")
    (read,) = [m for m in agent.volume_mounts if m.name == "ray-logs"]
    host = {v.name: v.host_path.path for v in daemonset.spec.template.spec.volumes
            if v.host_path}["ray-logs"]
    (written,) = [m for m in ray.volume_mounts if m.mount_path == "/tmp/ray"]  # Ray's default
    (volume,) = [v for v in pod.spec.volumes if v.name == written.name]
    # the same node directory at the same path: Ray's events name files by that path
    assert (volume.host_path.path, written.mount_path) == (host, read.mount_path)
