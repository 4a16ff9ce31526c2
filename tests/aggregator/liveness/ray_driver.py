"""A Ray driver for the liveness tests: starts its own local cluster (its own temp dir
and ports) exporting into the test's agent, leaves work in flight and waits.

Run as `python -m tests.aggregator.liveness.ray_driver TEMP_DIR DASHBOARD_PORT` in a
session of its own: every process of the cluster (GCS, raylet, Ray's agents, workers)
is then in the driver's process group, which the test kills at once. In flight: two
tasks RUNNING (sleeping), two PENDING behind them (no CPU left), an actor whose method
is RUNNING. Prints one JSON line (job id, session) once all of it was submitted.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    import ray

    temp_dir, dashboard_port = sys.argv[1], int(sys.argv[2])
    ray.init(num_cpus=2, include_dashboard=True, dashboard_port=dashboard_port,
             _temp_dir=temp_dir, log_to_driver=False)

    @ray.remote(num_cpus=1)
    def sleeper(i: int) -> int:
        time.sleep(3600)
        return i

    @ray.remote(num_cpus=0)
    class Holder:
        def hold(self) -> int:
            time.sleep(3600)
            return 0

    holder = Holder.remote()  # type: ignore[attr-defined]
    in_flight = [sleeper.remote(i) for i in range(4)] + [holder.hold.remote()]
    context = ray.get_runtime_context()
    print(json.dumps({"job_id": context.get_job_id(), "pid": __import__("os").getpid(),
                      "refs": len(in_flight)}), flush=True)
    time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
