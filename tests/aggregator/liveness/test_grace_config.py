"""`inferred_end_grace` as `evagg check-config` reads it: a duration, or "off"."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.aggregator.cli.newcomer import evagg


def check(tmp_path: Path, value: str) -> tuple[int, str, str]:
    config = tmp_path / "evagg.toml"
    config.write_text(f'[agent]\ninferred_end_grace = {value}\nstate_dir = "{tmp_path}/state"\n')
    done = evagg("check-config", "--config", str(config))
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("value", ['"off"', '"0s"', '"45s"', '"2m"', "30"])
def test_a_duration_or_off_is_accepted(tmp_path: Path, value: str) -> None:
    code, out, err = check(tmp_path, value)
    assert (code, err) == (0, ""), err
    assert out.startswith("config OK: ")


def test_anything_else_is_refused_with_what_to_write(tmp_path: Path) -> None:
    code, out, err = check(tmp_path, '"soon"')
    assert code == 2 and out == ""
    assert ("agent.inferred_end_grace: 'soon' is not a duration such as \"30s\", or \"off\""
            in err)


def test_a_grace_shorter_than_rays_export_is_a_warning(tmp_path: Path) -> None:
    code, out, err = check(tmp_path, '"3s"')
    assert code == 0 and out.startswith("config OK: ")
    assert "agent.inferred_end_grace: 3s is shorter than Ray takes" in err
