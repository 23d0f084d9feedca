"""docs/api.md is the rendered OpenAPI document, and the documented answers are the real ones."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from groupbuy import errors
from groupbuy.api import answers
from groupbuy.api.app import ENDPOINTS
from groupbuy.api.endpoints import Endpoint
from groupbuy.api.openapi import build_openapi
from scripts.api_reference import REGENERATE, current_reference
from tests.support.http import ADMIN, SERVICE

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def test_docs_api_md_is_the_rendered_openapi_document() -> None:
    rendered = current_reference()  # the default settings' document
    on_disk = REFERENCE.read_text(encoding="utf-8") if REFERENCE.exists() else ""
    assert rendered == on_disk, f"docs/api.md is out of date; regenerate it: {REGENERATE}"


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(value) for value in node))
    return set()


def _all_error_classes() -> dict[str, type[errors.GroupBuyError]]:
    found: dict[str, type[errors.GroupBuyError]] = {}
    pending: list[type[errors.GroupBuyError]] = [errors.GroupBuyError]
    while pending:
        cls = pending.pop()
        found[cls.code] = cls
        pending.extend(cls.__subclasses__())
    return found


def test_openapi_refs_resolve_and_problem_codes_are_real() -> None:
    doc = build_openapi(ENDPOINTS)
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/"), ref  # no document-relative $defs
        assert ref.rsplit("/", 1)[-1] in schemas, ref
    known = _all_error_classes()
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            for status, response in operation["responses"].items():
                content = response["content"]
                if "application/problem+json" not in content:
                    continue
                schema = content["application/problem+json"]["schema"]["allOf"][1]
                codes = [c["const"] for c in schema["properties"]["code"]["oneOf"]]
                assert codes, (path, method, status)
                for code in codes:
                    assert known[code].status_code == int(status), (path, method, code)


# -- the documented answers are the real ones -------------------------------------------


def _endpoint(method: str, url: str) -> Endpoint:
    path = url.split("?", 1)[0]
    for endpoint in ENDPOINTS:
        pattern = re.sub(r"{\w+}", "[^/]+", endpoint.path)
        if endpoint.method == method and re.fullmatch(pattern, path):
            return endpoint
    raise AssertionError(f"no endpoint for {method} {url}")


def _documented_codes(endpoint: Endpoint, status: int) -> set[str]:
    doc = build_openapi([endpoint])
    response = doc["paths"][endpoint.path][endpoint.method.lower()]["responses"][str(status)]
    schema = response["content"]["application/problem+json"]["schema"]["allOf"][1]
    return {c["const"] for c in schema["properties"]["code"]["oneOf"]}


class Checked:
    """Calls the API and checks every answer against its endpoint's documentation."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    def __call__(
        self, method: str, url: str, expect: int, body: Any = None, headers: Any = SERVICE
    ) -> Any:
        r = self.client.request(method, url, json=body, headers=headers)
        assert r.status_code == expect, (method, url, r.status_code, r.text)
        endpoint = _endpoint(method, url)
        if r.status_code in endpoint.responses:
            if endpoint.answer is not None:
                answers.validate(endpoint.answer, r.json())
            return r.json() if endpoint.media_type == "application/json" else r.text
        assert r.headers["content-type"].startswith("application/problem+json"), r.headers
        problem = r.json()
        assert problem["code"] in _documented_codes(endpoint, r.status_code), problem
        return problem


def test_every_answer_has_its_documented_shape(client: TestClient) -> None:
    call = Checked(client)
    call("GET", "/healthz", 200, headers={})
    call("GET", "/readyz", 200, headers={})
    call("GET", "/metrics", 200, headers={})

    activity = {"activity_id": "a1", "name": "Spring", "team_size": 3}
    call("POST", "/v1/activities", 201, activity, ADMIN)
    call("POST", "/v1/activities", 200, activity, ADMIN)
    call("POST", "/v1/activities", 409, {**activity, "team_size": 4}, ADMIN)
    call("POST", "/v1/activities", 403, activity)
    call("GET", "/v1/activities/a1", 200)
    call("GET", "/v1/activities/nope", 404)

    team = "/v1/activities/a1/teams/t1"
    call("POST", "/v1/activities/a1/teams", 201, {"leader_id": "L", "team_id": "t1"})
    call("POST", "/v1/activities/a1/teams", 200, {"leader_id": "L", "team_id": "t1"})
    call("POST", "/v1/activities/a1/teams", 409, {"leader_id": "M", "team_id": "t1"})
    call("POST", "/v1/activities/a1/teams", 201, {"leader_id": "M", "team_id": "t2"})
    call("POST", "/v1/activities/a1/teams/t2/locks", 201, {"user_id": "u1"})
    switched = call("POST", f"{team}/locks", 201, {"user_id": "u1"})
    assert switched["released_team_id"] == "t2"
    assert call("POST", f"{team}/locks", 200, {"user_id": "u1"})["existing"] is True
    call("POST", f"{team}/locks", 201, {"user_id": "u2"})
    full = call("POST", f"{team}/locks", 409, {"user_id": "u3"})
    assert full["code"] == "team_full" and full["next_unlock_at"]
    call("POST", f"{team}/locks", 409, {"user_id": "L"})
    call("GET", "/v1/activities/a1/users/u1/lock", 200)
    call("GET", "/v1/activities/a1/users/u9/lock", 404)
    call("POST", f"{team}/members", 409, {"user_id": "u3", "order_id": "o3"})
    call("POST", f"{team}/members", 201, {"user_id": "u1", "order_id": "o1"})
    call("POST", f"{team}/members", 200, {"user_id": "u1", "order_id": "o1"})
    assert call("DELETE", f"{team}/locks/u2", 200)["released"] is True
    call("DELETE", "/v1/activities/a1/teams/t9/locks/u2", 404)
    call("POST", f"{team}/locks", 201, {"user_id": "u3"})
    formed = call("POST", f"{team}/members", 201, {"user_id": "u3", "order_id": "o3"})
    assert formed["formed"] is True
    call("POST", f"{team}/locks", 409, {"user_id": "u4"})
    call("GET", team, 200)
    call("GET", "/v1/activities/a1/teams/t9", 404)
    teams, join = "/v1/activities/a1/teams", "/v1/activities/a1/locks"
    assert [t["team_id"] for t in call("GET", f"{teams}?limit=1", 200)["teams"]] == ["t2"]
    assert call("POST", join, 201, {"user_id": "u5"})["team_id"] == "t2"
    assert call("POST", join, 200, {"user_id": "u5"})["existing"] is True
    call("POST", join, 201, {"user_id": "u6"})
    assert call("POST", join, 409, {"user_id": "u7"})["code"] == "no_team_available"
    call("POST", "/v1/activities/nope/locks", 404, {"user_id": "u7"})
    formed_page = call("GET", f"{teams}?status=formed", 200)
    assert [t["team_id"] for t in formed_page["teams"]] == ["t1"]
    assert call("GET", f"{teams}?status=failed", 200) == {"teams": [], "next_cursor": None}
    full_page = call("GET", f"{teams}?has_free_seats=false", 200)
    assert [t["team_id"] for t in full_page["teams"]] == ["t2"]
    call("GET", f"{teams}?status=formed&has_free_seats=false", 422)
    call("GET", "/v1/activities/nope/teams", 404)
    call("GET", "/v1/activities/nope/teams?status=failed", 404)
    assert call("GET", "/v1/activities?limit=1", 200)["activities"][0]["status"] == "open"
    call("GET", "/v1/activities?status=shut", 422)
    call("PATCH", "/v1/activities/a1", 403, {"status": "closed"})
    call("PATCH", "/v1/activities/nope", 404, {"status": "closed"}, ADMIN)
    call("PATCH", "/v1/activities/a1", 422, {"status": "open"}, ADMIN)
    closed = call("PATCH", "/v1/activities/a1", 200, {"status": "closed"}, ADMIN)
    assert closed["status"] == "closed"
    assert call("POST", join, 409, {"user_id": "u8"})["code"] == "activity_closed"
    call("POST", "/v1/activities/a1/teams", 409, {"leader_id": "N"})
    call("POST", f"{teams}/t2/locks", 409, {"user_id": "u8"})

    call(
        "POST", "/v1/accounts/alice/deposits", 201, {"amount_cents": 900, "reference": "r1"}, ADMIN
    )
    call(
        "POST", "/v1/accounts/alice/deposits", 200, {"amount_cents": 900, "reference": "r1"}, ADMIN
    )
    call("POST", "/v1/accounts/alice/deposits", 409, {"amount_cents": 5, "reference": "r1"}, ADMIN)
    call("GET", "/v1/accounts/alice", 200)
    packet = {"sender_id": "alice", "amount_cents": 500, "count": 2, "packet_id": "pk1"}
    call("POST", "/v1/redpackets", 201, packet)
    call("POST", "/v1/redpackets", 200, packet)
    call("POST", "/v1/redpackets", 409, {**packet, "packet_id": "pk2"})  # insufficient funds
    call("POST", "/v1/redpackets/pk1/grab", 200, {"user_id": "bob"})
    call("POST", "/v1/redpackets/pk1/grab", 200, {"user_id": "bob"})
    call("POST", "/v1/redpackets/pk1/grab", 200, {"user_id": "carol"})
    call("POST", "/v1/redpackets/pk1/grab", 409, {"user_id": "dave"})
    call("POST", "/v1/redpackets/nope/grab", 404, {"user_id": "dave"})
    call("GET", "/v1/redpackets/pk1", 200)

    call("GET", "/v1/admin/reconcile", 404, headers=ADMIN)
    call("POST", "/v1/admin/jobs/flush_records/run", 200, headers=ADMIN)
    call("POST", "/v1/admin/jobs/reconcile/run", 200, headers=ADMIN)
    call("GET", "/v1/admin/reconcile", 200, headers=ADMIN)
    assert call("GET", "/v1/admin/dead-letters?limit=5", 200, headers=ADMIN)["dead_letters"] == []
    call("GET", "/v1/admin/dead-letters?cursor=x", 422, headers=ADMIN)
    call("GET", "/v1/admin/dead-letters", 403)
    call("POST", "/v1/admin/dead-letters/1/replay", 404, headers=ADMIN)
    call("POST", "/v1/admin/dead-letters/x/replay", 404, headers=ADMIN)
    call("POST", "/v1/admin/dead-letters/1/replay", 403)
    call("POST", "/v1/admin/jobs/nope/run", 404, headers=ADMIN)
    page = call("GET", "/v1/events?after=0&limit=1000", 200)
    assert {"team.opened", "team.formed", "packet.sent"} <= {e["type"] for e in page["events"]}
    call("GET", "/v1/events?limit=0", 422)
    call("GET", "/v1/events", 401, headers={})
