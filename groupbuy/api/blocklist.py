"""Admin routes of the blocklist: block, unblock and list user ids (SPEC §3, blocked users)."""

from __future__ import annotations

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from groupbuy.api import answers
from groupbuy.api.endpoints import (
    ID_PATTERN,
    TEXT_PATTERN,
    Endpoint,
    LaxQuery,
    StrictBody,
    json_response,
)
from groupbuy.ops.blocklist import REASON_MAX, BlocklistService


class BlockBody(StrictBody):
    """Body of PUT /v1/admin/blocked-users/{user_id}."""

    reason: str | None = Field(
        default=None,
        max_length=REASON_MAX,
        pattern=TEXT_PATTERN,
        description="why, for the admins who read the list (any text but U+0000)",
    )


class BlockedUsersQuery(LaxQuery):
    """Query of GET /v1/admin/blocked-users."""

    limit: int = Field(default=20, ge=1, le=100, description="blocked users per page")
    cursor: str | None = Field(
        default=None,
        pattern=ID_PATTERN,
        description="the `next_cursor` of the previous page; absent for the first page",
    )


def _service(request: Request) -> BlocklistService:
    service: BlocklistService = request.app.state.services.blocklist
    return service


async def block_user(request: Request, body: BlockBody) -> Response:
    return json_response(await _service(request).block(request.path_params["user_id"], body.reason))


async def unblock_user(request: Request) -> Response:
    return json_response(await _service(request).unblock(request.path_params["user_id"]))


async def list_blocked_users(request: Request, query: BlockedUsersQuery) -> Response:
    return json_response(await _service(request).page(query.limit, query.cursor))


ENDPOINTS = [
    Endpoint(
        "PUT",
        "/v1/admin/blocked-users/{user_id}",
        block_user,
        "Block a user: their seat locks, joins, team opens, confirms, grabs and sends are "
        "refused with 403 user_blocked",
        role="admin",
        body=BlockBody,
        tag="admin",
        responses={200: "Blocked (a repeat replaces the reason and keeps `blocked_at`); the entry"},
        answer=answers.BlockedUser,
        audit="user.block",
    ),
    Endpoint(
        "DELETE",
        "/v1/admin/blocked-users/{user_id}",
        unblock_user,
        "Lift a user's block",
        role="admin",
        tag="admin",
        responses={200: "Done; `unblocked` is false when the user was not blocked"},
        answer=answers.Unblocked,
        audit="user.unblock",
    ),
    Endpoint(
        "GET",
        "/v1/admin/blocked-users",
        list_blocked_users,
        "List the blocked users",
        role="admin",
        query=BlockedUsersQuery,
        tag="admin",
        responses={200: "A page of blocked users in user id order"},
        answer=answers.BlockedUsersPage,
    ),
]
