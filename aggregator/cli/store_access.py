"""`evagg check-config`'s look at each S3 sink's bucket, with the agent's own credentials
and endpoint: what the agent would meet at its first upload, said before it starts.

What it finds is a warning, never a refusal: `check-config` runs before the agent starts
(systemd's ExecStartPre, the DaemonSet's init container), and an agent that cannot reach
its bucket still takes events and keeps them in its spool until it can. `--offline` skips
the look (a config checked where the node's credentials are not).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aggregator.config.sinks import SinkConfig
from sinks.locations import is_s3_url

# The look only lists, so its store stages nothing and this folder is never made: the
# DaemonSet's init container, with a read-only root and no /tmp, has none to give.
_STAGES_NOTHING = Path("/nonexistent/evagg-check-config-stages-nothing")

# what each kind of refusal asks of the operator
_ADVICE = {
    "s3_no_such_bucket": "create the bucket, or fix the sink's url",
    "s3_no_credentials": "give the agent credentials (its environment, a profile, an "
                         "instance role)",
    "s3_bad_credentials": "fix the agent's credentials",
    "s3_access_denied": "let the agent's identity list and put objects under the prefix",
}


def s3_access_warnings(sinks: Sequence[SinkConfig]) -> list[str]:
    """A warning for each S3 Parquet sink whose bucket the agent could not list now."""
    warnings = []
    for index, sink in enumerate(sinks):
        if sink.type == "parquet" and is_s3_url(sink.url):
            found = _listing_problem(sink)
            if found:
                warnings.append(f"sinks[{index}] ({sink.name}): {found}")
    return warnings


def _listing_problem(sink: SinkConfig) -> str | None:
    from sinks.parquet.options import ParquetOptions
    from sinks.parquet.s3 import S3Store
    from sinks.parquet.stores import StoreError

    try:
        options = ParquetOptions.from_table(sink.options, sink.url)
        S3Store(sink.url, options.s3, staging_dir=_STAGES_NOTHING).check_access()
    except StoreError as exc:
        advice = _ADVICE.get(exc.kind, "check the sink's endpoint_url and the network")
        return (f"cannot list {sink.url} ({exc.kind}): {exc}; {advice}. The agent starts "
                "anyway and keeps events in its spool until it can upload")
    except ValueError:  # an option the sink refuses: check-config names it already
        return None
    return None
