"""What `evagg status` prints for a sink, from two scrapes of /metrics as the agent
exports them (the agent side of these series is tested through real agents elsewhere)."""

from __future__ import annotations

from aggregator.cli.status import format_status, parse_metrics

SCRAPE = """\
evagg_sink_lag_events{sink="collector"} 0
evagg_delivered_events_total{sink="collector"} 5000
evagg_delivery_errors_total{sink="collector",kind="http_5xx"} 0
evagg_sink_retries_total{sink="collector",type="http"} 3
evagg_sink_lag_events{sink="lake"} 1
evagg_sink_open_file_events{sink="lake",type="parquet"} 1
evagg_sink_file_closes_in_seconds{sink="lake",type="parquet"} 3.6
evagg_spool_bytes 0
evagg_spool_max_bytes 4294967296
"""


def test_a_sink_that_retried_batches_itself_says_so_beside_its_errors() -> None:
    sample = parse_metrics(SCRAPE)
    text = format_status(sample, sample, 1.0, now=0.0).as_text()
    collector = next(line for line in text.splitlines() if "collector" in line)
    assert "errors 0  retried 3 batches  ok" in collector


def test_a_parquet_sink_says_when_its_open_file_reaches_the_lake() -> None:
    sample = parse_metrics(SCRAPE)
    lake = next(line for line in format_status(sample, sample, 1.0, now=0.0).as_text()
                .splitlines() if "lake" in line)
    assert "lag 1 event (not in a file yet: next file closes in 4s)" in lake
    assert "retried" not in lake


def test_a_parquet_sink_that_fails_does_not_blame_its_open_file() -> None:
    # an S3 outage: the file was built and its upload failed; the lag waits for the store
    failing = SCRAPE + ('evagg_sink_failing_since_timestamp_seconds{sink="lake",'
                        'kind="s3_connect"} 100\n'
                        'evagg_sink_next_retry_timestamp_seconds{sink="lake"} 112\n')
    sample = parse_metrics(failing)
    lake = next(line for line in format_status(sample, sample, 1.0, now=110.0).as_text()
                .splitlines() if "lake" in line)
    assert "not in a file yet" not in lake
    assert "retrying (s3_connect) since" in lake and "next in 2s" in lake


def test_a_full_spool_says_no_loss_is_counted_yet_not_that_none_happened() -> None:
    """Under when_full = "block", producers drop once their buffers fill, and their loss
    reports wait in frames behind the full spool: `lost none` would be a lie."""
    sample = parse_metrics(SCRAPE + "evagg_spool_blocked 1\n")
    lines = format_status(sample, sample, 1.0, now=0.0).as_text().splitlines()
    lost = next(line for line in lines if line.startswith("lost"))
    assert lost.startswith("lost       none counted yet") and "wait for room" in lost, lost
    free = parse_metrics(SCRAPE + "evagg_spool_blocked 0\n")
    assert "lost       none" in format_status(free, free, 1.0, now=0.0).as_text().splitlines()


def test_the_commands_status_prints_carry_its_config() -> None:
    sample = parse_metrics(SCRAPE + 'evagg_sink_dead_letters_waiting_events{sink="collector"} 3\n')
    text = format_status(sample, sample, 1.0, now=0.0).as_text(" --config /etc/evagg/evagg.toml")
    assert "(evagg dlq list --config /etc/evagg/evagg.toml --sink collector)" in text, text


def test_a_parquet_sink_with_hours_it_could_not_merge_says_so_and_why() -> None:
    unmerged = SCRAPE + ('evagg_sink_partitions_not_merged{sink="lake",type="parquet"} 2\n'
                         'evagg_sink_compaction_failures_total{sink="lake",type="parquet",'
                         'reason="no_room"} 5\n'
                         'evagg_sink_compaction_failures_total{sink="lake",type="parquet",'
                         'reason="partition"} 0\n')
    sample = parse_metrics(unmerged)
    lake = next(line for line in format_status(sample, sample, 1.0, now=0.0).as_text()
                .splitlines() if "lake" in line)
    assert lake.endswith("ok  2 closed hours not merged (failures so far: no_room=5; the "
                         "agent's log says why, and tries again)"), lake
    gauge = 'evagg_sink_partitions_not_merged{sink="lake",type="parquet"}'
    merged = parse_metrics(unmerged.replace(f"{gauge} 2", f"{gauge} 0"))
    assert "not merged" not in format_status(merged, merged, 1.0, now=0.0).as_text()


def test_a_disk_that_fails_writes_is_told_apart_from_a_full_one() -> None:
    """"free space" for a full disk; for one that fails (EIO, a read-only remount) freeing
    space would not help: look at the disk."""
    for reason, advice in (("ENOSPC", "free space on the spool's disk"),
                           ("EIO", "look at the spool's disk (the state directory): it "
                                   "refuses writes, and the kernel's log says why")):
        failing = SCRAPE + ('evagg_spool_write_failing_since_timestamp_seconds'
                            f'{{reason="{reason}"}} 100\n')
        sample = parse_metrics(failing)
        text = format_status(sample, sample, 1.0, now=0.0).as_text()
        line = next(line for line in text.splitlines() if "cannot write" in line)
        assert f"cannot write ({reason})" in line and advice in line, line
