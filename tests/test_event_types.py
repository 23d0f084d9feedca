"""groupbuy.event_types, the registry docs/api.md and docs/webhooks.md list, against the
events the engines record: every type is registered, and each event's `data` has exactly
its registered fields. The scripts' records are held to their TypedDicts by the
`test_every_record_the_scripts_emit_has_exactly_its_typed_fields` tests of tests/lua/;
here a full record of each TypedDict goes through its projection into the feed."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from groupbuy.event_types import EVENT_TYPES
from groupbuy.locks import records as team_records
from groupbuy.locks.models import ActivityRow
from groupbuy.redpacket import records as packet_records
from groupbuy.redpacket.recording import apply_packet_records
from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.storage.events import EventRow, read_feed, record_events
from groupbuy.storage.typedrecords import record_keys
from groupbuy.webhooks import queue
from groupbuy.webhooks.outcomes import DISABLED_EVENT, Outcome, complete
from groupbuy.webhooks.sender import Reply
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from scripts import event_docs
from tests.support.fixtures import SendPacket
from tests.support.http import SERVICE, assert_ok
from tests.support.webhooks import FakeClock, feed, team_event

# Field values of a synthetic record, by field name (any other field: an id-like word).
_NUMBERS = {
    "size": "3",
    "seq": "2",
    "version": "4",
    "virtual_seats": "1",
    "offered": "1",
    "epoch": "0",
}
_MONEY = {"amount_cents": "500", "refunded_cents": "300", "remaining_count": "2"}
_IDS = {"activity_id": "a1", "team_id": "t1", "packet_id": "p1"}
AT_MS = 1_800_000_000_000  # any epoch ms
DAY_MS = 86_400_000  # an endpoint failing this long is disabled


def registered(event_type: str) -> set[str]:
    """The `data` fields the registry lists for a type."""
    return {field.name for field in EVENT_TYPES[event_type].data}


def full_record(name: str, shape: Any) -> dict[str, str]:
    """A record of `shape` with every field, optional ones included."""
    required, optional = record_keys(shape)
    values = {**_NUMBERS, **_MONEY, "members": "u1|o1,u2|", "type": name}
    record = {}
    for field in required | optional:
        if field.endswith("_ms"):
            record[field] = str(AT_MS)
        else:
            record[field] = values.get(field, _IDS.get(field, "w"))
    return record


async def recorded(db: Database) -> dict[str, set[str]]:
    """Each event type in the events table -> the keys of its `data`."""
    async with db.sessions() as session:
        rows = (await session.execute(select(EventRow.type, EventRow.data))).all()
    return {kind: set(json.loads(data)) for kind, data in rows}


def test_every_event_type_an_engine_records_is_registered() -> None:
    """The registry names the team, packet and webhook events, and nothing else."""
    engines = {*team_records.EVENT_TYPES, *packet_records.EVENT_TYPES, DISABLED_EVENT}
    assert set(EVENT_TYPES) == engines


async def test_each_team_record_projects_to_its_registered_fields(db: Database) -> None:
    """Every team record type, with all its fields, as the write-behind turns it into events."""
    records = [
        team_records.parse_team_record(full_record(name, shape))
        for name, shape in team_records.TEAM_RECORDS.items()
    ]
    records.sort(key=lambda r: r["type"] != "team.opened")  # its team row first
    async with db.transaction() as session:
        session.add(
            ActivityRow(
                activity_id="a1",
                team_size=3,
                lock_ttl_s=60,
                team_deadline_s=600,
                created_at=datetime.fromtimestamp(AT_MS / 1000, UTC),
            )
        )
        await session.flush()
        await record_events(session, await team_records.project_team_records(session, records))
    found = await recorded(db)
    assert set(found) == set(team_records.TEAM_RECORDS)
    for kind, fields in found.items():
        assert fields == registered(kind), kind


async def test_each_packet_ending_projects_to_its_registered_fields(db: Database) -> None:
    """Every packet record type that makes an event, with all its fields."""
    records = [
        packet_records.parse_packet_record(full_record(name, shape))
        for name, shape in packet_records.PACKET_RECORDS.items()
    ]
    async with db.transaction() as session:
        await apply_packet_records(session, records)
    found = await recorded(db)
    assert set(found) == set(packet_records.PACKET_RECORDS) - {"grab"}  # a grab is no event
    for kind, fields in found.items():
        assert fields == registered(kind), kind


def test_a_sent_packet_has_its_registered_fields(
    client: TestClient, sent_packet: SendPacket
) -> None:
    """packet.sent, written by the send itself (no record), as the feed serves it."""
    sent_packet(500, 3, funds=1000, message="hi")
    page = assert_ok(client.get("/v1/events?after=0&limit=100", headers=SERVICE), 200)
    sent = [e["data"] for e in page["events"] if e["type"] == "packet.sent"]
    assert len(sent) == 1 and set(sent[0]) == registered("packet.sent")


async def test_a_disabled_endpoint_has_its_registered_fields(db: Database) -> None:
    """endpoint.disabled, written when an endpoint answers 410."""
    clock = FakeClock()
    settings = WebhookSettings(allow_http=True, allow_private_networks=True)
    hooks = WebhookService(db, settings, clock=clock)
    try:
        await hooks.create(EndpointSpec("gone", "http://127.0.0.1:9/gone", ("*",)))
        await feed(db, team_event("team.opened", "t1", 1))
        await queue.derive(db, clock())
        claimed = await queue.claim(db, "gone", clock(), 1, 60_000, queue.new_owner())
        gone = Outcome(claimed[0], Reply(410, None, 5, b""), clock())
        await complete(db, [gone], disable_after_ms=DAY_MS)
    finally:
        await hooks.deliverer.stop()
    events = (await read_feed(db, 0, 100))["events"]
    disabled = [e["data"] for e in events if e["type"] == DISABLED_EVENT]
    assert len(disabled) == 1 and set(disabled[0]) == registered(DISABLED_EVENT)


def test_docs_webhooks_md_lists_the_registry() -> None:
    """docs/webhooks.md's table is the registry's (`python -m scripts.event_docs --check`)."""
    assert event_docs.main(["--check"]) == 0, f"regenerate: {event_docs.REGENERATE}"


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_the_table_has_a_row_per_type(event_type: str) -> None:
    """Each registered type is one row of the generated table, with each of its fields."""
    rows = [row for row in event_docs.render_table() if row.startswith(f"| `{event_type}` |")]
    assert len(rows) == 1
    assert all(f"`{name}`" in rows[0] for name in registered(event_type))
