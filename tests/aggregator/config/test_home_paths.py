"""`~` in the agent's socket and state_dir is the user's home, as in a sink's url, a
`[[files]]` path, and the socket `evagg emit` reads from the same file: it made a folder
named `~` in the directory the agent started in, with the spool inside, and `evagg emit
--config` looked for the socket elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.config import load_config
from aggregator.config.client_view import configured_socket


def test_a_tilde_in_socket_and_state_dir_is_the_home(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "evagg.toml"
    config.write_text('[agent]\nsocket = "~/run/events.sock"\nstate_dir = "~/evagg-state"\n'
                      '\n[[sinks]]\nname = "lake"\ntype = "parquet"\nurl = "~/lake"\n')
    loaded = load_config(config, env={})
    assert loaded.socket == home / "run" / "events.sock"
    assert loaded.state_dir == home / "evagg-state"
    assert configured_socket(config, env={}) == str(loaded.socket)  # where emit looks
