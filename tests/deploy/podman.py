"""Rootful podman for the image test: find a way it can start containers on this machine,
build the Containerfile, and run a DaemonSet container as the kubelet would."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.manifests import DEPLOY, REPO, container_env

DEBIAN_BASE = "localhost/evagg-debian-base:bookworm"


def limits() -> list[str]:
    """Limits this process may pass on. Rootful podman otherwise asks the runtime for more
    than it may set without CAP_SYS_RESOURCE ("setrlimit ... operation not permitted");
    65536 open files is the unit's LimitNOFILE, 4096 processes plenty for the agent."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
    return [f"--ulimit=nofile={nofile}:{nofile}", "--ulimit=nproc=4096:4096"]


@dataclass
class Podman:
    global_args: list[str]

    def __call__(self, *args: str, timeout: float = 120,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["podman", *self.global_args, *args], capture_output=True,
                              text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            pytest.fail(f"podman {' '.join(args[:2])} failed ({done.returncode}):\n"
                        f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
        return done


def working_podman(base: str) -> Podman:
    """The podman invocation that can start a container here: the default OCI runtime, or
    runc where the default cannot (crun refuses hybrid cgroup hierarchies)."""
    tried = []
    for global_args in ([], ["--runtime", "runc"] if shutil.which("runc") else None):
        if global_args is None:
            continue
        podman = Podman(global_args)
        done = podman("run", "--rm", "--network=none", *limits(), base, "true", check=False)
        if done.returncode == 0:
            return podman
        tried.append(f"podman {' '.join(global_args)}: {done.stderr.strip()[-300:]}")
    # Only EVAGG_TEST_CONTAINER=1 gets here: asked for, the image test must not pass unrun.
    pytest.fail("podman cannot start a container on this machine: " + "; ".join(tried))


def base_image() -> str:
    """A Python 3.11 Debian image to build on: $EVAGG_TEST_BASE_IMAGE (where a registry is
    reachable, the Containerfile's default), else one made from Debian's archive by
    deploy/debian-base.sh, once per machine."""
    if named := os.environ.get("EVAGG_TEST_BASE_IMAGE"):
        return named
    if Podman([])("image", "exists", DEBIAN_BASE, check=False).returncode == 0:
        return DEBIAN_BASE
    if not shutil.which("debootstrap"):
        pytest.fail("no base image: set EVAGG_TEST_BASE_IMAGE to a Debian image with "
                    "python3 3.11, or install debootstrap so deploy/debian-base.sh makes one")
    done = subprocess.run([str(DEPLOY / "debian-base.sh"), DEBIAN_BASE], capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 0, f"deploy/debian-base.sh failed:\n{done.stderr[-3000:]}"
    return DEBIAN_BASE


def build_image(podman: Podman, base: str) -> str:
    """Build the repository's Containerfile on `base`; returns the image's tag. pip in the
    build trusts the CA bundle pip trusts here, if one is named (a TLS-inspecting proxy)."""
    tag = f"localhost/evagg-test:{uuid.uuid4().hex[:12]}"
    args = ["build", "--network=host", *limits(), "--build-arg", f"BASE={base}", "-t", tag]
    bundle = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    if bundle and Path(bundle).is_file():
        args += ["--build-arg", "PIP_CERT=/run/build-ca.crt", "-v",
                 f"{bundle}:/run/build-ca.crt:ro"]
    podman(*args, str(REPO), timeout=1200)
    return tag


def run_args(container: Any, pod: Any, volumes: dict[str, Path],
             node_name: str) -> list[str]:
    """`podman run` flags for a DaemonSet container: its user, groups, securityContext,
    volumes (an emptyDir becomes a tmpfs) and env, with no network."""
    pod_context, context = pod.security_context, container.security_context
    uid = context.run_as_user if context.run_as_user is not None else pod_context.run_as_user
    gid = context.run_as_group if context.run_as_group is not None else pod_context.run_as_group
    args = ["--network=none", *limits(), f"--user={uid}:{gid}",
            f"--group-add={pod_context.fs_group}"]
    if context.read_only_root_filesystem:
        args.append("--read-only")
    if context.allow_privilege_escalation is False:
        args.append("--security-opt=no-new-privileges")
    args += [f"--cap-drop={cap}" for cap in context.capabilities.drop or []]
    args += [f"--cap-add={cap}" for cap in context.capabilities.add or []]
    empty_dirs = {v.name for v in pod.volumes if v.empty_dir}
    for mount in container.volume_mounts:
        if mount.name in empty_dirs:
            args.append(f"--tmpfs={mount.mount_path}")
        else:
            mode = ":ro" if mount.read_only else ""
            args.append(f"--volume={volumes[mount.name]}:{mount.mount_path}{mode}")
    for name, value in container_env(container).items():
        args.append(f"--env={name}={value.replace('<spec.nodeName>', node_name)}")
    return args
