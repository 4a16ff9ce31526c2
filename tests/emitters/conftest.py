"""Fixtures the emitter tests share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.emitters.fakeagent import short_socket_path


@pytest.fixture
def sock_path() -> Iterator[Path]:
    """A socket path short enough for AF_UNIX, in a folder removed afterwards."""
    path = short_socket_path()
    yield path
    with contextlib.suppress(OSError):
        path.parent.rmdir()
