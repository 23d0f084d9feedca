"""What an audited route records once it answered 2xx (Endpoint.audit; the route runner in
endpoints.py calls `record`)."""

from __future__ import annotations

from pydantic import BaseModel
from starlette.requests import Request

from groupbuy.ops.audit import AuditLog


def target_of(request: Request, body: BaseModel | None) -> str:
    """What an action was done to: its path parameters (`user_id`, `endpoint_id`, a job's
    name...), or for a create without one the body's id field (`activity_id`, ...)."""
    if request.path_params:
        return "/".join(str(value) for value in request.path_params.values())
    if body is not None:
        ids = [name for name in type(body).model_fields if name.endswith("_id")]
        if ids:
            return str(getattr(body, ids[0]) or "")
    return ""


async def record(request: Request, action: str, actor: str, body: BaseModel | None) -> None:
    """Write one audited action that answered 2xx: who, what, to which target and why (the
    body's `reason` when it has one). The detail is the method and path, never the answer
    (a rotation's answer holds a webhook secret)."""
    reason = getattr(body, "reason", None)
    log: AuditLog = request.app.state.services.audit
    await log.record(
        actor,
        action,
        target_of(request, body),
        reason if isinstance(reason, str) else None,
        {"method": request.method, "path": request.url.path},
    )
