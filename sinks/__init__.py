"""Sinks: where spooled events go. One module per sink behind the contract in `sinks.base`."""
