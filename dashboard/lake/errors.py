"""The errors the query layer shows to people: a readable message and an HTTP status."""

from __future__ import annotations


class DashboardError(Exception):
    """Something the user can act on (bad filter, missing data); never a stack trace."""

    status = 400

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class BadInput(DashboardError):
    """A malformed filter, an unknown column, an unparsable time: HTTP 400, exit 2."""

    status = 400


class NotFound(DashboardError):
    """No data where the user pointed (missing directory, empty prefix, unknown id)."""

    status = 404


class StoreUnavailable(DashboardError):
    """The store cannot be read right now (credentials, network, a corrupt file)."""

    status = 503


class QueryFailed(DashboardError):
    """A query the dashboard built failed inside DuckDB: a bug or a damaged file."""

    status = 500


class NoData(NotFound):
    """The location exists but holds no Parquet files yet (a cluster that has not written)."""
