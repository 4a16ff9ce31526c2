"""A second agent that cannot start says what to change, through the real `evagg run`:
the socket another agent holds, and a port that an EVAGG_* variable chose over the
config file's own."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.agentproc import AgentProcess, short_socket_dir
from tests.aggregator.cli.newcomer import evagg
from tests.ports import free_port


def test_a_port_from_evagg_http_listen_is_named_over_the_config_files(tmp_path: Path) -> None:
    config = tmp_path / "evagg.toml"
    free = f"127.0.0.1:{free_port()}"
    sock = short_socket_dir() / "events.sock"
    config.write_text(f'[agent]\nsocket = "{sock}"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'http_listen = "{free}"\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        done = evagg("run", "--config", str(config), env={"EVAGG_HTTP_LISTEN": listen})
        flagged = evagg("run", "--config", str(config), "--http-listen", listen,
                        env={"EVAGG_HTTP_LISTEN": listen})
    assert done.returncode == 1
    assert f"cannot open the HTTP port {listen}" in done.stderr
    # the file says another port: the message names the variable that won over it
    assert f"{listen} is $EVAGG_HTTP_LISTEN's, which wins over agent.http_listen" in done.stderr
    assert "change or unset $EVAGG_HTTP_LISTEN" in done.stderr
    assert flagged.returncode == 1 and "$EVAGG_HTTP_LISTEN" not in flagged.stderr  # the flag won
    assert not sock.exists()


def test_a_socket_another_agent_holds_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "first").mkdir()
    first = AgentProcess(tmp_path / "first").start()
    try:
        done = evagg("run", "--socket", str(first.socket_path), "--state-dir",
                     str(tmp_path / "second"), "--http-listen", f"127.0.0.1:{free_port()}",
                     env={"EVAGG_HTTP_LISTEN": ""})
    finally:
        assert first.stop() == 0
    assert done.returncode == 1
    assert f"another agent is already listening on {first.socket_path}" in done.stderr
    assert "stop that one first" in done.stderr and "--socket" in done.stderr, done.stderr


def test_a_clash_names_the_variable_whose_value_it_is_about_not_one_inside_it(
        tmp_path: Path) -> None:
    """EVAGG_STATE_DIR is the folder that holds the config's socket: a clash on that
    socket is not the state_dir's, and says nothing of the variable; a clash on the
    spool under it is, and says so."""
    (tmp_path / "first").mkdir()
    first = AgentProcess(tmp_path / "first").start()
    state = first.socket_path.parent
    try:
        config = tmp_path / "evagg.toml"
        config.write_text(f'[agent]\nsocket = "{first.socket_path}"\n')
        on_socket = evagg("run", "--config", str(config), "--http-listen",
                          f"127.0.0.1:{free_port()}", env={"EVAGG_STATE_DIR": str(state)})
        config.write_text(f'[agent]\nsocket = "{short_socket_dir() / "events.sock"}"\n')
        on_spool = evagg("run", "--config", str(config), "--http-listen",
                         f"127.0.0.1:{free_port()}",
                         env={"EVAGG_STATE_DIR": str(first.state_dir)})
    finally:
        assert first.stop() == 0
    assert on_socket.returncode == 1 and "already listening on" in on_socket.stderr
    assert "$EVAGG_STATE_DIR" not in on_socket.stderr, on_socket.stderr
    assert on_spool.returncode == 1 and "is in use by another evagg agent" in on_spool.stderr
    assert f"{first.state_dir} is $EVAGG_STATE_DIR's" in on_spool.stderr, on_spool.stderr
