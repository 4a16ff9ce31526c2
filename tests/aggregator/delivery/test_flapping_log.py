"""An endpoint that fails some requests and answers others, for minutes (an overloaded
collector, one bad replica behind a balancer): delivery carries on, every failure is
counted, and the agent's log says so once a minute, not two lines at every flap, which
on a thousand nodes buries everything else the log has to say."""

from __future__ import annotations

from collections.abc import Callable

import emitters
from tests.agentproc import AgentProcess
from tests.aggregator.cli.newcomer import evagg
from tests.proof import metric_where
from tests.sinks.flaky_server import Reply
from tests.sinks.server_thread import ServerThread
from tests.waiting import wait_until

RUNS = 6  # runs of failures the delivery loop sees before the test reads the log


def test_a_flapping_endpoint_is_logged_once_not_at_every_flap(
        agent_factory: Callable[..., AgentProcess]) -> None:
    receiver = ServerThread().start()
    # four failed requests in a row hand the failure to the delivery loop; its resend is
    # answered, and the next four fail again
    receiver.do(lambda: receiver.server.rotate([Reply(503)] * 4 + [Reply(200)] * 4))
    sinks = (f'[[sinks]]\nname = "collector"\ntype = "http"\nurl = "{receiver.url}"\n'
             'batch_max_events = 5\nbatch_interval = "50ms"\nretry_max_backoff = "200ms"\n'
             'concurrency = 1\n')
    agent = agent_factory(sinks_toml=sinks).start()
    emitter = emitters.Emitter(socket=str(agent.socket_path))
    try:
        def flapped() -> bool:
            for n in range(20):
                emitter.emit(kind="task", name="flap", state="FINISHED", n=n)
            emitter.flush(10)
            return agent.log().count("recovered after") >= 1 and metric_where(
                agent, "evagg_delivery_errors_total", sink="collector") >= RUNS
        wait_until(flapped, 120, lambda: f"the endpoint to flap:\n{agent.log()[-3000:]}")
        assert metric_where(agent, "evagg_delivered_events_total", sink="collector") > 0
        log = agent.log()
    finally:
        emitter.close(5)
        agent.kill()
        receiver.close()
    failed = [line for line in log.splitlines() if "sink collector failed (" in line]
    recovered = [line for line in log.splitlines() if "sink collector recovered" in line]
    assert len(failed) == 1 and len(recovered) == 1, "\n".join(failed + recovered)


def test_refused_credentials_soon_after_a_recovery_are_logged_at_once(
        agent_factory: Callable[..., AgentProcess]) -> None:
    """A short outage, its recovery, then the endpoint refuses the token (401): that is no
    flap of an overloaded endpoint but a sink that needs someone. It was held back as a
    flap until its third attempt, a permanent error's attempts a minute apart, so
    `evagg status` said `failing (http_auth)` while the log said nothing of it."""
    receiver = ServerThread().start()
    receiver.do(lambda: receiver.server.answer(503, times=4))  # then 200s
    sinks = (f'[[sinks]]\nname = "collector"\ntype = "http"\nurl = "{receiver.url}"\n'
             'batch_interval = "50ms"\nretry_max_backoff = "200ms"\nconcurrency = 1\n')
    agent = agent_factory(sinks_toml=sinks).start()
    emitter = emitters.Emitter(socket=str(agent.socket_path))
    try:
        emitter.emit(kind="task", name="before", state="FINISHED")
        emitter.flush(10)
        wait_until(lambda: "sink collector recovered" in agent.log(), 60,
                   lambda: f"the short outage to end:\n{agent.log()[-3000:]}")
        receiver.answer_always(401)
        emitter.emit(kind="task", name="after", state="FINISHED")
        emitter.flush(10)

        def status() -> str:
            return evagg("status", "--config", str(agent.config_path)).stdout
        wait_until(lambda: "failing (http_auth)" in status(), 60,
                   lambda: f"the sink to fail on the token:\n{status()}")
        wait_until(lambda: "sink collector failed (http_auth)" in agent.log(), 10,
                   lambda: f"the log to say so:\n{agent.log()[-3000:]}")
        said = [line for line in agent.log().splitlines()
                if "sink collector failed (http_auth)" in line]
    finally:
        emitter.close(5)
        agent.kill()
        receiver.close()
    assert len(said) == 1 and "a permanent error: fix the sink's config" in said[0], said
