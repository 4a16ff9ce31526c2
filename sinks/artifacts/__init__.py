"""Finished files kept in the lake beside the events: the key layout (docs/parquet-layout.md)."""
