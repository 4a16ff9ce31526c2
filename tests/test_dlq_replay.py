"""`evagg dlq replay` against a real endpoint that refuses bodies above a size (HTTP 413),
as a collector with a smaller body limit does: dead letters from a real agent go through
in halves, as the sink sends its own batches, instead of being refused whole again."""

from __future__ import annotations

import re
from collections.abc import Callable

from tests.agentproc import AgentProcess, http_sink
from tests.commands import evagg
from tests.producers import producer_report, start_producer
from tests.sinks.server_thread import ServerThread
from tests.waiting import wait_until

EVENTS = 1500
LIMIT = 40_000  # bytes: a dead letter of 1000 events is about 10 times that


def dead_letters(agent_factory: Callable[..., AgentProcess],
                 servers: Callable[..., ServerThread], events: int = EVENTS) -> AgentProcess:
    """A stopped agent whose sink `collector` dead-lettered `events` tasks (HTTP 400)."""
    refusing = servers()
    refusing.do(lambda: refusing.server.answer(400, times=None, text="schema mismatch"))
    agent = agent_factory(sinks_toml=http_sink("collector", refusing.server.url,
                                               'kinds = ["task"]')).start()
    assert producer_report(start_producer(agent.socket_path, "dl", events))["flushed"]
    wait_until(lambda: agent.metric('evagg_sink_lag_events{sink="collector"}') == 0, 60,
               "the collector sink to dead-letter every batch")
    assert agent.stop() == 0
    return agent


def replay(agent: AgentProcess, url: str) -> tuple[int, str]:
    done = evagg("dlq", "replay", "--sink", "collector", "--config", str(agent.config_path),
                 "--url", url)
    return done.returncode, done.stdout + done.stderr


def delivered(endpoint: ServerThread) -> list[str]:
    return sorted(str(e["task_id"]) for s in endpoint.server.requests if s.status == 200
                  for e in s.events)


def letters(agent: AgentProcess) -> str:
    return evagg("dlq", "list", "--sink", "collector", "--config",
                 str(agent.config_path)).stdout


def test_letters_too_large_for_the_endpoint_go_in_halves(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    agent = dead_letters(agent_factory, servers)
    smaller = servers()
    smaller.server.max_body = LIMIT
    code, output = replay(agent, smaller.server.url)
    assert code == 0, output
    halved = r"^\d+ requests refused as too large \(HTTP 413\) were sent again in halves$"
    assert re.search(halved, output, re.M), output
    assert any(s.status == 413 for s in smaller.server.requests)
    assert delivered(smaller) == sorted(f"dl-{i}" for i in range(EVENTS))  # each one, once
    assert "0 dead-lettered batches" in letters(agent)


def test_the_pieces_still_refused_stay_as_letters_of_their_own(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    agent = dead_letters(agent_factory, servers)
    smaller = servers()
    smaller.server.max_body = LIMIT
    smaller.do(lambda: smaller.server.answer(400, times=1, text="one piece refused"))
    code, output = replay(agent, smaller.server.url)
    assert code == 1, output
    assert re.search(r"^sent \d+ batches and part of 1 more \(the pieces left stay as "
                     r"letters of their own\) \(\d+ events\)", output, re.M), output
    assert re.search(r"HTTP 400 \(\d+ of letter \w+'s events, kept as a letter of their own\)",
                     output), output
    refused = [s for s in smaller.server.requests if s.status == 400]
    assert len(refused) == 1
    assert len(delivered(smaller)) == EVENTS - len(refused[0].events)
    listed = letters(agent)
    assert re.search(rf"\b{len(refused[0].events)} events  key {refused[0].key}\b", listed), \
        listed
    code, output = replay(agent, smaller.server.url)  # the piece alone, this time taken
    assert code == 0, output
    assert delivered(smaller) == sorted(f"dl-{i}" for i in range(EVENTS))


def test_a_letter_the_endpoint_takes_only_pieces_of_is_said_as_such(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    agent = dead_letters(agent_factory, servers, events=400)
    assert len(re.findall(r"\bkey \w+", letters(agent))) == 1  # one letter
    smaller = servers()
    smaller.server.max_body = LIMIT
    smaller.do(lambda: smaller.server.answer(400, times=1, text="one piece refused"))
    code, output = replay(agent, smaller.server.url)
    assert code == 1, output
    taken = len(delivered(smaller))
    assert 0 < taken < 400, output
    sent = re.search(r"^sent (.*) \((\d+) events\) to ", output, re.M)
    assert sent, output
    assert sent.group(1) == "part of 1 batch (the pieces left stay as letters of their own)"
    assert int(sent.group(2)) == taken, output


def test_a_replay_the_endpoint_refuses_again_says_so_on_stderr_and_what_to_do(
        agent_factory: Callable[..., AgentProcess],
        servers: Callable[..., ServerThread]) -> None:
    """Every letter refused again: exit 1, no 'sent 0 batches ...; their files are
    deleted' on stdout, and stderr names the letters kept and the next step."""
    agent = dead_letters(agent_factory, servers)
    still = servers()
    still.do(lambda: still.server.answer(400, times=None, text="schema mismatch"))
    done = evagg("dlq", "replay", "--sink", "collector", "--config", str(agent.config_path),
                 "--url", still.server.url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "deleted" not in done.stdout, done.stdout
    assert re.search(r"^evagg dlq replay: \d+ batches failed and stay in \S+:$", done.stderr,
                     re.M), done.stderr
    assert re.search(r"^  \w+: HTTP 400", done.stderr, re.M), done.stderr
    # the list command as the user can paste it: with the config it was given
    assert f"evagg dlq list --sink collector --config {agent.config_path}`" in done.stderr
    assert "--url" in done.stderr and "replay again" in done.stderr
    assert "0 dead-lettered batches" not in letters(agent)  # all kept
