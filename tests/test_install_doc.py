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


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """CI's script and the README's "Run the tests" command are one command: a change to
    one (the compile step, an apt package) that misses the other fails here."""
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Run the tests")
    opened = readme.index("```bash\n", start) + len("```bash\n")
    block = readme[opened:readme.index("\n```", opened)]
    script = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert block.strip() == script[-1]
