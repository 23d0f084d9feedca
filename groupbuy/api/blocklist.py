"""Admin routes of the blocklist: block, unblock and list user ids (SPEC §3, blocked users)."""

from __future__ import annotations

from groupbuy_client import wire
from groupbuy_client.wire import ID_PATTERN
from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from groupbuy.api.audit import ReasonText
from groupbuy.api.endpoints import (
    Endpoint,
    LaxQuery,
    StrictBody,
    json_response,
)
from groupbuy.ops.audit import AuditLog, AuditRow
from groupbuy.ops.blocklist import BlocklistService


class BlockBody(StrictBody):
    """Body of PUT /v1/admin/blocked-users/{user_id}."""

    reason: ReasonText | None = Field(
        default=None,
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


def _audit_row(request: Request, action: str, reason: str | None) -> AuditRow:
    """The action's audit row, committed by the service with the change itself (an action
    that ran is audited, one refused is not); the route writes none (audit_with_change)."""
    log: AuditLog = request.app.state.services.audit
    detail = {"method": request.method, "path": request.url.path}
    return log.entry(request.state.actor, action, request.path_params["user_id"], reason, detail)


async def block_user(request: Request, body: BlockBody) -> Response:
    audit = _audit_row(request, "user.block", body.reason)
    blocked = await _service(request).block(request.path_params["user_id"], body.reason, audit)
    return json_response(blocked)


async def unblock_user(request: Request) -> Response:
    audit = _audit_row(request, "user.unblock", None)
    return json_response(await _service(request).unblock(request.path_params["user_id"], audit))


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
        answer=wire.BlockedUser,
        audit="user.block",
        audit_with_change=True,
    ),
    Endpoint(
        "DELETE",
        "/v1/admin/blocked-users/{user_id}",
        unblock_user,
        "Lift a user's block",
        role="admin",
        tag="admin",
        responses={200: "Done; `unblocked` is false when the user was not blocked"},
        answer=wire.Unblocked,
        audit="user.unblock",
        audit_with_change=True,
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
        answer=wire.BlockedUsersPage,
    ),
]
