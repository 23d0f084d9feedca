"""Dissolving a team from its console page: an admin action like the others (the session's
token, a reason, the confirmation), audited as the API's dissolve is, shown on open teams
only."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from tests.support.console import VIEWER_KEY, action_forms, form_of, parts_of, sign_in
from tests.support.http import ADMIN, ADMIN_KEY, SERVICE, assert_ok, make_activity, open_team

TEAM = "/console/activities/a1/teams/t1"


def _team(client: TestClient) -> Any:
    return assert_ok(client.get("/v1/activities/a1/teams/t1", headers=SERVICE), 200)


def test_an_admin_dissolves_an_open_team_from_its_page(client: TestClient) -> None:
    make_activity(client, "a1", team_size=3)
    open_team(client, "a1", "t1", "L", "oL")
    assert sign_in(client, ADMIN_KEY).status_code == 303
    page = client.get(TEAM)
    assert [f["action"] for f in action_forms(parts_of(page.text))] == [f"{TEAM}/dissolve"]

    for change, status in (({"reason": " "}, 422), ({"confirm": ""}, 422), ({"csrf": "x"}, 403)):
        refused = client.post(f"{TEAM}/dissolve", data={**form_of(client, TEAM), **change})
        assert refused.status_code == status
    assert _team(client)["status"] == "open"

    form = form_of(client, TEAM, reason="scalpers")
    done = client.post(f"{TEAM}/dissolve", data=form, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == TEAM
    assert _team(client)["status"] == "failed"
    audit = assert_ok(client.get("/v1/admin/audit", headers=ADMIN), 200)["entries"]
    [entry] = [e for e in audit if e["action"] == "team.dissolve"]
    assert (entry["target"], entry["reason"]) == ("a1/t1", "scalpers")
    assert entry["detail"] == {"status": "failed", "dissolved": True}
    assert action_forms(parts_of(client.get(TEAM).text)) == []  # a failed team: no action


def test_a_viewer_sees_no_dissolve(client: TestClient) -> None:
    make_activity(client, "a1", team_size=3)
    open_team(client, "a1", "t1", "L")
    assert sign_in(client, VIEWER_KEY).status_code == 303
    assert action_forms(parts_of(client.get(TEAM).text)) == []
