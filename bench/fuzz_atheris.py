"""Coverage-guided fuzzing (atheris, libFuzzer) of every decoder that takes outside bytes.

Targets, each in process and bounded by --runs: the wire frame decoder
(`emitters.wire.decode_body` and `FrameBuffer`), the socket payload decoder
(`aggregator.decode.ndjson.decode_ndjson`), the Ray Event Export route's mapping
(`aggregator.ray.batch.ray_body_to_batch`: fast and careful paths), and the OTLP decoder
(protobuf and JSON). A target may only return or raise its documented error type
(FrameError, RayBodyError, OtlpError); anything else is a crash, printed with its input.

    .venv/bin/python bench/fuzz_atheris.py --runs 20000          # every target
    .venv/bin/python bench/fuzz_atheris.py --target ray --runs 200000

Needs `pip install atheris` (wheels for CPython 3.11 on x86-64 Linux). Each target runs in
its own process, so one crash does not hide the others.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("wire", "ndjson", "ray", "otlp_protobuf", "otlp_json")


def target(name: str) -> Callable[[bytes], None]:
    import atheris  # type: ignore[import-untyped]

    with atheris.instrument_imports():
        from aggregator.decode import otlp
        from aggregator.decode.ndjson import decode_ndjson
        from aggregator.decode.normalize import Stamp, rows_to_batch
        from aggregator.ray import batch as ray_batch
        from aggregator.ray import events as ray_events
        from emitters import wire
        from sinks.schema import batch_to_bytes

    def fuzz_wire(data: bytes) -> None:
        with contextlib.suppress(wire.FrameError):
            wire.decode_body(data)
        buffer = wire.FrameBuffer(max_frame_bytes=4096)
        buffer.feed(data)
        with contextlib.suppress(wire.FrameError):
            buffer.frames()

    def fuzz_ndjson(data: bytes) -> None:
        decode_ndjson(data, Stamp.now("node", "host", pid=1, uid=0))

    recent = ray_events.RecentEventIds(capacity=1000)

    def fuzz_ray(data: bytes) -> None:
        # What the /ray/events route runs: only RayBodyError (a 400) may escape; anything
        # else is a 500, and Ray resends a body answered with one forever.
        try:
            mapped = ray_batch.ray_body_to_batch(data, recent, Stamp.now("node", "host"))
        except ray_events.RayBodyError:
            return
        batch_to_bytes(mapped.batch)
        recent.settle(mapped.claim, stored=len(data) % 2 == 0)  # writes that fail, too

    def otlp_of(content_type: str) -> Callable[[bytes], None]:
        def fuzz(data: bytes) -> None:
            try:
                decoded = otlp.decode_otlp_traces(data, content_type)
            except otlp.OtlpError:
                return
            rows_to_batch(decoded.rows, Stamp.now())
        return fuzz

    return {"wire": fuzz_wire, "ndjson": fuzz_ndjson, "ray": fuzz_ray,
            "otlp_protobuf": otlp_of("application/x-protobuf"),
            "otlp_json": otlp_of("application/json")}[name]


def run_one(name: str, runs: int, seeds: Path | None, crashes: Path) -> None:
    import atheris

    crashes.mkdir(parents=True, exist_ok=True)
    args = [sys.argv[0], f"-runs={runs}", "-max_len=4096", "-print_final_stats=1",
            f"-artifact_prefix={crashes}/"]
    if seeds is not None:
        args.append(str(seeds))
    atheris.Setup(args, target(name))
    atheris.Fuzz()


def seed_corpus(name: str, into: Path) -> Path | None:
    """Real inputs to start from: Ray's captured payloads; nothing for the others."""
    if name != "ray":
        return None
    into.mkdir(parents=True, exist_ok=True)
    for path in (REPO / "tests" / "fixtures" / "ray").glob("*.json"):
        (into / path.name).write_bytes(path.read_bytes())
    return into


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=TARGETS)
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--corpus", type=Path, default=Path("/tmp") / "evagg-fuzz-corpus")
    args = parser.parse_args()
    if args.target:
        run_one(args.target, args.runs, seed_corpus(args.target, args.corpus / args.target),
                args.corpus / "crashes")
        return 0
    print(f"{'target':<15} {'runs':>8} {'seconds':>8}  result")
    failed = 0
    for name in TARGETS:
        started = time.monotonic()
        done = subprocess.run([sys.executable, __file__, "--target", name, "--runs",
                               str(args.runs), "--corpus", str(args.corpus)],
                              cwd=REPO, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - started
        verdict = "ok" if done.returncode == 0 else f"CRASH (exit {done.returncode})"
        print(f"{name:<15} {args.runs:>8} {seconds:>8.1f}  {verdict}", flush=True)
        if done.returncode != 0:
            failed += 1
            print(_crash_summary(done.stderr + done.stdout), flush=True)
            print(f"    the input is kept in {args.corpus / 'crashes'}", flush=True)
    return 1 if failed else 0


def _crash_summary(output: str) -> str:
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if "Uncaught Python exception" in line), 0)
    return "\n".join("    " + line for line in lines[start:start + 25])


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
