"""The audit log's page over HTTP (GET /v1/admin/audit), for admins and viewers."""

from __future__ import annotations

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from groupbuy.api import answers
from groupbuy.api.endpoints import Endpoint, LaxQuery, json_response
from groupbuy.ops.audit import AuditLog


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
        answer=answers.AuditPage,
    ),
]
