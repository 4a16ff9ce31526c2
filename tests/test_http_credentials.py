"""An HTTP sink whose endpoint rotates its token: the `file:` header is read again when
its file changes, through a real agent against a real endpoint, with no reload."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from tests.agentproc import AgentProcess, http_sink
from tests.commands import evagg
from tests.producers import producer_report, start_producer
from tests.sinks.server_thread import ServerThread
from tests.waiting import wait_until


def delivered(server: ServerThread, prefix: str) -> set[str]:
    """The task ids starting with `prefix` in requests the endpoint answered 2xx."""
    return {str(e.get("task_id")) for e in server.accepted_events()
            if e.get("kind") == "task" and str(e.get("task_id")).startswith(prefix)}


def agent_with_token_file(agent_factory: Callable[..., AgentProcess],
                          servers: Callable[..., ServerThread], tmp_path: Path
                          ) -> tuple[ServerThread, Path, AgentProcess]:
    """An endpoint that takes "Bearer one", and an agent whose sink reads its
    Authorization header from a token file holding it."""
    endpoint = servers()
    endpoint.do(lambda: setattr(endpoint.server, "authorization", "Bearer one"))
    token = tmp_path / "collector-token"
    token.write_text("Bearer one\n")
    agent = agent_factory(sinks_toml=http_sink(
        "collector", endpoint.url, f'[sinks.headers]\nAuthorization = "file:{token}"')).start()
    return endpoint, token, agent


def test_a_rotated_token_file_is_sent_without_a_reload_and_a_401_says_what_to_do(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread], tmp_path: Path) -> None:
    endpoint, token, agent = agent_with_token_file(agent_factory, servers, tmp_path)
    assert producer_report(start_producer(agent.socket_path, "first", 200))["flushed"]
    wait_until(lambda: len(delivered(endpoint, "first")) == 200, 60, "the first token")

    # A vault agent rotates the token: the new file is written and the old token revoked.
    # The requests after it carry the new token, with no reload.
    token.write_text("Bearer two\n")
    endpoint.do(lambda: setattr(endpoint.server, "authorization", "Bearer two"))
    assert producer_report(start_producer(agent.socket_path, "second", 200))["flushed"]
    wait_until(lambda: len(delivered(endpoint, "second")) == 200, 60,
               "the second token, read again from the file")

    # The endpoint revokes the token before the file has the new one: 401, and the
    # sink's failure says where the new token goes; the events wait in the spool.
    endpoint.do(lambda: setattr(endpoint.server, "authorization", "Bearer three"))
    assert producer_report(start_producer(agent.socket_path, "third", 200))["flushed"]
    refused = 'evagg_delivery_errors_total{kind="http_auth",sink="collector"}'
    wait_until(lambda: agent.metric(refused) >= 1, 60, "the 401")
    status = evagg("status", "--config", str(agent.config_path))
    assert "failing (http_auth)" in status.stdout, status.stdout
    # a permanent failure, yet the next try comes soon: the sink watches the file
    next_try = re.search(r"next in (\d+)s|retrying now", status.stdout)
    assert next_try and int(next_try.group(1) or 0) <= 10, status.stdout
    said = [line for line in agent.log().splitlines() if "HTTP 401" in line]
    assert said and str(token) in said[0] and "no reload needed" in said[0], said
    token.write_text("Bearer three\n")
    # tried again within 10 s of the 401, not the delivery loop's minute
    wait_until(lambda: len(delivered(endpoint, "third")) == 200, 150,
               "the third token, read again after the 401")
    assert agent.stop() == 0
    log = agent.log()
    assert "header Authorization read again" in log
    assert "Bearer" not in log  # the values are secrets: never in a log line


def test_a_deleted_token_file_keeps_its_value_and_says_so(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread], tmp_path: Path) -> None:
    """The file goes (a Secret deleted, a vault agent stopped): the token read before
    still works until the endpoint revokes it, so it is sent, but the operator is told,
    in the log once and in `evagg status` while it lasts."""
    endpoint, token, agent = agent_with_token_file(agent_factory, servers, tmp_path)
    unusable = 'evagg_sink_header_files_unusable{sink="collector"'
    assert agent.metric(unusable) == 0
    token.unlink()
    for batch in ("after-1", "after-2"):
        assert producer_report(start_producer(agent.socket_path, batch, 200))["flushed"]
        wait_until(lambda b=batch: len(delivered(endpoint, b)) == 200, 60,
                   f"{batch} sent with the token read before")
    assert agent.metric(unusable) == 1
    status = evagg("status", "--config", str(agent.config_path))
    assert "1 header file gone or unreadable: the value read before is sent" in status.stdout, \
        status.stdout
    said = [line for line in agent.log().splitlines() if "header Authorization" in line]
    assert len(said) == 1, said  # once, not at every request
    assert f"file {token}: No such file or directory (deleted or moved?)" in said[0]
    assert "the value read before is still sent" in said[0]

    token.write_text("Bearer one\n")  # written back: the same token, counted no more
    assert producer_report(start_producer(agent.socket_path, "back", 200))["flushed"]
    wait_until(lambda: len(delivered(endpoint, "back")) == 200, 60, "the file written back")
    assert agent.metric(unusable) == 0
    assert f"header Authorization: {token} can be read again" in agent.log()
    assert agent.stop() == 0
    assert "Bearer" not in agent.log()
