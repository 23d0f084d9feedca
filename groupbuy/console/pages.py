"""The console's pages (GET): each reads one page of rows or one script call at most."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from groupbuy.console import feed, integrity, params
from groupbuy.console.charts import line_chart
from groupbuy.console.context import Context
from groupbuy.console.identity import Operator
from groupbuy.console.render import page
from groupbuy.console.sale import sale_view
from groupbuy.locks.listings import EndedStatus
from groupbuy.ops.jobs import JOBS
from groupbuy.redpacket.read import GRABS_SHOWN

PAGE = 50  # rows of a listed page
ACTIVITY_FIELDS = ("teams_open", "teams_formed", "teams_failed", "members", "live_locks", "waiting")
PACKET_FIELDS = ("remaining_count", "remaining_cents", "status")


async def overview(request: Request, ctx: Context, operator: Operator) -> Response:
    numbers = await ctx.overview.numbers()
    series = ctx.overview.sampler.series()
    charts = {
        "throughput": line_chart([(x, r.requests) for x, r in series], "requests/s"),
        "p99": line_chart([(x, r.p99_ms or 0.0) for x, r in series], "p99 latency", " ms"),
    }
    return page(request, "overview.html", operator, numbers=numbers, charts=charts)


async def events(request: Request, ctx: Context, operator: Operator) -> Response:
    wanted = feed.FeedFilter.of(request.query_params)
    after = params.position(request.query_params.get("after"), "after")
    database = ctx.services.database
    newest = await feed.newest_id(database)
    if after is None:  # the tail: the last page of the feed
        after = max(0, newest - feed.PAGE)
    found = await feed.read_page(database, after, wanted)
    return page(
        request,
        "events.html",
        operator,
        found=found,
        after=after,
        newest=newest,
        wanted=wanted,
        previous_after=max(0, after - feed.PAGE) if after else None,
    )


async def activities(request: Request, ctx: Context, operator: Operator) -> Response:
    query = request.query_params
    status = params.one_of(query.get("status"), params.ACTIVITY_STATUSES, "status")
    cursor = params.page_cursor(query.get("cursor"))
    found = await ctx.services.teams.listings.activities(status, PAGE, cursor)
    rows = [(body, _fields(body, ACTIVITY_FIELDS)) for body in found["activities"]]
    return page(
        request,
        "activities.html",
        operator,
        rows=rows,
        chosen=status,
        cursor=cursor,
        next_cursor=found["next_cursor"],
        statuses=params.ACTIVITY_STATUSES,
        fields=ACTIVITY_FIELDS,
    )


async def packets(request: Request, ctx: Context, operator: Operator) -> Response:
    query = request.query_params
    sender = params.id_cursor(query.get("sender_id"), "sender_id")
    status = params.one_of(query.get("status"), params.PACKET_STATUSES, "status")
    cursor = params.packet_cursor(query.get("cursor"))
    found = await ctx.services.packets.listing.packets(
        PAGE, cursor, sender_id=sender, status=status
    )
    return page(
        request,
        "packets.html",
        operator,
        packets=found["packets"],
        sender_id=sender,
        chosen=status,
        cursor=cursor,
        next_cursor=found["next_cursor"],
        statuses=params.PACKET_STATUSES,
    )


def _fields(body: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The live fields a body carries (a body without counts has none of them)."""
    return {name: body[name] for name in names if name in body}


async def activity(request: Request, ctx: Context, operator: Operator) -> Response:
    aid = params.an_id(request.path_params["aid"], "activity id")
    query = request.query_params
    status = params.one_of(query.get("teams"), params.TEAM_STATUSES, "teams") or "open"
    live = status in params.LIVE_TEAM_STATUSES
    cursor = params.page_cursor(query.get("cursor"), dated=not live)
    teams = ctx.services.teams
    body = await teams.activities.get_activity(aid)
    if live:  # `full`: the teams full of members and locks, the hottest of a sale
        listed = await teams.activities.list_open_teams(aid, PAGE, cursor, full=status == "full")
    else:
        ended: EndedStatus = "formed" if status == "formed" else "failed"
        listed = await teams.listings.ended_teams(aid, ended, PAGE, cursor)
    shown = [team["team_id"] for team in listed["teams"]] if live else []
    return page(
        request,
        "activity.html",
        operator,
        activity=body,
        counts=_fields(body, ACTIVITY_FIELDS),
        sale=await sale_view(ctx.services, body),
        teams=listed["teams"],
        waiting=await teams.waitlist.lines(aid, shown),
        team_status=status,
        team_statuses=params.TEAM_STATUSES,
        cursor=cursor,
        next_cursor=listed.get("next_cursor"),
    )


def _timeline(team: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The team's moments from its state: members joining, live locks, the end."""
    moments: list[tuple[str, str]] = []
    for number, member in enumerate(team.get("members") or [], start=1):
        who = "leader opened the team" if number == 1 else "member joined"
        order = f" (order {member['order_id']})" if member.get("order_id") else ""
        moments.append((member["joined_at"], f"{who}: {member['user_id']}{order}"))
    for lock in team.get("locks") or []:
        moments.append(
            (lock["locked_at"], f"seat locked by {lock['user_id']} until {lock['expires_at']}")
        )
    if team.get("formed_at"):
        virtual = team.get("virtual_seats") or 0
        extra = f" with {virtual} virtual seat(s)" if virtual else ""
        moments.append((team["formed_at"], f"formed{extra}"))
    if team.get("failed_at"):
        moments.append((team["failed_at"], "failed: members are listed for refund"))
    return sorted(moments)


async def team(request: Request, ctx: Context, operator: Operator) -> Response:
    aid = params.an_id(request.path_params["aid"], "activity id")
    tid = params.an_id(request.path_params["tid"], "team id")
    body = await ctx.services.teams.activities.get_team(aid, tid)
    return page(request, "team.html", operator, team=body, timeline=_timeline(body))


async def packet(request: Request, ctx: Context, operator: Operator) -> Response:
    pid = params.an_id(request.path_params["pid"], "packet id")
    cursor = params.grabs_cursor(request.query_params.get("cursor"))
    reads = ctx.services.packets.reads
    body: dict[str, Any] = dict(await reads.get(pid))
    # The body's first grabs are the first page; a cursor reads one later page (the API's
    # bound, never every grab). An ended packet's shares are counted, not listed.
    grabs, next_cursor = body.pop("grabs"), body["grabs_next_cursor"]
    if cursor is not None:
        later = await reads.grabs(pid, cursor, GRABS_SHOWN)
        grabs, next_cursor = later["grabs"], later["next_cursor"]
    shares = body.pop("shares", None)
    first = int(cursor or 0)
    taken, points = 0, [(float(first), 0.0)]
    for number, grab in enumerate(grabs, start=first + 1):
        taken += int(grab["amount_cents"])
        points.append((float(number), float(taken)))
    label = f"cents grabbed from grab {first + 1} on" if first else "cents grabbed by grab number"
    return page(
        request,
        "packet.html",
        operator,
        packet=body,
        fields=_fields(body, PACKET_FIELDS),
        grabs=grabs,
        first=first,
        next_cursor=next_cursor,
        shares_count=None if shares is None else len(shares),
        curve=line_chart(points, label, " cents"),
    )


async def integrity_page(request: Request, ctx: Context, operator: Operator) -> Response:
    cursor = params.position(request.query_params.get("cursor"), "cursor")
    services = ctx.services
    report = await services.reconciler.latest()
    letters = await services.dead_letters.page(PAGE, None if cursor is None else str(cursor))
    runner = services.jobs
    jobs = [
        {
            "name": name,
            "what": what,
            "interval_s": runner.jobs[name].interval_s if name in runner.jobs else None,
            "last": runner.last_reports.get(name),
        }
        for name, what in JOBS.items()
    ]
    return page(
        request,
        "integrity.html",
        operator,
        report=report,
        checks=integrity.checks(report),
        letters=letters,
        jobs=jobs,
    )


async def webhooks(request: Request, ctx: Context, operator: Operator) -> Response:
    cursor = params.id_cursor(request.query_params.get("cursor"), "cursor")
    service = ctx.services.webhooks
    endpoints = await service.page(cursor, PAGE)
    lag = (await ctx.overview.numbers())["webhook_lag"]
    return page(request, "webhooks.html", operator, endpoints=endpoints, lag=lag)


async def webhook(request: Request, ctx: Context, operator: Operator) -> Response:
    eid = params.an_id(request.path_params["eid"], "endpoint id")
    status = params.delivery_status(request.query_params.get("status"))
    cursor = params.delivery_cursor(request.query_params.get("cursor"))
    service = ctx.services.webhooks
    endpoint = await service.get(eid)
    deliveries = await service.deliveries(eid, status, cursor, PAGE)
    return page(
        request,
        "webhook.html",
        operator,
        endpoint=endpoint,
        deliveries=deliveries,
        delivery_status=status,
        statuses=params.DELIVERY_STATUSES,
    )


async def audit(request: Request, ctx: Context, operator: Operator) -> Response:
    cursor = params.position(request.query_params.get("cursor"), "cursor")
    entries = await ctx.services.audit.page(PAGE, None if cursor is None else str(cursor))
    return page(request, "audit.html", operator, entries=entries)


async def blocked_users(request: Request, ctx: Context, operator: Operator) -> Response:
    cursor = params.id_cursor(request.query_params.get("cursor"), "cursor")
    blocked = await ctx.services.blocklist.page(PAGE, cursor)
    return page(request, "blocked.html", operator, blocked=blocked)
