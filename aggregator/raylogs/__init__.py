"""Ray's log files shipped into the lake while they grow (docs/ray-logs.md)."""
