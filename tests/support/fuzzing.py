"""Generated requests against the served OpenAPI document: every operation, valid and invalid.

schemathesis reads the app's OpenAPI document and sends the examples of its coverage phase
(boundaries, missing and wrong-typed fields, bad ids, ...) and Hypothesis-generated
requests, positive and negative. Every answer is checked against the document: no 5xx, a
documented status, content type and body shape, and every invalid input refused with a
4xx. The app runs with packet limits other than the defaults, so the document's bounds are
the configured ones. Seeded and derandomized: the same requests every run.

One `Fuzzing` per backend, each in a test file of its own (tests/test_schemathesis_*.py):
the test processes are handed whole files, so the two backends run side by side.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
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
from tests.support.settings import API_KEYS, TEST_GUESS_LIMIT

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


def fuzzed_settings(database_url: str, redis_url: str = "") -> Settings:
    """The settings of the app under test."""
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
            **TEST_GUESS_LIMIT,  # ignored_auth sends wrong keys to every operation
        },
    )


class _LateApp:
    """The app under test, made by a fixture (its own database) after collection, which
    needs the document already: schemathesis calls this stand-in, which forwards."""

    app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


class Fuzzing:
    """One backend's fuzzing: its app, its tests and its tally. `backend` is "fake-sqlite"
    (fakeredis and a SQLite file) or "real-postgresql" (the tests' server and PostgreSQL)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.tally: Counter[str] = Counter()
        self.operations: set[str] = set()
        self.started = 0.0
        self._app = _LateApp()
        # The document of an app with these settings (the database is not part of it); a
        # test in tests/test_openapi.py checks it is what the app serves.
        self.schema = schemathesis.openapi.from_dict(
            openapi_document(fuzzed_settings("sqlite+aiosqlite:///-")), config=_CONFIG
        )
        self.schema.app = self._app

    def app_fixture(self) -> Any:
        """The module's autouse fixture: the app on this backend, for the module's tests.
        Its one parameter names the backend in the tests' ids."""

        @pytest.fixture(scope="module", autouse=True, params=[self.backend])
        def app_under_test(
            request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[None]:
            yield from self._serve(request, tmp_path_factory.mktemp("fuzz"))

        return app_under_test

    def _serve(self, request: pytest.FixtureRequest, directory: Path) -> Iterator[None]:
        redis_url, databases, database_name = "", None, ""
        if self.backend == "real-postgresql":
            redis_url = str(request.getfixturevalue("real_redis_url"))
            with redis.Redis.from_url(redis_url) as sync_client:
                sync_client.flushall()
                sync_client.script_flush()
            databases = request.getfixturevalue("test_databases")
            database_name = databases.create()
            database_url = databases.url(database_name)
        else:
            database_url = sqlite_url(directory)
        self._app.app = create_app(fuzzed_settings(database_url, redis_url))
        self.started = time.monotonic()
        try:
            yield
        finally:
            asgi.shutdown_lifespans()  # the app's lifespan, which schemathesis started
            if databases is not None:
                databases.drop(database_name)

    def operation_test(self) -> Any:
        """The generated test: one per operation, many cases each."""

        @self.schema.parametrize()
        @hypothesis.settings(suppress_health_check=list(hypothesis.HealthCheck), deadline=None)
        def test_every_operation_answers_as_documented(case: Any) -> None:
            role = case.operation.definition.raw.get("x-role")
            headers = {}
            if role is not None:  # the key of the operation's role; auth is tested elsewhere
                headers["Authorization"] = f"Bearer {ADMIN_KEY if role == 'admin' else SERVICE_KEY}"
            response = case.call_and_validate(headers=headers, checks=CHECKS)
            self.tally["cases"] += 1
            mode = f"{case.meta.generation.mode.value} cases" if case.meta else "other cases"
            self.tally[mode] += 1
            self.tally[f"{response.status_code // 100}xx"] += 1
            self.operations.add(case.operation.label)

        return test_every_operation_answers_as_documented

    def floor_test(self) -> Callable[[pytest.CaptureFixture[str]], None]:
        """The test after the generated ones (pytest keeps a file's order): every operation
        was called, enough cases ran; the totals are printed."""

        def test_enough_cases_ran_on_every_operation(capsys: pytest.CaptureFixture[str]) -> None:
            documented = {
                f"{method.upper()} {path}"
                for path, methods in self.schema.raw_schema["paths"].items()
                for method in methods
            }
            if not self.operations:
                pytest.skip("the generated tests did not run (deselected)")
            assert self.operations == documented
            assert self.tally["cases"] >= MIN_CASES, dict(self.tally)
            self.tally["seconds"] = round(time.monotonic() - self.started)
            figures = ", ".join(f"{key} {value}" for key, value in sorted(self.tally.items()))
            with capsys.disabled():
                print(f"\n[figures] schemathesis on {self.backend}: {figures}")

        return test_enough_cases_ran_on_every_operation
