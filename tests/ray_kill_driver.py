"""A Ray driver that leaves every kind of work in flight, for tests that SIGKILL it.

Run as `python -m tests.ray_kill_driver GCS_ADDRESS`: it joins that cluster (two CPUs),
then submits two tasks that run (sleeping), two that wait for a CPU, one that waits for
an argument still being computed, and an actor whose method is running. It prints one
JSON line (its job id) once all of it is submitted, then sleeps until killed.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    import ray

    ray.init(address=sys.argv[1], log_to_driver=False)

    @ray.remote(num_cpus=1)
    def sleeper(i: int) -> int:
        time.sleep(3600)
        return i

    @ray.remote(num_cpus=0)
    def needs_argument(value: int) -> int:
        return value

    @ray.remote(num_cpus=0)
    class Holder:
        def hold(self) -> int:
            time.sleep(3600)
            return 0

    holder = Holder.remote()  # type: ignore[attr-defined]
    running = [sleeper.remote(i) for i in range(2)]
    waiting = [sleeper.remote(i) for i in range(2, 4)]
    in_flight = [*running, *waiting, needs_argument.remote(running[0]), holder.hold.remote()]
    print(json.dumps({"job_id": ray.get_runtime_context().get_job_id(),
                      "submitted": len(in_flight)}), flush=True)
    time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
