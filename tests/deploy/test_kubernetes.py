"""The Kubernetes manifests in deploy/: every field fits the API schema, one apply (with the
one documented Secret) creates every object the DaemonSet needs, the pods run as locked
down as the systemd unit, and the examples reach the agent the ways the docs describe."""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from tests.deploy.manifests import (
    DEPLOY,
    REPO,
    as_model,
    check_strictly,
    configmap_config,
    daemonset_parts,
    documents,
)

MANIFESTS = ["evagg-daemonset.yaml", "training-pod-example.yaml", "ray-pod-example.yaml"]


@pytest.mark.parametrize("name", MANIFESTS)
def test_every_manifest_document_fits_the_kubernetes_schema(name: str) -> None:
    for doc in documents(name):
        model = as_model(doc)
        assert model.kind == doc["kind"]


def test_strict_check_catches_a_misplaced_field() -> None:
    (pod,) = documents("training-pod-example.yaml")
    pod["spec"]["containers"][0]["volumeMount"] = []
    assert check_strictly(pod, "V1Pod", "Pod") == [
        "Pod.spec.containers[0].volumeMount: not a field of V1Container"]


def documented_secrets() -> dict[tuple[str, str], set[str]]:
    """(namespace, name) -> keys of each `kubectl create secret generic` in the
    operations guide's Kubernetes section."""
    text = (REPO / "docs" / "operations.md").read_text()
    section = text.split("\n## Kubernetes", 1)[1].split("\n## ", 1)[0]
    made: dict[tuple[str, str], set[str]] = {}
    for line in section.splitlines():
        if "create secret generic" not in line:
            continue
        words = shlex.split(line.strip().removeprefix("$ "))
        namespace = words[words.index("-n") + 1] if "-n" in words else "default"
        name = words[words.index("generic") + 1]
        keys = {w.split("=", 2)[1] for w in words if w.startswith("--from-literal=")}
        made[(namespace, name)] = keys
    return made


def references(daemonset: Any) -> list[tuple[str, str, str, bool]]:
    """(kind, namespace, name, optional) of every object the DaemonSet's pods need."""
    namespace = daemonset.metadata.namespace
    pod = daemonset.spec.template.spec
    needed = [("Namespace", "", namespace, False),
              ("ServiceAccount", namespace, pod.service_account_name, False)]
    for volume in pod.volumes:
        if volume.config_map:
            needed.append(("ConfigMap", namespace, volume.config_map.name,
                           bool(volume.config_map.optional)))
        if volume.secret:
            needed.append(("Secret", namespace, volume.secret.secret_name,
                           bool(volume.secret.optional)))
    for container in [*(pod.init_containers or []), *pod.containers]:
        for var in container.env or []:
            for ref, kind in ((var.value_from and var.value_from.secret_key_ref, "Secret"),
                              (var.value_from and var.value_from.config_map_key_ref,
                               "ConfigMap")):
                if ref:
                    needed.append((kind, namespace, ref.name, bool(ref.optional)))
    return needed


def test_one_apply_and_the_documented_secret_give_the_daemonset_all_it_refers_to() -> None:
    applied = {(doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
               for doc in documents("evagg-daemonset.yaml")}
    secrets = documented_secrets()
    (daemonset,) = [as_model(d) for d in documents("evagg-daemonset.yaml")
                    if d["kind"] == "DaemonSet"]
    missing = [(kind, ns, name) for kind, ns, name, optional in references(daemonset)
               if not optional and (kind, ns, name) not in applied
               and not (kind == "Secret" and (ns, name) in secrets)]
    assert missing == []
    namespaces = {name for kind, _, name in applied if kind == "Namespace"}
    assert {ns for _, ns, _ in applied if ns} <= namespaces
    # The Namespace comes first: `kubectl apply -f` creates the objects in file order.
    assert documents("evagg-daemonset.yaml")[0]["kind"] == "Namespace"


def test_the_documented_secret_holds_the_file_the_agent_reads(tmp_path: Path) -> None:
    config_map, daemonset, container = daemonset_parts()
    pod = daemonset.spec.template.spec
    (volume,) = [v for v in pod.volumes if v.secret]
    keys = documented_secrets()[(daemonset.metadata.namespace, volume.secret.secret_name)]
    (mount,) = [m for m in container.volume_mounts if m.name == volume.name]
    token_file = re.search(r'http_token_file = "([^"]+)"', config_map.data["evagg.toml"])
    assert token_file, "the DaemonSet's config must require an ingest token"
    assert {f"{mount.mount_path}/{key}" for key in keys} == {token_file.group(1)}
    assert volume.secret.default_mode & 0o007 == 0  # readable by the agent's group only


def test_kustomization_applies_the_same_file_and_renames_every_image() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["evagg-daemonset.yaml"]
    (image,) = kustomization["images"]
    _, daemonset, _ = daemonset_parts()
    pod = daemonset.spec.template.spec
    used = {c.image for c in [*pod.init_containers, *pod.containers]}
    assert used == {f"{image['name']}:{image['newTag']}"}


def unit_service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(REPO / "systemd" / "evagg.service")
    return parser["Service"]


def test_daemonset_is_as_locked_down_as_the_systemd_unit() -> None:
    service = unit_service()
    _, daemonset, _ = daemonset_parts()
    pod = daemonset.spec.template.spec
    assert pod.security_context.run_as_non_root and pod.security_context.run_as_user != 0
    assert service["User"] != "root"
    assert pod.security_context.seccomp_profile.type == "RuntimeDefault"  # SystemCallFilter
    assert pod.automount_service_account_token is False
    (preparer, *others) = pod.init_containers
    for container in [*others, *pod.containers]:
        context = container.security_context
        assert context.run_as_user in (None, pod.security_context.run_as_user)
        assert context.allow_privilege_escalation is False  # NoNewPrivileges=yes
        assert context.read_only_root_filesystem is True  # ProtectSystem=strict
        assert context.capabilities.drop == ["ALL"] and not context.capabilities.add
    assert (service["NoNewPrivileges"], service["CapabilityBoundingSet"]) == ("yes", "")
    assert service["ProtectSystem"] == "strict"
    # The unit shares the host's /tmp (Ray's logs are read where Ray writes them); the
    # pod's /tmp is its own and bounded, and Ray's log directory is mounted into it.
    tmp = {m.mount_path: m.name for m in pod.containers[0].volume_mounts}["/tmp"]
    assert next(v.empty_dir for v in pod.volumes if v.name == tmp).size_limit
    # Only the first init container is root, for chown alone (see the next test).
    context = preparer.security_context
    assert context.allow_privilege_escalation is False and context.read_only_root_filesystem
    assert set(context.capabilities.add) == {"CHOWN", "FOWNER"}


def test_daemonset_probes_grace_period_and_host_paths(tmp_path: Path) -> None:
    config_map, daemonset, container = daemonset_parts()
    config = configmap_config(config_map, tmp_path)
    pod = daemonset.spec.template.spec
    port = {p.name: p.container_port for p in container.ports}
    assert container.readiness_probe.http_get.path == "/readyz"
    assert container.liveness_probe.http_get.path == "/healthz"
    listen_port = int(config.http_listen.rpartition(":")[2])
    for probe in (container.readiness_probe, container.liveness_probe):
        assert port[probe.http_get.port] == listen_port
    assert pod.termination_grace_period_seconds > config.drain_timeout_s

    host_paths = {v.name: v.host_path.path for v in pod.volumes if v.host_path}
    mounts = {m.mount_path: m.name for m in container.volume_mounts}
    socket_dir = str(PurePosixPath(config.socket).parent)
    assert mounts[socket_dir] in host_paths
    assert mounts[str(config.state_dir)] in host_paths


def test_daemonset_agent_can_write_its_host_directories(tmp_path: Path) -> None:
    """kubelet creates missing hostPath directories as root, mode 0755, and fsGroup does not
    apply to hostPath: an agent that is not root needs them handed over first."""
    _, daemonset, container = daemonset_parts()
    pod = daemonset.spec.template.spec
    uid = (container.security_context and container.security_context.run_as_user) \
        or pod.security_context.run_as_user
    assert uid not in (None, 0)  # the agent itself does not run as root
    host_volumes = {v.name for v in pod.volumes if v.host_path}
    agent_volumes = {m.name for m in container.volume_mounts if not m.read_only} & host_volumes
    preparers = [c for c in pod.init_containers or []
                 if c.security_context and c.security_context.run_as_user == 0
                 and agent_volumes <= {m.name for m in c.volume_mounts}
                 and "CHOWN" in (c.security_context.capabilities.add or [])
                 and str(uid) in " ".join(c.command or [])]
    assert preparers, "no root init container chowns the hostPath directories to the agent"
    (preparer,) = preparers
    assert pod.init_containers.index(preparer) == 0  # before anything writes there
    run_preparer_here(preparer, tmp_path, uid, agent_volumes)


def run_preparer_here(preparer: Any, tmp_path: Path, uid: int, writable: set[str]) -> None:
    """Run the init container's command against local directories (the test is root): the
    agent's own end up owned by its uid; Ray's log directory is open to every uid, as /tmp
    (Ray's pods write there as theirs)."""
    program, *args = preparer.command
    assert PurePosixPath(program).name.startswith("python")
    paths = {m.mount_path: tmp_path / m.name for m in preparer.volume_mounts}
    script = args[-1]
    for mount_path, local in paths.items():
        local.mkdir()
        script = script.replace(f'"{mount_path}"', f'"{local}"')
    subprocess.run([sys.executable, *args[:-1], script], check=True, timeout=30)
    owned = {m.name: (tmp_path / m.name).stat() for m in preparer.volume_mounts}
    assert {owned[name].st_uid for name in writable} == {uid}
    assert owned["ray-logs"].st_mode & 0o7777 == 0o1777


def test_daemonset_sees_producers_pids_and_reads_ray_logs_where_ray_writes_them(
        tmp_path: Path) -> None:
    config_map, daemonset, container = daemonset_parts()
    config = configmap_config(config_map, tmp_path)
    pod = daemonset.spec.template.spec
    assert pod.host_pid is True  # a producer's pid is the node's, for liveness and losses
    (mount,) = [m for m in container.volume_mounts if m.name == "ray-logs"]
    (volume,) = [v for v in pod.volumes if v.name == "ray-logs"]
    assert mount.read_only and mount.mount_path == volume.host_path.path
    assert mount.mount_path == str(config.ray_log_dir)
