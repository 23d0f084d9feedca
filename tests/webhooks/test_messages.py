"""A delivery's body: the envelope around the feed event, whose data is the JSON text the
feed stored, spliced in as it is."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from groupbuy.storage.events import Event, _row
from groupbuy.webhooks.messages import Bodies, message

AT_MS = 1_763_746_971_123
AT = "2025-11-21T17:42:51.123Z"


@pytest.mark.parametrize(
    "data",
    [
        {"activity_id": "a1", "team_id": "t1", "version": 3, "members": ["u1", "u2"]},
        {"packet_id": "红包-1", "note": 'line\nbreak "quoted" \\ \u2028', "cents": 2**70},
        {"nested": {"empty": {}, "list": [], "null": None, "float": 1.5, "flag": False}},
        {},
    ],
)
def test_the_body_carries_the_stored_event_data_unchanged(data: dict[str, Any]) -> None:
    stored = _row(Event("team.formed", AT_MS, "key", data))["data"]
    body = message(42, "team.formed", AT_MS, stored)
    assert json.loads(body) == {
        "type": "team.formed",
        "timestamp": AT,
        "data": {"id": 42, "type": "team.formed", "at": AT, "data": data},
    }
    assert body.startswith(b'{"type":"team.formed","timestamp":"')  # compact


def test_an_event_is_rendered_once_per_pass() -> None:
    bodies = Bodies()
    at = datetime.fromtimestamp(AT_MS / 1000, tz=UTC)
    first = bodies.body(7, "packet.refunded", at, '{"packet_id":"p1"}')
    assert bodies.body(7, "packet.refunded", at, '{"packet_id":"p1"}') is first
    assert json.loads(first)["data"]["data"] == {"packet_id": "p1"}
