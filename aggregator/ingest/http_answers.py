"""What the HTTP port answers: an ingest route's counts, and a refusal in the words and
encoding its client reads (JSON, or a google.rpc.Status on the OTLP routes)."""

from __future__ import annotations

import orjson
from aiohttp import web

from aggregator.decode import otlp
from aggregator.ingest.ingestor import IngestResult
from dashboard.web import DEFAULT_LISTEN

# OTLP/HTTP's other signals, which the agent does not store: an exporter pointed at the
# agent's base address (OTEL_EXPORTER_OTLP_ENDPOINT) posts them beside its traces, and
# gets a refusal saying so rather than a bare 404.
NOT_TAKEN = {"/v1/metrics": ("metrics", "OTEL_METRICS_EXPORTER"),
             "/v1/logs": ("logs", "OTEL_LOGS_EXPORTER")}
# An OTLP exporter given a per-signal endpoint without its path
# (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4040) posts to the URL as given,
# so to "/": the spec adds /v1/traces only to the base OTEL_EXPORTER_OTLP_ENDPOINT.
NO_SIGNAL_PATH = "/"
OTLP_PATHS = frozenset({"/v1/traces", NO_SIGNAL_PATH, *NOT_TAKEN})
# Ray's State API routes (/api/v0/...), asked of this port by `ray list ... --address`.
STATE_API_ELSEWHERE = ("this is the evagg agent's ingest port, which serves no Ray State API: "
                       f"run `evagg dashboard` (it serves one on http://{DEFAULT_LISTEN} by "
                       "default) and give Ray's tools its URL, e.g. `ray list tasks "
                       f"--address http://{DEFAULT_LISTEN}` (docs/ray.md)")


def no_signal_path_reason(host: str) -> str:
    """Why a POST to "/" stored nothing, and the endpoint the exporter wanted."""
    return (f"nothing is taken at /: give the signal's path, "
            f"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://{host}/v1/traces (a per-signal "
            f"endpoint is used as given), or the base address alone as "
            f"OTEL_EXPORTER_OTLP_ENDPOINT=http://{host}")


def ingest_answer(result: IngestResult, all_rejected_status: int = 400,
                   duplicates: int | None = None) -> web.Response:
    """accepted: rows stored; rejected: lines, events or rows refused; duplicate: the
    whole request was stored before; duplicates (Ray): events dropped as resent."""
    status = all_rejected_status if result.accepted == 0 and result.rejected else 200
    if result.too_large:
        status = 413  # not the events' fault: the same events in smaller requests go in
    body: dict[str, object] = {"accepted": result.accepted, "rejected": result.rejected,
                               "duplicate": result.duplicate, "errors": list(result.reasons)}
    if duplicates is not None:
        body["duplicates"] = duplicates
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def refusal(request: web.Request, status: int, text: str,
             headers: dict[str, str] | None = None) -> web.Response:
    """A refused request's answer: OTLP/HTTP wants a google.rpc.Status in the request's
    encoding, which its exporters parse; every other route answers JSON.

    On the OTLP routes the reason is the HTTP reason phrase too: the Python SDK's
    exporter logs the status line (`code: 415, reason: ...`), not the body."""
    if request.path not in OTLP_PATHS:
        return error_answer(status, text, headers)
    body, content_type = otlp.otlp_error_body(request.headers.get("Content-Type"), text,
                                               status)
    return web.Response(status=status, body=body, reason=reason_phrase(text),
                        headers={"Content-Type": content_type, **(headers or {})})


def reason_phrase(text: str) -> str:
    """`text` as an HTTP/1.1 reason phrase: printable ASCII on one line, at most 300."""
    printable = "".join(c if " " <= c <= "~" else "?" for c in text)
    return printable[:300]


def error_answer(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps({"error": text}),
                        content_type="application/json", headers=headers)
