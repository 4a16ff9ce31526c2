"""The questions the views answer: what the pages and `evagg query` ask of the store.

`queries.py` (tasks, jobs, spans and the summary), `overview.py` (the first page's
numbers), `filters.py` (the filters and sorts a question may carry, checked), `ledger.py`
(the request ledger), `artifacts.py` (shipped files: their index and their bytes) and
`runner.py` (asks the store off the web server's event loop, with a timeout and a
result cache). This room imports only the lake (`dashboard/lake/`).
"""
