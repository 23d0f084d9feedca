"""Poison records in the write-behind streams mid-storm: each goes to the dead letters
(SQL row, dead-letter stream, metric, admin view), never dropped, never blocking the rest."""

from __future__ import annotations

from typing import Any

from groupbuy import metrics
from tests.support.http import ADMIN, SERVICE
from tests.support.storm import (
    RedisUnderTest,
    Storm,
    check_after_storm,
    running_app,
    services_of,
    storm_settings,
)

POISON_GRABS: list[dict[Any, Any]] = [
    {"type": "grab", "packet_id": "pk1", "user_id": "bad-amount", "seq": "1", "amount_cents": "x"},
    {"type": "packet.renamed", "packet_id": "pk1", "at_ms": "1", "sender_id": "sender"},
    {"type": "grab", "packet_id": "pk1", "user_id": "no-seq"},
]
POISON_TEAM: dict[Any, Any] = {
    "type": "team.renamed",
    "activity_id": "act",
    "team_id": "t0",
    "at_ms": "1",
}


def counted(stream: str) -> float:
    return float(metrics.DEAD_LETTERS.labels(stream=stream)._value.get())


async def test_poison_records_mid_storm(redis_server: RedisUnderTest, database_url: str) -> None:
    admin = redis_server.client()
    before = {stream: counted(stream) for stream in ("packets", "teams")}
    async with running_app(storm_settings(redis_server.url, database_url)) as (app, client):
        keys = services_of(app).keys
        storm = Storm(client)
        await storm.prepare()
        storm.start()
        await storm.wait_calls(300)
        injected = [admin.xadd(keys.packet_outbox("pk1"), fields) for fields in POISON_GRABS]
        injected.append(admin.xadd(keys.outbox("act"), POISON_TEAM))
        # A team record after it lists the activity's stream for the write-behind.
        opened = await client.post(
            "/v1/activities/act/teams",
            json={"leader_id": "late", "team_id": "late"},
            headers=SERVICE,
        )
        assert opened.status_code == 201, opened.text
        await storm.wait_calls(storm.calls + 300)
        await storm.stop()
        figures = await check_after_storm(
            "poison records", storm, app, client, poison_records=len(injected)
        )
        page = (await client.get("/v1/admin/dead-letters?limit=10", headers=ADMIN)).json()
        team = (await client.get("/v1/activities/act/teams/late", headers=SERVICE)).json()
    admin.close()
    letters = page["dead_letters"]
    owners = ["pk1"] * len(POISON_GRABS) + ["act"]
    assert sorted((d["owner_id"], d["entry_id"]) for d in letters) == sorted(
        zip(owners, injected, strict=True)
    ), letters
    assert page["next_cursor"] is None
    by_id = {(d["owner_id"], d["entry_id"]): d for d in letters}
    for key, fields in zip(
        zip(owners, injected, strict=True), [*POISON_GRABS, POISON_TEAM], strict=True
    ):
        assert by_id[key]["fields"] == fields and by_id[key]["error"], by_id[key]
    assert counted("packets") - before["packets"] == len(POISON_GRABS)
    assert counted("teams") - before["teams"] == 1
    assert team["leader_id"] == "late"  # recorded after the poison: the stream went on
    assert figures.grabbed > 0
