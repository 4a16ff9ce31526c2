"""The README's Install section names every extra `pyproject.toml` offers, and the
constraints file it tells people to install with."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def install_section() -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Install\n")
    return readme[start:readme.index("\n## ", start + 1)]


def test_every_extra_is_in_the_install_section() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    section = install_section()
    named = {extra for extra in extras if f"`[{extra}]`" in section}
    assert named == set(extras), "an extra without a word in README's Install"
    assert "-c constraints.txt" in section and (REPO / "constraints.txt").exists()
