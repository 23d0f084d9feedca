"""The console's actions (POST, admins only): each names its target, runs one service call
and is written to the audit log with the operator's reason before the page answers.

A form is checked by the rules of the API call it stands for (the same models and id
rule), so a form the API would refuse is refused here too, before anything changes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel
from starlette.requests import Request

from groupbuy import errors
from groupbuy.api.audit import ActionReason
from groupbuy.api.blocklist import BlockBody
from groupbuy.api.endpoints import parse_body
from groupbuy.api.teams import ActivityUpdate
from groupbuy.api.webhooks import ReplayBody, check_replay_range
from groupbuy.console import params
from groupbuy.console.context import Context
from groupbuy.ops.audit import AuditRow
from groupbuy.ops.jobs import JOBS

Form = Mapping[str, str]
Run = Callable[[], Awaitable[Mapping[str, Any]]]
Audited = Callable[[AuditRow], Awaitable[Mapping[str, Any]]]


M = TypeVar("M", bound=BaseModel)


def checked(model: type[M], fields: dict[str, Any]) -> M:
    """`fields` as the API's `model` reads them from a JSON body: 422 with its message when
    the API would refuse them."""
    body = parse_body(model, orjson.dumps(fields))
    assert isinstance(body, model)
    return body


def check_reason(reason: str) -> str:
    """An action's reason, checked as the API checks one (at most 500 characters, no NUL)."""
    return checked(ActionReason, {"reason": reason}).reason


@dataclass(frozen=True)
class Planned:
    """An action ready to run: the audit log's action and target, the call, and the page
    to go back to."""

    action: str
    target: str
    run: Run
    back: str
    # The call that commits the action's audit row (given) with its own change, if it has one.
    audited: Audited | None = None


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
    reason = checked(BlockBody, {"reason": form["reason"]}).reason  # PUT /v1/admin/blocked-users
    blocklist = ctx.services.blocklist
    return Planned(
        "user.block",
        user_id,
        lambda: blocklist.block(user_id, reason),
        "/console/blocked-users",
        audited=lambda row: blocklist.block(user_id, reason, row),
    )


def unblock_user(request: Request, ctx: Context, _form: Form) -> Planned:
    user_id = params.an_id(request.path_params["uid"], "user id")
    blocklist = ctx.services.blocklist
    return Planned(
        "user.unblock",
        user_id,
        lambda: blocklist.unblock(user_id),
        "/console/blocked-users",
        audited=lambda row: blocklist.unblock(user_id, row),
    )


def close_activity(request: Request, ctx: Context, _form: Form) -> Planned:
    aid = params.an_id(request.path_params["aid"], "activity id")

    async def close() -> dict[str, Any]:  # the call PATCH /v1/activities/{aid} makes
        outcome = await ctx.services.teams.activities.update_activity(aid, close=True)
        return {"status": outcome.body["status"], "closed_now": outcome.created}

    return Planned("activity.close", aid, close, f"/console/activities/{aid}")


def dissolve_team(request: Request, ctx: Context, _form: Form) -> Planned:
    aid = params.an_id(request.path_params["aid"], "activity id")
    tid = params.an_id(request.path_params["tid"], "team id")

    async def dissolve() -> dict[str, Any]:  # the call POST /v1/admin/.../dissolve makes
        body = await ctx.services.teams.dissolve(aid, tid)
        return {"status": body["team"]["status"], "dissolved": body["dissolved"]}

    return Planned(
        "team.dissolve", f"{aid}/{tid}", dissolve, f"/console/activities/{aid}/teams/{tid}"
    )


def change_activity_stock(request: Request, ctx: Context, form: Form) -> Planned:
    aid = params.an_id(request.path_params["aid"], "activity id")
    text = form.get("stock", "").strip()
    if not text.isdigit():
        raise errors.InvalidRequest("stock must be a whole number of units")
    stock = checked(ActivityUpdate, {"stock": int(text)}).stock  # PATCH /v1/activities/{aid}

    async def change() -> dict[str, Any]:
        outcome = await ctx.services.teams.activities.update_activity(aid, stock=stock)
        return {"stock": outcome.body.get("stock"), "stock_left": outcome.body.get("stock_left")}

    return Planned("activity.stock", aid, change, f"/console/activities/{aid}")


def change_activity_end(request: Request, ctx: Context, form: Form) -> Planned:
    aid = params.an_id(request.path_params["aid"], "activity id")
    ends_at = checked(ActivityUpdate, {"ends_at": form.get("ends_at", "").strip()}).ends_at

    async def change() -> dict[str, Any]:
        outcome = await ctx.services.teams.activities.update_activity(aid, ends_at=ends_at)
        return {"ends_at": outcome.body.get("ends_at"), "status": outcome.body["status"]}

    return Planned("activity.end", aid, change, f"/console/activities/{aid}")


def _endpoint(request: Request) -> str:
    return params.an_id(request.path_params["eid"], "endpoint id")


def replay_webhook(request: Request, ctx: Context, form: Form) -> Planned:
    eid = _endpoint(request)
    after = params.position(form.get("after", "").strip(), "after")
    until = params.position(form.get("until", "").strip(), "until")
    if after is None:
        raise errors.InvalidRequest("after is required: the feed id to replay after")
    body = checked(ReplayBody, {"after": after, "until": until})  # POST .../replay
    check_replay_range(body)
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
