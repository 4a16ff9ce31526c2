"""What the OpenTelemetry SDK's exporter logged: its errors are what an OTel user reads
when spans do not arrive (the fixture `exporter_log` is tests/conftest.py's)."""

from __future__ import annotations

import logging

import pytest

EXPORTER_LOGGER = "opentelemetry.exporter"


def exporter_errors(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records
                     if r.name.startswith(EXPORTER_LOGGER) and r.levelno >= logging.ERROR)
