"""Ray's log files kept in the lake beside the events: the key layout (docs/ray-logs.md)."""
