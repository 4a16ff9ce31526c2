"""Which of a sink's failures and recoveries the log says, so that a flapping endpoint
does not flood it.

A sink's failure is logged once per change of kind and its recovery once, which suits an
endpoint that goes down and comes back. An endpoint that fails some requests and answers
others (an overloaded collector, a bad replica behind a balancer) makes a run of failures
every few seconds, each over within a second: two lines each, hundreds an hour on every
node. A run that starts within FLAP_WINDOW_S of the last recovery is a flap; flaps are
said at most once per FLAP_WINDOW_S, with how many were held back, and a run that was not
said has no recovery line either. `evagg status` and /metrics count every one.
"""

from __future__ import annotations

from dataclasses import dataclass

FLAP_WINDOW_S = 60.0
# A run of failures this long is no flap but an outage beginning: said whatever came before.
LONG_RUN = 3


@dataclass
class FlapWords:
    recovered_at: float = float("-inf")  # monotonic: the last recovery
    said_at: float = float("-inf")  # monotonic: the last failure the log said
    held: int = 0  # runs of failures not said since `said_at`
    run_said: bool = True  # whether the log said the current run of failures

    def say_failure(self, now: float, *, first_of_kind: bool, attempts: int,
                    permanent: bool = False) -> str | None:
        """None to say nothing of this failed attempt; else what to add to its line (the
        flaps held back since the last one said, or nothing). `attempts`: the failed
        attempts of this run so far, this one included. A `permanent` failure (refused
        credentials, a missing bucket) is no flap: it waits for someone to fix the sink,
        and is retried once a minute, so holding it back until the run is LONG_RUN long
        kept it out of the log for two minutes, or for good when it was fixed sooner."""
        if not first_of_kind and self.run_said:
            return None  # said already: once per change of kind
        flapping = now - self.recovered_at < FLAP_WINDOW_S and not permanent
        if flapping and now - self.said_at < FLAP_WINDOW_S and attempts < LONG_RUN:
            if attempts == 1:
                self.held += 1
            self.run_said = False
            return None
        if not self.run_said and attempts > 1:
            self.held -= 1  # this run was counted held at its start: it is said now
        extra = ""
        if self.held:
            extra = (f"; {self.held} more short run{'s' if self.held != 1 else ''} of "
                     f"failures in the last {now - self.said_at:.0f}s were not logged: the "
                     "endpoint fails some requests and answers others (evagg status: errors, "
                     "retried batches)")
        self.said_at, self.held, self.run_said = now, 0, True
        return extra

    def say_recovery(self, now: float) -> bool:
        """Whether the log says this recovery: only of a run of failures it said."""
        said, self.run_said, self.recovered_at = self.run_said, True, now
        return said
