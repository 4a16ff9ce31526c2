"""A real local Ray cluster for the tests that need one (Ray's Event Export, Ray Data)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from tests.ports import free_port


@contextlib.contextmanager
def local_ray(env: dict[str, str], dashboard: bool = True, num_cpus: int = 2) -> Iterator[str]:
    """A local Ray cluster with `env` in the environment it starts with (put back after);
    yields its job id. `dashboard` also starts Ray's per-node agent, the one that exports
    events."""
    import ray

    # RAY_ADDRESS (a user's shell may have one) would make ray.init() join that cluster.
    saved = {key: os.environ.get(key) for key in [*env, "RAY_ADDRESS"]}
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.update(env)
    # Ray puts Unix sockets under its temp dir, whose paths must stay short.
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=dashboard,
                 dashboard_port=free_port() if dashboard else None,
                 _temp_dir=temp_dir, log_to_driver=False)
        yield ray.get_runtime_context().get_job_id()
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(temp_dir, ignore_errors=True)
