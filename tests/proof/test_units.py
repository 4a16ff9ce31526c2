"""The shipped units and manifests: systemd's own verifier and security review on the units,
the Kubernetes schema (the official client's models, every field checked) on the DaemonSet
and the pod example, and the facts that tie them to the agent's configuration.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes.client as k8s  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]

from aggregator.config import load_config
from sinks.units import parse_duration

REPO = Path(__file__).resolve().parents[2]
UNITS = ("evagg.service", "evagg.socket")
MAX_EXPOSURE = 2.0  # systemd-analyze security: 0 is locked down, 10 is exposed


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(REPO / "systemd" / name)
    return parser


@pytest.fixture(scope="module")
def unit_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A filesystem root for systemd-analyze: the system's own units, the commands the
    units run (the agent as a stub) and our units in /etc/systemd/system."""
    root = tmp_path_factory.mktemp("root")
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    for command in ("/usr/local/bin/evagg", "/bin/kill"):
        path = root / command.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    target = root / "etc/systemd/system"
    target.mkdir(parents=True)
    for name in UNITS:
        shutil.copy(REPO / "systemd" / name, target / name)
    return root


def analyze(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", *args, f"--root={root}",
                           *[str(root / "etc/systemd/system" / name) for name in UNITS]],
                          capture_output=True, text=True, timeout=60, check=False)


def test_systemd_analyze_verify_is_clean(unit_root: Path) -> None:
    done = analyze(unit_root, "verify", "--man=no")
    # Unknown keys and bad values are warnings on stderr with exit status 0: demand silence.
    assert (done.returncode, done.stderr.strip(), done.stdout.strip()) == (0, "", "")


def test_systemd_analyze_verify_would_catch_a_typo(unit_root: Path, tmp_path: Path) -> None:
    """The check above has teeth: a misspelt directive is reported."""
    broken = tmp_path / "root"
    shutil.copytree(unit_root, broken, symlinks=True)
    service = broken / "etc/systemd/system/evagg.service"
    service.write_text(service.read_text().replace("NoNewPrivileges=", "NoNewPrivilege="))
    assert "Unknown key" in analyze(broken, "verify", "--man=no").stderr


def test_service_hardening_scores_ok(unit_root: Path) -> None:
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes",
                           f"--root={unit_root}",
                           str(unit_root / "etc/systemd/system/evagg.service")],
                          capture_output=True, text=True, timeout=60, check=False)
    found = re.search(r"Overall exposure level for evagg.service: ([\d.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    assert float(found.group(1)) <= MAX_EXPOSURE


def test_units_agree_with_the_example_config(tmp_path: Path) -> None:
    config = load_config(REPO / "systemd" / "evagg.toml", env={})
    service, sock = unit("evagg.service"), unit("evagg.socket")
    assert sock["Socket"]["ListenStream"] == str(config.socket)
    assert int(sock["Socket"]["SocketMode"], 8) == config.socket_mode
    assert sock["Socket"]["SocketGroup"] == config.socket_group
    s = service["Service"]
    assert s["Type"] == "notify" and s["NotifyAccess"] == "main"  # READY=1 from the agent
    assert "HUP" in s["ExecReload"]
    assert parse_duration(s["TimeoutStopSec"] + "s") > config.drain_timeout_s
    assert s["StateDirectory"] == PurePosixPath(config.state_dir).name
    assert s["RuntimeDirectory"] == PurePosixPath(config.socket).parent.name
    assert s["RuntimeDirectoryPreserve"] == "yes"  # a restart must not delete the socket
    assert "evagg.socket" in service["Unit"]["Requires"]


# -- Kubernetes -----------------------------------------------------------------------------

def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / "deploy" / name).read_text()) if d]


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


@pytest.mark.parametrize("name", ["evagg-daemonset.yaml", "training-pod-example.yaml"])
def test_every_manifest_document_fits_the_kubernetes_schema(name: str) -> None:
    for doc in documents(name):
        model = as_model(doc)
        assert model.kind == doc["kind"]


def test_strict_check_catches_a_misplaced_field() -> None:
    (pod,) = documents("training-pod-example.yaml")
    pod["spec"]["containers"][0]["volumeMount"] = []
    assert check_strictly(pod, "V1Pod", "Pod") == [
        "Pod.spec.containers[0].volumeMount: not a field of V1Container"]


def daemonset_parts() -> tuple[Any, Any, Any]:
    docs = {doc["kind"]: as_model(doc) for doc in documents("evagg-daemonset.yaml")}
    config_map, daemonset = docs["ConfigMap"], docs["DaemonSet"]
    (container,) = daemonset.spec.template.spec.containers
    return config_map, daemonset, container


def configmap_config(config_map: Any, tmp_path: Path) -> Any:
    """Load the ConfigMap's TOML as the pod would, with the token Secret mounted here."""
    token = tmp_path / "token"
    token.write_text("test-token\n")
    text = config_map.data["evagg.toml"].replace("/etc/evagg-token/token", str(token))
    assert text != config_map.data["evagg.toml"], "the DaemonSet must require an ingest token"
    path = tmp_path / "evagg.toml"
    path.write_text(text)
    return load_config(path, env={})


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
    agent_volumes = {m.name for m in container.volume_mounts} & host_volumes
    preparers = [c for c in pod.init_containers or []
                 if c.security_context and c.security_context.run_as_user == 0
                 and agent_volumes <= {m.name for m in c.volume_mounts}
                 and "CHOWN" in (c.security_context.capabilities.add or [])
                 and str(uid) in " ".join(c.command or [])]
    assert preparers, "no root init container chowns the hostPath directories to the agent"
    (preparer,) = preparers
    assert pod.init_containers.index(preparer) == 0  # before anything writes there
    run_preparer_here(preparer, tmp_path, uid)


def run_preparer_here(preparer: Any, tmp_path: Path, uid: int) -> None:
    """Run the init container's command against two local directories (the test is root):
    both end up owned by the agent's uid."""
    program, *args = preparer.command
    assert PurePosixPath(program).name.startswith("python")
    paths = {m.mount_path: tmp_path / m.name for m in preparer.volume_mounts}
    script = args[-1]
    for mount_path, local in paths.items():
        local.mkdir()
        script = script.replace(f'"{mount_path}"', f'"{local}"')
    subprocess.run([sys.executable, *args[:-1], script], check=True, timeout=30)
    assert {local.stat().st_uid for local in paths.values()} == {uid}


def test_pod_example_reaches_the_agent_socket(tmp_path: Path) -> None:
    config_map, daemonset, _ = daemonset_parts()
    config = configmap_config(config_map, tmp_path)
    (pod,) = [as_model(doc) for doc in documents("training-pod-example.yaml")]
    (trainer,) = pod.spec.containers
    env = {e.name: e.value for e in trainer.env}
    assert env["EVAGG_SOCKET"] == str(config.socket)
    agent_dirs = {v.host_path.path for v in daemonset.spec.template.spec.volumes if v.host_path}
    (volume,) = [v for v in pod.spec.volumes if v.host_path]
    assert volume.host_path.path in agent_dirs
    (mount,) = [m for m in trainer.volume_mounts if m.name == volume.name]
    assert mount.mount_path == str(PurePosixPath(config.socket).parent)
    assert config.socket_mode & 0o006 == 0o006  # pods run as any uid

