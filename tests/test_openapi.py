"""GET /openapi.json describes the server that serves it: every route, the configured limits,
the real answer shapes, the job names of the registry.

On fakeredis and a SQLite file: the document depends on neither Redis nor the database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from groupbuy_client import wire
from openapi_spec_validator import OpenAPIV31SpecValidator
from starlette.routing import Route
from starlette.testclient import TestClient

from groupbuy.api import answers
from groupbuy.api.app import create_app, openapi_document
from groupbuy.ops.jobs import JOBS
from groupbuy.settings import Settings, load_settings
from tests.support.http import ADMIN, SERVICE, assert_problem
from tests.support.settings import API_KEYS

SMALL_LIMITS = {
    "GROUPBUY_REDPACKETS_MAX_COUNT": "77",
    "GROUPBUY_REDPACKETS_MAX_AMOUNT_CENTS": "5000",
}


def _settings(tmp_path: Path, **extra: str) -> Settings:
    return load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": API_KEYS,
            "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'groupbuy.db'}",
            "GROUPBUY_REDIS_URL": "",
            "GROUPBUY_SCHEDULER_ENABLED": "false",
            **extra,
        },
    )


@pytest.fixture
def small_limits(tmp_path: Path) -> Iterator[TestClient]:
    """The API of a server configured with limits below the defaults."""
    with TestClient(create_app(_settings(tmp_path, **SMALL_LIMITS))) as client:
        yield client


def _operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


def _packet_body(doc: dict[str, Any]) -> dict[str, Any]:
    operation = doc["paths"]["/v1/redpackets"]["post"]
    schema: dict[str, Any] = operation["requestBody"]["content"]["application/json"]["schema"]
    return schema


def test_the_document_is_valid_openapi_3_1(tmp_path: Path) -> None:
    for doc in (openapi_document(Settings()), openapi_document(_settings(tmp_path))):
        assert doc["openapi"].startswith("3.1.")
        errors = [str(error) for error in OpenAPIV31SpecValidator(doc).iter_errors()]
        assert errors == []


def test_every_route_of_the_app_is_documented_and_nothing_else(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path))
    served = {
        (route.path, method.lower())
        for route in app.routes
        if isinstance(route, Route) and route.include_in_schema  # pages for browsers are not
        for method in route.methods or ()
        if method != "HEAD"  # Starlette adds HEAD to every GET
    }
    documented = {(path, method) for path, method, _ in _operations(app.state.openapi)}
    assert served == documented
    assert len(served) >= 22


def test_the_served_document_shows_the_configured_limits(small_limits: TestClient) -> None:
    doc = small_limits.get("/openapi.json").json()
    assert doc == openapi_document(
        _settings(Path("elsewhere"), **SMALL_LIMITS)
    )  # the database file is not part of it
    body = _packet_body(doc)["properties"]
    assert body["count"]["maximum"] == 77
    assert body["amount_cents"]["maximum"] == 5000
    defaults = _packet_body(openapi_document(Settings()))["properties"]
    assert defaults["count"]["maximum"] == Settings().redpackets.max_count == 10_000
    assert defaults["amount_cents"]["maximum"] == Settings().redpackets.max_amount_cents


def test_the_server_enforces_exactly_the_documented_limits(small_limits: TestClient) -> None:
    deposit = {"amount_cents": 10_000, "reference": "r1"}
    assert small_limits.post("/v1/accounts/s/deposits", json=deposit, headers=ADMIN).is_success
    packet = {"sender_id": "s", "amount_cents": 5000, "count": 77}
    assert small_limits.post("/v1/redpackets", json=packet, headers=SERVICE).status_code == 201
    for field, over in (("count", 78), ("amount_cents", 5001)):
        problem = assert_problem(
            small_limits.post("/v1/redpackets", json={**packet, field: over}, headers=SERVICE),
            422,
            "invalid_request",
        )
        assert [e["field"] for e in problem["errors"]] == [field], problem


def test_an_integral_float_is_refused_as_documented(small_limits: TestClient) -> None:
    for raw in (b"100.0", b"1e3"):
        problem = assert_problem(
            small_limits.post(
                "/v1/redpackets",
                content=b'{"sender_id": "s", "amount_cents": %s, "count": 1}' % raw,
                headers={**SERVICE, "content-type": "application/json"},
            ),
            422,
            "invalid_request",
        )
        assert [e["field"] for e in problem["errors"]] == ["amount_cents"], problem
    for path, method in (("/v1/redpackets", "post"), ("/v1/activities", "post")):
        responses = _operation(small_limits, path, method)["responses"]
        assert "(`1.0` and `1e3` are refused" in responses["422"]["description"]
    # a body without integers does not carry the sentence
    responses = _operation(small_limits, "/v1/redpackets/{packet_id}/grab", "post")["responses"]
    assert "1e3" not in responses["422"]["description"]


def _operation(client: TestClient, path: str, method: str) -> dict[str, Any]:
    operation: dict[str, Any] = client.get("/openapi.json").json()["paths"][path][method]
    return operation


def _resolved(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def test_every_success_answer_has_its_real_schema() -> None:
    doc = openapi_document(Settings())
    checked = 0
    for path, method, operation in _operations(doc):
        for status, response in operation["responses"].items():
            if "application/problem+json" in response["content"]:
                continue
            ((media, spec),) = response["content"].items()
            schema = _resolved(doc, spec["schema"])
            if media == "application/json":
                # an object with its fields listed, or a choice of such objects
                shapes = [_resolved(doc, s) for s in schema.get("oneOf", [schema])]
                for shape in shapes:
                    assert shape.get("type") == "object", (path, method, status)
                    assert shape.get("properties"), (path, method, status)
                    assert shape.get("required"), (path, method, status)
            else:
                assert media == "text/plain" and schema == {"type": "string"}, (path, method)
            checked += 1
    assert checked >= 22


def test_every_error_answer_is_a_problem_with_its_codes() -> None:
    doc = openapi_document(Settings())
    for path, method, operation in _operations(doc):
        for status, response in operation["responses"].items():
            if status.startswith("2") or (path, status) == ("/readyz", "503"):
                continue
            schema = response["content"]["application/problem+json"]["schema"]
            assert schema["allOf"][0] == {"$ref": "#/components/schemas/Problem"}
            codes = schema["allOf"][1]["properties"]["code"]["oneOf"]
            assert codes and all(code["const"] for code in codes), (path, method, status)


def test_the_job_names_are_the_registry_of_the_running_app(tmp_path: Path) -> None:
    with TestClient(create_app(_settings(tmp_path))) as client:
        parameter = _operation(client, "/v1/admin/jobs/{name}/run", "post")["parameters"][0]
        running = list(client.app.state.services.jobs.jobs)  # type: ignore[attr-defined]
    assert parameter["name"] == "name"
    assert parameter["schema"]["enum"] == running == list(JOBS)


def test_every_job_answers_its_documented_report(tmp_path: Path) -> None:
    with TestClient(create_app(_settings(tmp_path))) as client:
        for name in JOBS:
            response = client.post(f"/v1/admin/jobs/{name}/run", headers=ADMIN)
            assert response.status_code == 200, response.text
            report = answers.validate(wire.JobReport, response.json())
            assert report["job"] == name
        assert_problem(client.post("/v1/admin/jobs/nope/run", headers=ADMIN), 404, "not_found")


def test_a_405_allows_exactly_the_documented_methods_of_its_path(tmp_path: Path) -> None:
    with TestClient(create_app(_settings(tmp_path))) as client:
        doc = client.get("/openapi.json").json()
        for path, methods in doc["paths"].items():
            documented = {method.upper() for method in methods}
            if "GET" in documented:
                documented.add("HEAD")  # Starlette answers HEAD wherever GET is
            url = path.replace("{name}", "repair").replace("{", "").replace("}", "")
            for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - documented:
                response = client.request(method, url, headers=ADMIN)
                assert_problem(response, 405, "method_not_allowed")
                allowed = {m.strip() for m in response.headers["allow"].split(",")}
                assert allowed == documented, (method, path)


def test_an_operation_with_a_body_documents_what_any_body_may_be_refused_with() -> None:
    doc = openapi_document(Settings())
    with_body = 0
    for path, method, operation in _operations(doc):
        statuses = set(operation["responses"])
        if "requestBody" in operation:
            with_body += 1
            assert {"408", "413", "415", "422"} <= statuses, (path, method)
        else:
            assert not {"408", "413", "415"} & statuses, (path, method)
    assert with_body >= 8
