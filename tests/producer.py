"""A producer process for end-to-end tests: emits numbered events, reports what happened.

Run as `python -m tests.producer --socket S --prefix P --count N [--seconds T]`.
Every event carries task_id "<prefix>-<i>", so a test can check each arrived exactly once.
It prints one JSON line: events emitted, exceptions raised by emit(), the slowest emit()
call, whether the final flush was acknowledged, and the events dropped by reason.
`--done-file F` is created once every event is emitted, so that a test can wait for the
end of the emit loop; `--end exit` skips the flush and leaves the delivery to the
interpreter's exit (the emitter's at-exit close).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import orjson


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument(
        "--seconds", type=float, default=0.0, help="spread the events over this long"
    )
    parser.add_argument("--flush-timeout", type=float, default=60.0)
    parser.add_argument("--buffer-bytes", type=int, default=0)
    parser.add_argument("--frames", choices=["columns", "ndjson"], default="columns")
    parser.add_argument("--max-pending", type=int, default=0)
    parser.add_argument("--done-file", default="")
    parser.add_argument("--end", choices=["flush", "exit"], default="flush")
    parser.add_argument("--exit-timeout", type=float, default=0.0)
    parser.add_argument("--ack-timeout", type=float, default=0.0)
    args = parser.parse_args()

    import emitters

    options: dict[str, object] = {"socket": args.socket, "job_id": "e2e", "run_id": args.prefix,
                                  "frames": args.frames}
    if args.buffer_bytes:
        options["max_buffer_bytes"] = args.buffer_bytes
    if args.max_pending:
        options["max_pending"] = args.max_pending
    if args.exit_timeout:
        options["exit_timeout"] = args.exit_timeout
    if args.ack_timeout:
        options["ack_timeout"] = args.ack_timeout
    emitters.configure(**options)
    raised = 0
    slowest_ns = 0
    pause = args.seconds / args.count if args.seconds else 0.0
    for i in range(args.count):
        started = time.perf_counter_ns()
        try:
            emitters.emit(
                kind="task",
                name="work",
                state="FINISHED",
                task_id=f"{args.prefix}-{i}",
                step=i,
                duration_s=0.001,
                metrics={"loss": 1.0 / (i + 1)},
            )
        except Exception:
            raised += 1
        slowest_ns = max(slowest_ns, time.perf_counter_ns() - started)
        if pause and i % 100 == 99:
            time.sleep(pause * 100)
    if args.done_file:
        Path(args.done_file).touch()
    flushed = emitters.flush(args.flush_timeout) if args.end == "flush" else None
    stats = emitters.stats()
    print(
        orjson.dumps(
            {"emitted": args.count, "raised": raised, "slowest_ns": slowest_ns, "flushed": flushed,
             "columns_frames": stats.counters.get("columns_frames", 0),
             "dropped": dict(stats.dropped)}
        ).decode(),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
