"""The `evagg query` command line: the questions asked from a shell, printed.

`query.py` (the parser, the subcommands and the flags shared with `evagg dashboard`),
`query_logs.py` (`evagg query logs`), `query_artifacts.py` (`evagg query artifacts`,
`artifact`), `output.py` (tables, JSON and CSV on stdout) and `lake_flags.py`
(`--config`). This room imports the questions, Ray's state (`dashboard/raystate/`) and the lake.
"""
