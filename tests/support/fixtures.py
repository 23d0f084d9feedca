"""Set-ups many HTTP tests repeat, as fixtures: a funded user, a sent packet."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.support.http import ADMIN, SERVICE, assert_ok

FundedUser = Callable[[str, int], int]
SentPacket = Callable[..., dict[str, Any]]


@pytest.fixture
def funded_user(client: TestClient) -> FundedUser:
    """`funded_user(user_id, cents)`: deposit (a fresh reference each call); the new balance."""
    references = itertools.count(1)

    def fund(user_id: str, cents: int) -> int:
        body = assert_ok(
            client.post(
                f"/v1/accounts/{user_id}/deposits",
                json={"amount_cents": cents, "reference": f"fixture-{user_id}-{next(references)}"},
                headers=ADMIN,
            ),
            201,
        )
        return int(body["balance_cents"])

    return fund


@pytest.fixture
def sent_packet(client: TestClient, funded_user: FundedUser) -> SentPacket:
    """`sent_packet(packet_id, amount_cents, count, sender_id="alice", funds=None, **body)`:
    fund the sender (with `funds`, default the amount) and send; the 201 body."""

    def send(
        packet_id: str,
        amount_cents: int,
        count: int,
        sender_id: str = "alice",
        funds: int | None = None,
        **body: Any,
    ) -> dict[str, Any]:
        funded_user(sender_id, amount_cents if funds is None else funds)
        request = {
            "sender_id": sender_id,
            "amount_cents": amount_cents,
            "count": count,
            "packet_id": packet_id,
            **body,
        }
        sent: dict[str, Any] = assert_ok(
            client.post("/v1/redpackets", json=request, headers=SERVICE), 201
        )
        return sent

    return send
