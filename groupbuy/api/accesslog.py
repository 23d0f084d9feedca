"""Where the access log's lines go: buffered, written a batch at a time.

A StreamHandler writes and flushes every record, one system call per request; under
load that was a visible part of each request's cost. This handler keeps the formatted
lines and writes them together when `capacity` lines wait, when a line is older than
`max_delay_s` (a background thread checks), on a WARNING or worse, and at exit
(logging.shutdown flushes every handler). No line is dropped; a line waits at most
about `max_delay_s` before it is written.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from functools import lru_cache
from typing import TextIO

# No Starlette here: `groupbuy worker` configures logging without importing the API.


class BufferedLineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler that writes its lines in batches (see the module doc)."""

    def __init__(
        self, stream: TextIO | None = None, capacity: int = 256, max_delay_s: float = 0.25
    ) -> None:
        super().__init__(stream)
        # Without a stream: whatever sys.stderr is when a batch is written, as logging's
        # last resort does (whoever replaced stderr since, and closed the old one, gets
        # the lines instead of a "Logging error" about a closed file).
        self._to_stderr = stream is None
        self.capacity = capacity
        self.max_delay_s = max_delay_s
        self._lines: list[str] = []
        self._first_at = 0.0
        self._flusher = threading.Thread(
            target=self._flush_periodically, name="access-log-flush", daemon=True
        )
        self._flusher.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        if not self._lines:
            self._first_at = time.monotonic()
        self._lines.append(line)
        if len(self._lines) >= self.capacity or record.levelno >= logging.WARNING:
            self._write()

    def flush(self) -> None:
        self.acquire()
        try:
            self._write()
        finally:
            self.release()

    def _write(self) -> None:
        if not self._lines:
            return
        text = self.terminator.join(self._lines) + self.terminator
        self._lines = []
        stream = sys.stderr if self._to_stderr else self.stream
        try:
            stream.write(text)
            stream.flush()
        except Exception:  # a closed or broken stream must not take a request down
            self.handleError(_LOST)

    def _flush_periodically(self) -> None:
        while True:
            time.sleep(self.max_delay_s / 2)
            if self._lines and time.monotonic() - self._first_at >= self.max_delay_s:
                self.flush()


class CachedTimeFormatter(logging.Formatter):
    """A Formatter that formats each second's timestamp once (the milliseconds vary)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        seconds = int(record.created)
        return f"{_local_second(seconds, datefmt)},{int(record.msecs):03d}"


@lru_cache(maxsize=64)
def _local_second(seconds: int, datefmt: str | None) -> str:
    return time.strftime(datefmt or "%Y-%m-%d %H:%M:%S", time.localtime(seconds))


_LOST = logging.LogRecord(__name__, logging.ERROR, __file__, 0, "access lines lost", (), None)
