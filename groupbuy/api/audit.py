"""The audit log's page over HTTP (GET /v1/admin/audit), for admins and viewers."""

from __future__ import annotations

from typing import Annotated

from groupbuy_client import wire
from pydantic import Field, StringConstraints
from starlette.requests import Request
from starlette.responses import Response

from groupbuy.api.endpoints import TEXT_PATTERN, Endpoint, LaxQuery, StrictBody, json_response
from groupbuy.ops.audit import REASON_CHARS, AuditLog

ReasonText = Annotated[str, StringConstraints(max_length=REASON_CHARS, pattern=TEXT_PATTERN)]
"""An operator's reason, as the audit log keeps it: at most 500 characters, any but U+0000
(which PostgreSQL's text cannot hold). The API's bodies and the console's forms use it."""


class ActionReason(StrictBody):
    """The reason every console action asks for, checked as the API checks a reason."""

    reason: ReasonText = Field(min_length=1)


class AuditQuery(LaxQuery):
    """Query of GET /v1/admin/audit."""

    limit: int = Field(default=20, ge=1, le=100, description="entries per page")
    cursor: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,18}$",
        description="the `next_cursor` of the previous page; absent for the first page",
    )


def _log(request: Request) -> AuditLog:
    log: AuditLog = request.app.state.services.audit
    return log


async def list_audit(request: Request, query: AuditQuery) -> Response:
    return json_response(await _log(request).page(query.limit, query.cursor))


ENDPOINTS = [
    Endpoint(
        "GET",
        "/v1/admin/audit",
        list_audit,
        "The audit log: who changed what, why and when",
        role="admin",
        query=AuditQuery,
        tag="admin",
        responses={200: "A page of audit entries, newest first"},
        answer=wire.AuditPage,
    ),
]
