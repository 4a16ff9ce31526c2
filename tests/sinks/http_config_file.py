"""An agent config with one HTTP sink, for `evagg check-config` and `evagg dlq` tests."""

from __future__ import annotations

from pathlib import Path


def http_sink_config(directory: Path, url: str, options: str = "") -> Path:
    """`directory`/evagg.toml: state under `directory`, no HTTP port, one sink named
    "collector" sending to `url` with the TOML lines `options`."""
    config = directory / "evagg.toml"
    config.write_text(f"""
[agent]
state_dir = "{directory / 'state'}"
http_listen = ""

[[sinks]]
name = "collector"
type = "http"
url = "{url}"
{options}
""")
    return config
