"""The access log's buffered handler and the orjson answers (cheaper, nothing lost or
changed), and [log]: one format for every line."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import time
from collections.abc import Iterator

import pytest
from groupbuy_client.wire import iso_ms
from hypothesis import given
from hypothesis import strategies as st
from starlette.responses import JSONResponse

from groupbuy.api import ACCESS_LOGGER
from groupbuy.api.accesslog import BufferedLineHandler, CachedTimeFormatter
from groupbuy.api.endpoints import FastJSONResponse
from groupbuy.api.logformat import JsonFormatter, configure_logging, flush_logs


def _logger(handler: logging.Handler, name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_lines_wait_for_the_batch_then_leave_together_in_order() -> None:
    stream = io.StringIO()
    handler = BufferedLineHandler(stream, capacity=10, max_delay_s=60)
    log = _logger(handler, "test.access.batch")
    for i in range(9):
        log.info("line %d", i)
    assert stream.getvalue() == ""  # below capacity and not old: still buffered
    log.info("line 9")
    assert stream.getvalue().splitlines() == [f"line {i}" for i in range(10)]


def test_a_warning_and_an_explicit_flush_write_at_once() -> None:
    stream = io.StringIO()
    handler = BufferedLineHandler(stream, capacity=1000, max_delay_s=60)
    log = _logger(handler, "test.access.flush")
    log.info("first")
    log.warning("bad")
    assert stream.getvalue().splitlines() == ["first", "bad"]
    log.info("last")
    handler.flush()
    assert stream.getvalue().splitlines() == ["first", "bad", "last"]


def test_an_old_line_is_written_by_the_background_flush() -> None:
    stream = io.StringIO()
    handler = BufferedLineHandler(stream, capacity=1000, max_delay_s=0.05)
    log = _logger(handler, "test.access.delay")
    log.info("lonely")
    deadline = time.monotonic() + 5
    while stream.getvalue() == "" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream.getvalue() == "lonely\n"


def test_the_cached_timestamp_matches_the_standard_formatter() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    assert CachedTimeFormatter(fmt).format(record) == logging.Formatter(fmt).format(record)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(json_values)
def test_orjson_answers_are_the_bytes_starlette_would_write(body: object) -> None:
    assert FastJSONResponse(body).body == JSONResponse(body).body
    assert json.loads(bytes(FastJSONResponse(body).body)) == body


@given(st.integers(min_value=0, max_value=253402300799999))
def test_iso_ms_matches_a_direct_conversion(ms: int) -> None:
    from datetime import UTC, datetime

    moment = datetime.fromtimestamp(ms // 1000, tz=UTC)
    assert iso_ms(ms) == moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def test_without_a_stream_lines_go_to_the_stderr_of_the_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Configured once per process against sys.stderr, the handler must follow a stderr
    replaced since (the old one closed): no "Logging error" about a closed file."""
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    handler = BufferedLineHandler(capacity=1000, max_delay_s=60)
    log = _logger(handler, "test.access.stderr")
    log.info("to the first")
    handler.flush()
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    log.info("to the second")
    handler.flush()
    assert second.getvalue() == "to the second\n"


# -- [log]: one format for every line ---------------------------------------------------------


@pytest.fixture
def clean_logging() -> Iterator[None]:
    """Put back the root and access loggers as they were (configure_logging changes both)."""
    root, access = logging.getLogger(), logging.getLogger(ACCESS_LOGGER)
    saved = (list(root.handlers), root.level, list(access.handlers), access.level)
    propagate = access.propagate
    yield
    for handler in access.handlers:
        if handler not in saved[2]:
            handler.flush()
    root.handlers, root.level, access.handlers, access.level = saved
    access.propagate = propagate


@pytest.mark.usefixtures("clean_logging")
@pytest.mark.parametrize("form", ["text", "json"])
def test_every_logger_writes_in_the_one_format(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    # uvicorn started in this process before (a test's receiver) set its logger's level
    monkeypatch.setattr(logging.getLogger("uvicorn.error"), "level", logging.CRITICAL)
    configure_logging("info", True, form)
    configure_logging("info", True, form)  # again (a worker process, a second command): once
    logging.getLogger("groupbuy.somewhere").warning("careful: %d", 7)
    logging.getLogger("uvicorn.error").error("a server line")
    logging.getLogger("groupbuy.quiet").debug("below the level")
    record = logging.LogRecord(
        ACCESS_LOGGER, logging.INFO, "", 0, "%s %s %s", ("GET", "/healthz", "-"), None
    )
    record.field_names = ("method", "route", "outcome")
    logging.getLogger(ACCESS_LOGGER).handle(record)
    flush_logs()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3, lines
    if form == "text":
        stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
        assert re.fullmatch(rf"{stamp} WARNING groupbuy.somewhere: careful: 7", lines[0])
        assert re.fullmatch(rf"{stamp} ERROR uvicorn.error: a server line", lines[1])
        assert re.fullmatch(rf"{stamp} INFO groupbuy.access: GET /healthz -", lines[2])
        return
    parsed = [json.loads(line) for line in lines]
    for line in parsed:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line.pop("time"))
    assert parsed == [
        {"level": "WARNING", "logger": "groupbuy.somewhere", "message": "careful: 7"},
        {"level": "ERROR", "logger": "uvicorn.error", "message": "a server line"},
        {
            "level": "INFO",
            "logger": ACCESS_LOGGER,
            "method": "GET",
            "route": "/healthz",
            "outcome": "-",
        },
    ]


@pytest.mark.usefixtures("clean_logging")
def test_the_level_and_access_log_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    configure_logging("warning", False, "text")
    logging.getLogger("groupbuy.x").info("hidden")
    logging.getLogger(ACCESS_LOGGER).info("hidden too")
    logging.getLogger("groupbuy.x").warning("shown")
    flush_logs()
    assert [line.rsplit(": ", 1)[1] for line in stream.getvalue().splitlines()] == ["shown"]
    # access lines are their own switch: on, they are written whatever the level
    configure_logging("warning", True, "text")
    logging.getLogger(ACCESS_LOGGER).info("an access line")
    flush_logs()
    assert stream.getvalue().splitlines()[-1].endswith("groupbuy.access: an access line")


def test_a_traceback_stays_inside_its_json_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("x", logging.ERROR, "", 0, "failed", (), sys.exc_info())
    [line] = JsonFormatter().format(record).splitlines()
    parsed = json.loads(line)
    assert parsed["message"] == "failed" and "RuntimeError: boom" in parsed["exception"]
