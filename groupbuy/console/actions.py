"""The console's actions (POST, admins only): each names its target, runs one service call
and is written to the audit log with the operator's reason before the page answers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from groupbuy import errors
from groupbuy.console import params
from groupbuy.console.context import Context
from groupbuy.ops.jobs import JOBS

Form = Mapping[str, str]
Run = Callable[[], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Planned:
    """An action ready to run: the audit log's action and target, the call, and the page
    to go back to."""

    action: str
    target: str
    run: Run
    back: str


def run_job(request: Request, ctx: Context, _form: Form) -> Planned:
    name = request.path_params["name"]
    if name not in JOBS:
        raise errors.NotFound(f"no job {name!r}; jobs: {', '.join(JOBS)}")
    return Planned("job.run", name, lambda: ctx.services.jobs.run(name), "/console/integrity")


def replay_dead_letter(request: Request, ctx: Context, _form: Form) -> Planned:
    number = params.position(request.path_params["letter"], "dead letter id")
    if number is None:
        raise errors.NotFound("no such dead letter")
    return Planned(
        "dead_letter.replay",
        str(number),
        lambda: ctx.services.dead_letters.replay(number),
        "/console/integrity",
    )


def block_user(_request: Request, ctx: Context, form: Form) -> Planned:
    user_id = params.an_id(form.get("user_id", "").strip(), "user_id")
    reason = form["reason"]
    return Planned(
        "user.block",
        user_id,
        lambda: ctx.services.blocklist.block(user_id, reason),
        "/console/blocked-users",
    )


def unblock_user(request: Request, ctx: Context, _form: Form) -> Planned:
    user_id = params.an_id(request.path_params["uid"], "user id")
    return Planned(
        "user.unblock",
        user_id,
        lambda: ctx.services.blocklist.unblock(user_id),
        "/console/blocked-users",
    )


def close_activity(request: Request, ctx: Context, _form: Form) -> Planned:
    aid = params.an_id(request.path_params["aid"], "activity id")

    async def close() -> dict[str, Any]:  # the call PATCH /v1/activities/{aid} makes
        outcome = await ctx.services.teams.activities.update_activity(aid, close=True)
        return {"status": outcome.body["status"], "closed_now": outcome.created}

    return Planned("activity.close", aid, close, f"/console/activities/{aid}")


def _endpoint(request: Request) -> str:
    return params.an_id(request.path_params["eid"], "endpoint id")


def replay_webhook(request: Request, ctx: Context, form: Form) -> Planned:
    eid = _endpoint(request)
    after = params.position(form.get("after", "").strip(), "after")
    until = params.position(form.get("until", "").strip(), "until")
    if after is None:
        raise errors.InvalidRequest("after is required: the feed id to replay after")
    if until is not None and until <= after:
        raise errors.InvalidRequest("until must be above after")
    return Planned(
        "webhook.replay",
        eid,
        lambda: ctx.services.webhooks.replay(eid, after, until),
        f"/console/webhooks/{eid}",
    )


def test_webhook(request: Request, ctx: Context, _form: Form) -> Planned:
    eid = _endpoint(request)
    return Planned(
        "webhook.test", eid, lambda: ctx.services.webhooks.test(eid), f"/console/webhooks/{eid}"
    )


def enable_webhook(request: Request, ctx: Context, _form: Form) -> Planned:
    eid = _endpoint(request)
    return Planned(
        "webhook.enable",
        eid,
        lambda: ctx.services.webhooks.update(eid, {"disabled": False}),
        "/console/webhooks",
    )


def disable_webhook(request: Request, ctx: Context, _form: Form) -> Planned:
    eid = _endpoint(request)
    return Planned(
        "webhook.disable",
        eid,
        lambda: ctx.services.webhooks.update(eid, {"disabled": True}),
        "/console/webhooks",
    )
