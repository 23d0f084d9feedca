"""The service's log lines: one format for every logger ([log] format), set up once per process.

`text` writes `time LEVEL logger: message`; `json` writes one object per line with the keys
`time`, `level`, `logger` and `message`, an access line its own fields instead of a message
(method, route, status, outcome, duration_ms, the path's ids, client, request_id: the
record's `field_names`, one per argument of its message).
The standard library's logging does the work: one Formatter per format, given to the root
logger's handler and to the access logger's buffered one.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson
from groupbuy_client.wire import iso_ms

from groupbuy.api import ACCESS_LOGGER
from groupbuy.api.accesslog import BufferedLineHandler, CachedTimeFormatter

# No Starlette here: `groupbuy worker` configures logging without importing the API.

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Loggers that say at INFO how they set themselves up each time; the commands say the outcome.
_QUIET_AT_INFO = ("alembic", "apscheduler")
# uvicorn's loggers but its access log (the service writes its own access lines).
_UVICORN_LOGGERS = ("uvicorn", "uvicorn.error")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ms), level, logger, then the record's arguments
    under their `field_names` (an access line) or its message, and the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": iso_ms(int(record.created * 1000)),
            "level": record.levelname,
            "logger": record.name,
        }
        names = getattr(record, "field_names", None)
        if isinstance(names, tuple) and isinstance(record.args, tuple):
            line.update(zip(names, record.args, strict=True))
        else:
            line["message"] = record.getMessage()
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at each line (as logging's last resort does), so a
    stderr replaced since set-up gets the lines rather than a closed file's error."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr


def formatter(form: str) -> logging.Formatter:
    """The formatter of a [log] format: `text` or `json`."""
    return JsonFormatter() if form == "json" else CachedTimeFormatter(TEXT_FORMAT)


def configure_logging(level: str, access_log: bool, form: str) -> None:
    """Send every logger's lines to stderr in one format from `level` up, and the access
    lines (when `access_log`) through a buffered handler at INFO whatever `level` is.
    Replaces what an earlier call set up, so the settings' values always win (handlers
    others added, such as pytest's, stay)."""
    shown = formatter(form)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, StderrHandler):
            root.removeHandler(handler)
    stream = StderrHandler()
    stream.setFormatter(shown)
    root.addHandler(stream)
    root.setLevel(level.upper())
    for name in _UVICORN_LOGGERS:
        # uvicorn's own default set-up (a dictConfig run by anything that started uvicorn
        # in this process before) gives them handlers and stops them at "uvicorn": their
        # lines would leave in uvicorn's format instead of this one. Its log_level sets
        # their level too: the settings' level is the one that counts.
        server_log = logging.getLogger(name)
        server_log.handlers.clear()
        server_log.propagate = True
        server_log.setLevel(logging.NOTSET)
    for name in _QUIET_AT_INFO:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    access = logging.getLogger(ACCESS_LOGGER)
    access.propagate = False
    access.setLevel(logging.INFO if access_log else logging.WARNING)
    buffered = [h for h in access.handlers if isinstance(h, BufferedLineHandler)]
    if buffered:  # one flushing thread per process, however often logging is set up
        buffered[0].setFormatter(shown)
        return
    # One line per request: written in batches, not one system call each.
    handler = BufferedLineHandler()
    handler.setFormatter(shown)
    access.addHandler(handler)


def flush_logs() -> None:
    """Write the lines the access log still buffers (before a last line of the process)."""
    for handler in logging.getLogger(ACCESS_LOGGER).handlers:
        handler.flush()
