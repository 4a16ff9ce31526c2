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


@pytest.fixture(scope="module")
def torch_one_thread() -> Iterator[None]:
    """torch without intra-op threads for a module's tests (`pytestmark`): a tiny model on
    a shared 2-core machine runs 10x faster so. torch is imported only by modules asking."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
