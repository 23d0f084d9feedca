"""Set-up fixtures shared by the tests: a funded user, a sent packet, an open team.

Each is a factory, because the tests need several of them or need them with their own
figures; each asserts that its set-up succeeded, so a test starts from a known state.
Registered for every test by tests/conftest.py (`pytest_plugins`).
"""

from __future__ import annotations

from typing import Any, Protocol

import pytest
from starlette.testclient import TestClient

from groupbuy.services import Services
from tests.support.http import assert_ok, deposit, make_activity, open_team, send


class FundUser(Protocol):
    def __call__(self, user_id: str, amount_cents: int, reference: str | None = None) -> str: ...


class SendPacket(Protocol):
    def __call__(
        self,
        amount_cents: int,
        count: int,
        *,
        funds: int | None = None,
        sender_id: str = "alice",
        packet_id: str | None = "p1",
        **extra: Any,
    ) -> Any: ...


class SendPacketViaServices(Protocol):
    async def __call__(
        self,
        amount_cents: int,
        count: int,
        *,
        funds: int | None = None,
        sender_id: str = "sender",
        packet_id: str = "pk",
        expires_in_s: int | None = None,
    ) -> dict[str, Any]: ...


class OpenTeam(Protocol):
    def __call__(
        self,
        activity_id: str = "a",
        team_id: str = "t1",
        leader_id: str = "L",
        *,
        order_id: str | None = None,
        **activity: Any,
    ) -> Any: ...


@pytest.fixture
def funded_user(client: TestClient) -> FundUser:
    """Deposit into a user's account through the API (201 Created); returns the user id."""

    def fund(user_id: str, amount_cents: int, reference: str | None = None) -> str:
        reference = reference or f"dep-{user_id}-{amount_cents}"
        assert_ok(deposit(client, user_id, amount_cents, reference), 201)
        return user_id

    return fund


@pytest.fixture
def sent_packet(client: TestClient, funded_user: FundUser) -> SendPacket:
    """Send a packet through the API (201 Created), depositing `funds` for its sender first
    when given; returns the sent body."""

    def send_packet(
        amount_cents: int,
        count: int,
        *,
        funds: int | None = None,
        sender_id: str = "alice",
        packet_id: str | None = "p1",
        **extra: Any,
    ) -> Any:
        if funds is not None:
            funded_user(sender_id, funds)
        body = {"sender_id": sender_id, "amount_cents": amount_cents, "count": count}
        return assert_ok(send(client, **body, packet_id=packet_id, **extra), 201)

    return send_packet


@pytest.fixture
def sent_packet_via_services(services: Services) -> SendPacketViaServices:
    """Send a packet through the services (no HTTP), depositing `funds` for its sender first
    when given; returns the packet body."""

    async def send_packet(
        amount_cents: int,
        count: int,
        *,
        funds: int | None = None,
        sender_id: str = "sender",
        packet_id: str = "pk",
        expires_in_s: int | None = None,
    ) -> dict[str, Any]:
        packets = services.packets
        if funds is not None:
            await packets.accounts.deposit(sender_id, funds, "funds")
        sent = await packets.sending.send(
            sender_id, amount_cents, count, packet_id=packet_id, expires_in_s=expires_in_s
        )
        assert sent.created, sent.body
        return dict(sent.body)

    return send_packet


@pytest.fixture
def opened_team(client: TestClient) -> OpenTeam:
    """Create an activity with these parameters and open one team in it through the API
    (201 Created each); returns the team."""

    def create_and_open(
        activity_id: str = "a",
        team_id: str = "t1",
        leader_id: str = "L",
        *,
        order_id: str | None = None,
        **activity: Any,
    ) -> Any:
        make_activity(client, activity_id, **activity)
        return open_team(client, activity_id, team_id, leader_id, order=order_id)

    return create_and_open
