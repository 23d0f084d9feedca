"""Keeps statement parameters and result rows (webhook secrets among them) out of the logs
at any level.

SQLAlchemy's statement lines and error texts are covered by the engine's `hide_parameters`;
two kinds of DEBUG line are not: SQLAlchemy's "Row (...)" for each row read, and
aiosqlite's line for every call it runs, whose repr carries the statement's parameters.
The filters here rewrite those lines without the values.
"""

from __future__ import annotations

import functools
import logging

ROW_MESSAGE = "Row %r"


class CallsWithoutArguments(logging.Filter):
    """Shows a `functools.partial` argument of a record as the name of its function."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record's arguments; never drop the record."""
        if isinstance(record.args, tuple) and any(
            isinstance(arg, functools.partial) for arg in record.args
        ):
            record.args = tuple(
                _name(arg) if isinstance(arg, functools.partial) else arg for arg in record.args
            )
        return True


class RowsWithoutValues(logging.Filter):
    """Shows SQLAlchemy's line for a row read as the number of its values only."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite a row's record; never drop the record."""
        if record.msg == ROW_MESSAGE and isinstance(record.args, tuple) and record.args:
            shown = record.args[0]
            size = len(shown) if isinstance(shown, tuple) else 1
            record.msg, record.args = "Row of %d values [values hidden]", (size,)
        return True


def _name(call: functools.partial[object]) -> str:
    return f"<{getattr(call.func, '__qualname__', type(call.func).__name__)}>"


def _install(name: str, kind: type[logging.Filter]) -> None:
    logger = logging.getLogger(name)
    if not any(isinstance(f, kind) for f in logger.filters):
        logger.addFilter(kind())


def guard_driver_logs() -> None:
    """Install the filters on the loggers that say values (once each)."""
    _install("aiosqlite", CallsWithoutArguments)
    _install("sqlalchemy.engine.Engine", RowsWithoutValues)
