"""The Containerfile builds, and its image runs the DaemonSet's pod as the kubelet would:
the root init container hands the host directories over, check-config passes, the agent
takes an event from the host through the mounted socket directory and writes it to Parquet,
and drains on SIGTERM. Needs rootful podman; building takes minutes (wheels from PyPI)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.aggregator.cli.newcomer import evagg
from tests.deploy.manifests import daemonset_parts
from tests.deploy.podman import (
    Podman,
    base_image,
    build_image,
    limits,
    run_args,
    working_podman,
)
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.container,
    pytest.mark.timeout(1800),
    # Opt-in: a first build takes minutes (debootstrap, then every dependency), more
    # than the whole default suite may spend. `EVAGG_TEST_CONTAINER=1 pytest tests/deploy`.
    pytest.mark.skipif(os.environ.get("EVAGG_TEST_CONTAINER") != "1",
                       reason="builds the image for minutes: set EVAGG_TEST_CONTAINER=1 "
                              "to run it"),
    pytest.mark.skipif(shutil.which("podman") is None,
                       reason="podman is not installed: this test builds the Containerfile "
                              "with it (apt-get install podman debootstrap runc)"),
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="needs rootful podman (run as root): the pod's directories are "
                              "handed to the image's uid 10001"),
]
AGENT_UID = 10001
NODE = "test-node"


@pytest.fixture(scope="module")
def podman_image() -> Iterator[tuple[Podman, str]]:
    base = base_image()
    podman = working_podman(base)
    tag = build_image(podman, base)
    yield podman, tag
    podman("rmi", "--force", tag, check=False)


@pytest.fixture
def node() -> Iterator[dict[str, Path]]:
    """The node's side of the pod's volumes, as kubelet leaves them: hostPath directories
    created by root, the ConfigMap and the Secret as files. Under /tmp, since a socket's
    path is limited to about 107 bytes."""
    root = Path(tempfile.mkdtemp(prefix="evagg-node-", dir="/tmp"))
    config_map, _, _ = daemonset_parts()
    volumes = {name: root / name for name in ("config", "token", "socket-dir", "state")}
    for path in volumes.values():
        path.mkdir(mode=0o755)
    # The bucket's stand-in: a local directory the agent may write.
    lake = root / "lake"
    lake.mkdir()
    os.chown(lake, AGENT_UID, AGENT_UID)
    toml = config_map.data["evagg.toml"]
    assert 'url = "s3://my-bucket/evagg/"' in toml
    (volumes["config"] / "evagg.toml").write_text(
        toml.replace('url = "s3://my-bucket/evagg/"', 'url = "/lake/"'))
    token = volumes["token"] / "token"
    token.write_text("node-test-token")
    os.chown(token, 0, AGENT_UID)  # the Secret's defaultMode 0440 with the pod's fsGroup
    token.chmod(0o440)
    yield {**volumes, "lake": lake}
    shutil.rmtree(root, ignore_errors=True)


def run_init_containers(podman: Podman, image: str, pod: Any, volumes: dict[str, Path]) -> None:
    for container in pod.init_containers:
        done = podman("run", "--rm", *run_args(container, pod, volumes, NODE), image,
                      *container.command, check=False)
        assert done.returncode == 0, (
            f"init container {container.name} failed:\n{done.stdout}{done.stderr}")


def test_the_image_runs_the_daemonsets_pod_and_takes_events_from_the_host(
        podman_image: tuple[Podman, str], node: dict[str, Path]) -> None:
    podman, image = podman_image
    _, daemonset, agent = daemonset_parts()
    pod = daemonset.spec.template.spec
    run_init_containers(podman, image, pod, node)
    assert {node[d].stat().st_uid for d in ("socket-dir", "state")} == {AGENT_UID}

    name = f"evagg-test-{uuid.uuid4().hex[:8]}"
    podman("run", "--detach", f"--name={name}", *run_args(agent, pod, node, NODE),
           f"--volume={node['lake']}:/lake", image, *agent.command)
    try:
        socket = node["socket-dir"] / "events.sock"
        wait_until(socket.exists, 120, lambda: f"the agent's socket; its log:\n"
                   f"{podman('logs', name, check=False).stderr[-3000:]}")
        sent = evagg("emit", "--kind", "task", "--name", "from-the-host", "--state",
                     "FINISHED", "--field", "duration_s=0.5",
                     env={"EVAGG_SOCKET": str(socket)})
        assert sent.returncode == 0, sent.stderr
        podman("stop", f"--time={pod.termination_grace_period_seconds}", name, timeout=180)
        state = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        log = podman("logs", name).stderr
    finally:
        podman("rm", "--force", "--time=0", name, check=False)
    assert state == "0", log[-3000:]
    last = json.loads(log.strip().splitlines()[-1])  # EVAGG_LOG_FORMAT=json
    assert "every spooled event was delivered" in last["message"], last
    rows = duckdb.sql(
        "SELECT name, state, duration_s, node_id FROM read_parquet("
        f"'{node['lake']}/**/*.parquet', hive_partitioning=true) WHERE kind = 'task'"
    ).fetchall()
    assert rows == [("from-the-host", "FINISHED", 0.5, NODE)]


def test_the_image_runs_as_uid_10001_with_nothing_that_gains_privileges(
        podman_image: tuple[Podman, str]) -> None:
    podman, image = podman_image
    plain = ["run", "--rm", "--network=none", "--read-only", *limits()]
    done = podman(*plain, "--user=0", image, "sh", "-c",
                  "find / -xdev -type f -perm /6000 | wc -l")
    assert done.stdout.strip() == "0"  # no setuid or setgid program, even for root
    done = podman(*plain, image, "sh", "-c", "id -u; evagg --version")
    assert done.stdout.split() == [str(AGENT_UID), "evagg", version("evagg")]
    config = json.loads(podman("image", "inspect", "--format", "{{json .Config}}",
                               image).stdout)
    assert (config["User"], config["Cmd"]) == (f"{AGENT_UID}:{AGENT_UID}", ["evagg", "run"])
    assert "EVAGG_CONFIG=/etc/evagg/evagg.toml" in config["Env"]
