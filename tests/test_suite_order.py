"""The suite hands its slow modules to the workers first (tests/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from tests.conftest import pytest_collection_modifyitems


@dataclass
class StandIn:
    """What the hook reads of a collected test: its module's path and its markers."""

    path: Path
    slow: bool

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None


def test_modules_with_a_slow_test_go_first_each_group_in_its_order() -> None:
    a1, a2 = StandIn(Path("a.py"), False), StandIn(Path("a.py"), False)
    b1, b2 = StandIn(Path("b.py"), False), StandIn(Path("b.py"), True)  # one slow test
    c1, d1 = StandIn(Path("c.py"), True), StandIn(Path("d.py"), False)
    items: list[Any] = [a1, b1, c1, a2, d1, b2]
    pytest_collection_modifyitems(cast(list[pytest.Item], items))
    assert items == [b1, c1, b2, a1, a2, d1]
