"""HTTP endpoints of accounts and red packets (parse, call the red-packet engine, answer)."""

from __future__ import annotations

from typing import Annotated, Self

from groupbuy_client import wire
from groupbuy_client.wire import ID_PATTERN, PacketStatus, SplitStrategy
from pydantic import Field, StringConstraints, create_model
from starlette.requests import Request
from starlette.responses import Response

from groupbuy import errors
from groupbuy.api.endpoints import (
    Endpoint,
    Id,
    LaxQuery,
    Problems,
    StrictBody,
    created_response,
    json_response,
)
from groupbuy.redpacket.engine import RedPackets
from groupbuy.redpacket.terms import Terms
from groupbuy.settings import AmountCents, PacketLifetimeS, Settings, ShareCount


class Deposit(StrictBody):
    """Body of POST /v1/accounts/{user_id}/deposits."""

    amount_cents: AmountCents
    reference: Id


# A greeting: up to 100 characters, none of them a control character (C0, DEL, C1).
Message = Annotated[
    str, StringConstraints(max_length=100, pattern=r"^[^\u0000-\u001f\u007f-\u009f]*$")
]
Password = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[^\u0000]*$")]


class PacketSend(StrictBody):
    """Body of POST /v1/redpackets (`count` and `amount_cents` within the configured limits)."""

    sender_id: Id
    amount_cents: AmountCents
    count: ShareCount
    packet_id: Id | None = None
    expires_in_s: PacketLifetimeS | None = None
    strategy: SplitStrategy = "double_mean"
    message: Message | None = Field(default=None, description="a greeting shown with the packet")
    recipients: list[Id] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="only these users may grab (no repeats; `count` at most their number)",
    )
    password: Password | None = Field(
        default=None, description="a grab must give it; stored only as a salted hash"
    )
    sender_may_grab: bool = Field(default=True, description="false: the sender may not grab")

    def terms(self) -> Terms:
        """The send's terms besides its money."""
        return Terms(
            message=self.message,
            recipients=tuple(self.recipients or ()),
            password=self.password,
            sender_may_grab=self.sender_may_grab,
        )

    @classmethod
    def for_settings(cls, settings: Settings) -> type[Self]:
        """`count` and `amount_cents` bounded by `[redpackets] max_count` and
        `max_amount_cents` (`amount_cents` >= `count` is checked by the service)."""
        limits = settings.redpackets
        return create_model(
            cls.__name__,
            __base__=cls,
            __doc__=cls.__doc__,
            __module__=cls.__module__,
            amount_cents=(
                Annotated[int, Field(ge=1, le=limits.max_amount_cents)],
                Field(description="at least `count` (1 cent per share)"),
            ),
            count=Annotated[int, Field(ge=1, le=limits.max_count)],
        )


class Grab(StrictBody):
    """Body of POST /v1/redpackets/{packet_id}/grab."""

    user_id: Id
    password: Password | None = Field(default=None, description="the packet's password")


class Withdraw(StrictBody):
    """Body of POST /v1/redpackets/{packet_id}/withdraw."""

    sender_id: Id


class GrabsQuery(LaxQuery):
    """Query of GET /v1/redpackets/{packet_id}/grabs."""

    limit: int = Field(default=100, ge=1, le=100, description="grabs per page")
    cursor: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,6}$",
        description="the `next_cursor` (or the packet's `grabs_next_cursor`); absent for the "
        "first page",
    )


class PacketsQuery(LaxQuery):
    """Query of GET /v1/redpackets."""

    sender_id: str | None = Field(
        default=None, pattern=ID_PATTERN, description="only this sender's packets"
    )
    status: PacketStatus | None = Field(default=None, description="only packets in this status")
    limit: int = Field(default=20, ge=1, le=100, description="packets per page")
    cursor: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,13}\.[A-Za-z0-9_-]{1,64}$",
        description="the `next_cursor` of the previous page; absent for the first page",
    )


class EntriesQuery(LaxQuery):
    """Query of GET /v1/accounts/{user_id}/entries."""

    limit: int = Field(default=20, ge=1, le=100, description="entries per page")
    cursor: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,18}$",
        description="the `next_cursor` of the previous page; absent for the first page",
    )


def _packets(request: Request) -> RedPackets:
    packets: RedPackets = request.app.state.services.packets
    return packets


async def deposit(request: Request, body: Deposit) -> Response:
    user_id = request.path_params["user_id"]
    return created_response(
        await _packets(request).accounts.deposit(user_id, body.amount_cents, body.reference)
    )


async def get_account(request: Request) -> Response:
    return json_response(await _packets(request).accounts.account(request.path_params["user_id"]))


async def list_entries(request: Request, query: EntriesQuery) -> Response:
    user_id = request.path_params["user_id"]
    return json_response(
        await _packets(request).accounts.entries(user_id, query.limit, query.cursor)
    )


async def list_packets(request: Request, query: PacketsQuery) -> Response:
    found = await _packets(request).listing.packets(
        query.limit, query.cursor, sender_id=query.sender_id, status=query.status
    )
    return json_response(found)


async def send_packet(request: Request, body: PacketSend) -> Response:
    money = body.model_dump(include={"sender_id", "amount_cents", "count", "packet_id"})
    lifetime = body.model_dump(include={"expires_in_s", "strategy"})
    sent = await _packets(request).sending.send(**money, **lifetime, terms=body.terms())
    return created_response(sent)


async def grab_packet(request: Request, body: Grab) -> Response:
    packet_id = request.path_params["packet_id"]
    grabs = _packets(request).grabs
    return json_response(await grabs.grab(packet_id, body.user_id, body.password))


async def withdraw_packet(request: Request, body: Withdraw) -> Response:
    packet_id = request.path_params["packet_id"]
    return json_response(await _packets(request).withdrawals.withdraw(packet_id, body.sender_id))


async def list_grabs(request: Request, query: GrabsQuery) -> Response:
    packet_id = request.path_params["packet_id"]
    return json_response(await _packets(request).reads.grabs(packet_id, query.cursor, query.limit))


async def get_grab(request: Request) -> Response:
    params = request.path_params
    return json_response(
        await _packets(request).reads.grab_of(params["packet_id"], params["user_id"])
    )


async def get_packet(request: Request) -> Response:
    return json_response(await _packets(request).reads.get(request.path_params["packet_id"]))


_NO_PACKET: Problems = {errors.PacketNotFound: "no packet has this id"}

ENDPOINTS = [
    Endpoint(
        "POST",
        "/v1/accounts/{user_id}/deposits",
        deposit,
        "Credit a user's account",
        role="admin",
        body=Deposit,
        tag="accounts",
        responses={
            201: "Credited; the new balance",
            200: "The same reference, user and amount again: the balance, nothing credited",
        },
        answer=wire.Account,
        problems={errors.Conflict: "the reference was used for another user or amount"},
        audit="account.deposit",
    ),
    Endpoint(
        "GET",
        "/v1/accounts/{user_id}",
        get_account,
        "A user's balance",
        rate_class="read",
        rate_user="user_id",
        tag="accounts",
        responses={200: "The balance (0 for a user never seen)"},
        answer=wire.Account,
    ),
    Endpoint(
        "GET",
        "/v1/accounts/{user_id}/entries",
        list_entries,
        "A user's ledger entries, newest first",
        rate_class="read",
        rate_user="user_id",
        query=EntriesQuery,
        tag="accounts",
        responses={200: "A page of entries (empty for a user never seen)"},
        answer=wire.LedgerEntriesPage,
    ),
    Endpoint(
        "GET",
        "/v1/redpackets",
        list_packets,
        "List packets, newest first, of a sender or a status",
        rate_class="read",
        query=PacketsQuery,
        tag="redpackets",
        responses={
            200: "A page of packets without their grabs: live fields from Redis, or from "
            "SQL once Redis let the packet go. A packet that ended a moment ago may leave "
            "a status's page before SQL knows it, so a page can hold fewer than `limit`."
        },
        answer=wire.PacketsPage,
    ),
    Endpoint(
        "POST",
        "/v1/redpackets",
        send_packet,
        "Send a red packet (debits the sender)",
        rate_class="send",
        rate_user="sender_id",
        body=PacketSend,
        tag="redpackets",
        responses={
            201: "Sent: the sender is debited and the packet can be grabbed",
            200: "The same packet_id and parameters again: the packet, nothing debited",
        },
        answer=wire.PacketSent,
        problems={
            errors.InsufficientFunds: "the sender's balance is below `amount_cents`",
            errors.LimitExceeded: "the send would pass one of the sender's caps for the UTC "
            "day: `limit` names it (sender_daily_amount_cents or sender_daily_count), "
            "`current` is what the sender sent today in its unit, `cap` the cap; nothing "
            "is debited",
            errors.Conflict: "the packet_id exists with other parameters",
            errors.UserBlocked: "an admin blocked the sender (`user_id`); nothing is debited",
        },
    ),
    Endpoint(
        "POST",
        "/v1/redpackets/{packet_id}/grab",
        grab_packet,
        "Grab a share, at most once",
        rate_class="grab",
        rate_user="user_id",
        body=Grab,
        tag="redpackets",
        responses={
            200: "`grabbed` a share now, or `already_grabbed` earlier: the same amount again"
        },
        answer=wire.Grabbed,
        problems={
            errors.SoldOut: "every share has been grabbed (by others)",
            errors.Expired: "the packet's time is over; the rest went back to the sender",
            errors.Withdrawn: "the sender withdrew the packet; the rest went back to them",
            errors.UserBlocked: "an admin blocked the user (`user_id`); a share the user "
            "grabbed before the block is still answered `already_grabbed`",
            errors.NotARecipient: "the packet has recipients and the user is not one",
            errors.SenderCannotGrab: "the packet was sent with `sender_may_grab: false`",
            errors.WrongPassword: "the password is missing or wrong; `attempts_left` wrong "
            "ones remain (a missing one is not counted)",
            errors.PasswordLocked: "the user gave 5 wrong passwords for this packet",
            **_NO_PACKET,
        },
    ),
    Endpoint(
        "POST",
        "/v1/redpackets/{packet_id}/withdraw",
        withdraw_packet,
        "The sender takes back what is left",
        rate_class="send",
        rate_user="sender_id",
        body=Withdraw,
        tag="redpackets",
        responses={
            200: "Withdrawn (now or before): the packet, `withdrawn`, its rest refunded once"
        },
        answer=wire.Packet,
        problems={
            errors.NotTheSender: "`sender_id` did not send this packet",
            errors.PacketEnded: "the packet sold out or expired before (`packet_status`)",
            **_NO_PACKET,
        },
    ),
    Endpoint(
        "GET",
        "/v1/redpackets/{packet_id}/grabs",
        list_grabs,
        "A page of a packet's grabs, in grab order",
        rate_class="read",
        query=GrabsQuery,
        tag="redpackets",
        responses={200: "The page: live from Redis, or from SQL once ended and released"},
        answer=wire.GrabsPage,
        problems=_NO_PACKET,
    ),
    Endpoint(
        "GET",
        "/v1/redpackets/{packet_id}/grabs/{user_id}",
        get_grab,
        "One user's grab of a packet",
        rate_class="read",
        rate_user="user_id",
        tag="redpackets",
        responses={200: "The user's grab"},
        answer=wire.PacketGrab,
        problems={
            errors.NotGrabbed: "the user has not grabbed this packet",
            **_NO_PACKET,
        },
    ),
    Endpoint(
        "GET",
        "/v1/redpackets/{packet_id}",
        get_packet,
        "A packet and its grabs",
        rate_class="read",
        tag="redpackets",
        responses={
            200: "The packet with its first 100 grabs: live from Redis, or from SQL once "
            "ended and released; once ended, also its committed `shares` and `salt`"
        },
        answer=wire.Packet,
        problems=_NO_PACKET,
    ),
]
