"""Queue time across a hand-off between processes, and the request ledger
(docs/queueing.md). The code is in emitters/integrations/queueing.py."""

from emitters.integrations.queueing import (
    ANSWERED,
    ENQUEUED,
    ENQUEUED_NS,
    FAILED,
    KIND,
    REQUEST_ID,
    REQUEST_NAME,
    RUN_ID,
    STARTED,
    Work,
    enqueue,
    start_work,
)

__all__ = ["ANSWERED", "ENQUEUED", "ENQUEUED_NS", "FAILED", "KIND", "REQUEST_ID",
           "REQUEST_NAME", "RUN_ID", "STARTED", "Work", "enqueue", "start_work"]
