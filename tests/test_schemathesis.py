"""Generated requests against the served OpenAPI document: every operation, valid and invalid.

schemathesis reads /openapi.json from the app (in-process, lifespan included) and sends the
examples of its coverage phase (boundaries, missing and wrong-typed fields, bad ids, ...) and
Hypothesis-generated requests, positive and negative. Every answer is checked against the
document: no 5xx, a documented status, content type and body shape, and every invalid input
refused with a 4xx. The app runs with packet limits other than the defaults, so the
document's bounds are the configured ones; on fakeredis and a SQLite file, then on a real
server and PostgreSQL (the pairs of tests/conftest.py less fake+postgresql and real+sqlite:
each Redis and each database is fuzzed once, and the run stays within the suite's time).
Seeded and derandomized: the same requests every run.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import redis
import schemathesis
from schemathesis.checks import (
    allow_header_conformance,
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)
from schemathesis.config import SchemathesisConfig
from schemathesis.python import asgi

from groupbuy.api.app import create_app, openapi_document
from groupbuy.settings import Settings, load_settings
from tests.support.database import sqlite_url
from tests.support.http import ADMIN_KEY, SERVICE_KEY
from tests.support.settings import API_KEYS

pytestmark = pytest.mark.slow

# Hypothesis-generated requests per operation, positive and negative; the coverage phase's
# cases come on top: about 5,400 cases per backend, 1-2.5 minutes each here.
FUZZ_EXAMPLES = 280
MIN_CASES = 5000

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    unsupported_method,  # a method a path lacks: 405, with `Allow`
    allow_header_conformance,  # ... which lists exactly the path's documented methods
    ignored_auth,  # an operation that needs a key refuses a request without one
]

_tally: Counter[str] = Counter()
_operations: set[str] = set()
_started: list[float] = []
_backend: list[str] = []


def _settings(database_url: str, redis_url: str = "") -> Settings:
    return load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": API_KEYS,
            "GROUPBUY_DATABASE_URL": database_url,
            "GROUPBUY_REDIS_URL": redis_url,
            "GROUPBUY_SCHEDULER_ENABLED": "false",  # jobs run when the fuzzer calls them
            # limits other than the defaults: the document must carry these, the server
            # must refuse one above them (negative_data_rejection)
            "GROUPBUY_REDPACKETS_MAX_COUNT": "500",
            "GROUPBUY_REDPACKETS_MAX_AMOUNT_CENTS": "200000",
        },
    )


class _LateApp:
    """The app under test, made by a fixture (its own database file) after collection, which
    needs the document already: schemathesis calls this stand-in, which forwards."""

    app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


_APP = _LateApp()
_CONFIG = SchemathesisConfig.from_dict(
    {
        "seed": 20261123,
        "generation": {
            "mode": "all",
            "max-examples": FUZZ_EXAMPLES,
            "deterministic": True,
            "database": "none",
            # the key is sent by the test (the operation's role), so requests without one
            # are ignored_auth's to make: no generated Authorization to be replaced
            "with-security-parameters": False,
        },
        "phases": {"examples": {"enabled": False}, "stateful": {"enabled": False}},
    }
)
# The document of an app with these settings (the database file is not part of it); a test
# in tests/test_openapi.py checks it is what the app serves.
schema = schemathesis.openapi.from_dict(
    openapi_document(_settings("sqlite+aiosqlite:///-")), config=_CONFIG
)
schema.app = _APP


@pytest.fixture(
    scope="module",
    autouse=True,
    params=[
        "fake-sqlite",
        pytest.param("real-postgresql", marks=[pytest.mark.real, pytest.mark.postgres]),
    ],
)
def _app_under_test(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The app on fakeredis and SQLite, then on a real server and PostgreSQL (each run its
    own database and tally)."""
    redis_url, databases, database_name = "", None, ""
    if request.param == "real-postgresql":
        redis_url = str(request.getfixturevalue("real_redis_url"))
        with redis.Redis.from_url(redis_url) as sync_client:
            sync_client.flushall()
            sync_client.script_flush()
        databases = request.getfixturevalue("test_databases")
        database_name = databases.create()
        database_url = databases.url(database_name)
    else:
        database_url = sqlite_url(tmp_path_factory.mktemp("fuzz"))
    _APP.app = create_app(_settings(database_url, redis_url))
    _tally.clear()
    _operations.clear()
    _started[:] = [time.monotonic()]
    _backend[:] = [request.param]
    try:
        yield
    finally:
        asgi.shutdown_lifespans()  # the app's lifespan, which schemathesis started
        if databases is not None:
            databases.drop(database_name)


@schema.parametrize()
@hypothesis.settings(suppress_health_check=list(hypothesis.HealthCheck), deadline=None)
def test_every_operation_answers_as_documented(case: Any) -> None:
    role = case.operation.definition.raw.get("x-role")
    headers = {}
    if role is not None:  # the key of the operation's role; auth itself is tested elsewhere
        headers["Authorization"] = f"Bearer {ADMIN_KEY if role == 'admin' else SERVICE_KEY}"
    response = case.call_and_validate(headers=headers, checks=CHECKS)
    _tally["cases"] += 1
    _tally[f"{case.meta.generation.mode.value} cases" if case.meta else "other cases"] += 1
    _tally[f"{response.status_code // 100}xx"] += 1
    _operations.add(case.operation.label)


def test_enough_cases_ran_on_every_operation(capsys: pytest.CaptureFixture[str]) -> None:
    """After the generated tests (pytest keeps the file's order): the totals, and a floor."""
    documented = {
        f"{method.upper()} {path}"
        for path, methods in schema.raw_schema["paths"].items()
        for method in methods
    }
    if not _operations:
        pytest.skip("the generated tests did not run (deselected)")
    assert _operations == documented
    assert _tally["cases"] >= MIN_CASES, dict(_tally)
    _tally["seconds"] = round(time.monotonic() - _started[0])
    figures = ", ".join(f"{key} {value}" for key, value in sorted(_tally.items()))
    with capsys.disabled():
        print(f"\n[figures] schemathesis on {_backend[0]}: {figures}")
