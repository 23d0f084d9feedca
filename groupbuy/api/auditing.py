"""What an audited route records (Endpoint.audit): the route runner in endpoints.py writes
the entry before the handler runs, and withdraws it when the handler refuses."""

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


async def record(request: Request, action: str, actor: str, body: BaseModel | None) -> int:
    """Write one audited action before it runs: who, what, to which target and why (the
    body's `reason` when it has one); returns the entry's id. Written first, an action that
    ran is audited even if SQL fails after it; one that cannot be written does not run. The
    detail is the method and path, never the answer (a rotation's answer holds a webhook
    secret)."""
    reason = getattr(body, "reason", None)
    log: AuditLog = request.app.state.services.audit
    entry = await log.record(
        actor,
        action,
        target_of(request, body),
        reason if isinstance(reason, str) else None,
        {"method": request.method, "path": request.url.path},
    )
    return int(entry["id"])


async def withdraw(request: Request, entry_id: int) -> None:
    """Take back the entry of an action its handler refused (it changed nothing)."""
    log: AuditLog = request.app.state.services.audit
    await log.withdraw(entry_id)
