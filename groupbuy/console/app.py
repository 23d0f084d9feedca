"""The console's Starlette sub-application: its routes, the session and header middleware,
the guard in front of every page and action, and the routes the API app mounts."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from groupbuy import errors
from groupbuy.api import access
from groupbuy.api.access import Authenticator
from groupbuy.api.problems import handle_error
from groupbuy.console import actions, live, pages
from groupbuy.console.context import Context
from groupbuy.console.headers import SecurityHeaders
from groupbuy.console.identity import (
    Gate,
    Operator,
    csrf_ok,
    safe_next,
    secure_cookie,
    session_secret,
)
from groupbuy.console.overview import Overview
from groupbuy.console.render import STATIC_DIR, error_page, page, to_sign_in
from groupbuy.console.sampler import Sampler
from groupbuy.console.streams import LiveStreams
from groupbuy.services import Services
from groupbuy.settings import Settings

log = logging.getLogger(__name__)
COOKIE = "groupbuy_console"
FORM_BYTES = 16 * 1024  # an action's form: a few ids and a sentence
Page = Callable[[Request, Context, Operator], Awaitable[Response]]
Plan = Callable[[Request, Context, actions.Form], actions.Planned]


def _context(request: Request) -> Context:
    context: Context = request.app.state.console
    return context


def guarded(handler: Page) -> Callable[[Request], Awaitable[Response]]:
    """A page for signed-in operators; others go to the sign-in and come back."""

    async def endpoint(request: Request) -> Response:
        ctx = _context(request)
        try:
            operator = await ctx.gate.operator(request)
            if operator is None:
                return to_sign_in(request)
            return await handler(request, ctx, operator)
        except Exception as exc:
            return await handle(request, exc)

    return endpoint


async def read_form(request: Request) -> dict[str, str] | Response:
    """The urlencoded form of a POST (at most FORM_BYTES), or the error page to answer."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type != "application/x-www-form-urlencoded":
        return error_page(request, None, 415, "Unsupported form", "Send the page's form.")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_BYTES:
            return error_page(request, None, 413, "Form too large", "Send the page's form.")
    try:
        return dict(parse_qsl(body.decode(), max_num_fields=20))
    except (UnicodeDecodeError, ValueError):
        return error_page(request, None, 400, "Bad form", "Send the page's form.")


def action(plan: Plan) -> Callable[[Request], Awaitable[Response]]:
    """An admin's action: signed in, the session's CSRF token, an admin key, a reason and the
    confirmation, the form checked by the rules of the API call it stands for (a refused one
    changes nothing); then the call, its audit row, and back to the page."""

    async def endpoint(request: Request) -> Response:
        ctx = _context(request)
        try:
            operator = await ctx.gate.operator(request)
        except Exception as exc:
            return await handle(request, exc)
        if operator is None:
            return to_sign_in(request)
        form = await read_form(request)
        if isinstance(form, Response):
            return form
        if not csrf_ok(request, form.get("csrf")):
            return error_page(
                request, operator, 403, "Form expired", "Reload the page and try again."
            )
        if not operator.may_act:
            return error_page(
                request, operator, 403, "Not allowed", "A viewer key reads; it cannot act."
            )
        reason = form.get("reason", "").strip()
        if not reason or form.get("confirm") != "yes":
            return error_page(
                request, operator, 422, "Reason needed", "Give a reason and tick the confirmation."
            )
        form["reason"] = reason
        try:
            actions.check_reason(reason)
            return await _act(request, ctx, operator, plan(request, ctx, form), reason)
        except Exception as exc:
            return await handle(request, exc)

    return endpoint


async def _act(
    request: Request, ctx: Context, operator: Operator, planned: actions.Planned, reason: str
) -> Response:
    """Run a planned action and write its audit row (a refused one too, with why). An
    action that commits its row with its own change (`planned.audited`) is given it; any
    other's row is written before it runs (so one that ran is audited even if SQL fails
    after it, and one that cannot be audited does not run), then given what came of it."""
    audit = ctx.services.audit
    if planned.audited is not None:
        row = audit.entry(operator.actor, planned.action, planned.target, reason)
        try:
            await planned.audited(row)
        except errors.GroupBuyError as exc:
            detail = {"error": exc.code, "detail": exc.detail}
            await audit.record(operator.actor, planned.action, planned.target, reason, detail)
            raise
    else:
        entry = await audit.record(operator.actor, planned.action, planned.target, reason)
        try:
            result = await planned.run()
        except errors.GroupBuyError as exc:
            await audit.settle(entry["id"], {"error": exc.code, "detail": exc.detail})
            raise
        await audit.settle(entry["id"], result)
    request.session["notice"] = f"{planned.action} {planned.target}: done"
    return RedirectResponse(planned.back, status_code=303)


async def sign_in_page(request: Request) -> Response:
    ctx = _context(request)
    target = safe_next(request.query_params.get("next"))
    try:
        operator = await ctx.gate.operator(request)
    except Exception as exc:
        return await handle(request, exc)
    if operator is not None:
        return RedirectResponse(target, status_code=303)
    return page(request, "signin.html", None, next=target, problem=None)


async def sign_in(request: Request) -> Response:
    ctx = _context(request)
    form = await read_form(request)
    if isinstance(form, Response):
        return form
    target = safe_next(form.get("next"))
    # Key guessing (SPEC §3): an address that failed too often is refused before its key is
    # looked at, and each failed sign-in counts against it as a 401 of the API does.
    retry_after_s = await access.refused_for(ctx.services.guesses, request, "console")
    if retry_after_s is not None:
        problem = f"Too many failed sign-ins from your address: try again in {retry_after_s} s."
        refused = page(request, "signin.html", None, 429, next=target, problem=problem)
        refused.headers["Retry-After"] = str(retry_after_s)
        return refused
    if not csrf_ok(request, form.get("csrf")):
        problem = "The form expired: sign in again."
        return page(request, "signin.html", None, 403, next=target, problem=problem)
    try:
        signed = await ctx.gate.sign_in(request, form.get("key", ""))
    except Exception as exc:
        return await handle(request, exc)
    if isinstance(signed, str):
        await ctx.services.guesses.failed(access.client_address(request))
        return page(request, "signin.html", None, 401, next=target, problem=signed)
    return RedirectResponse(target, status_code=303)


async def sign_out(request: Request) -> Response:
    form = await read_form(request)
    if isinstance(form, Response):
        return form
    if not csrf_ok(request, form.get("csrf")):
        operator = await _operator(request)
        return error_page(request, operator, 403, "Form expired", "Reload the page.")
    try:
        await _context(request).gate.sign_out(request)  # a copy of the cookie is over too
    except Exception as exc:
        return await handle(request, exc)
    return RedirectResponse("/console/signin", status_code=303)


async def live_stream(request: Request) -> Response:
    ctx = _context(request)
    try:
        operator = await ctx.gate.operator(request)
    except Exception as exc:  # problem+json, as the API answers: a script reads it
        return await handle_error(request, exc)
    if operator is None:
        return Response("sign in first", status_code=401, media_type="text/plain")
    return live.stream(request, ctx, operator.session)


async def live_json(request: Request) -> Response:
    ctx = _context(request)
    try:
        if await ctx.gate.operator(request) is None:
            return Response("sign in first", status_code=401, media_type="text/plain")
        return await live.snapshot(request, ctx)
    except Exception as exc:  # problem+json, as the API answers: a script reads it
        return await handle_error(request, exc)


async def _operator(request: Request) -> Operator | None:
    """The request's operator for an error page, None when even that cannot be known."""
    try:
        return await _context(request).gate.operator(request)
    except Exception:
        return None


async def handle(request: Request, exc: Exception) -> Response:
    """Every failure as a console page: ours with their status and detail, a backing
    service's as 503, anything else as 500 (logged by the API's handler)."""
    operator = await _operator(request)
    if isinstance(exc, errors.GroupBuyError):
        return error_page(request, operator, exc.status_code, exc.title, exc.detail)
    status = (await handle_error(request, exc)).status_code
    detail = "A backing service is unavailable." if status == 503 else "Something failed."
    return error_page(
        request, operator, status, "Unavailable" if status == 503 else "Error", detail
    )


ROUTES = [
    Route("/signin", sign_in_page, methods=["GET"]),
    Route("/signin", sign_in, methods=["POST"]),
    Route("/signout", sign_out, methods=["POST"]),
    Route("/", guarded(pages.overview), methods=["GET"]),
    Route("/events", guarded(pages.events), methods=["GET"]),
    Route("/activities", guarded(pages.activities), methods=["GET"]),
    Route("/activities/{aid}", guarded(pages.activity), methods=["GET"]),
    Route("/activities/{aid}/close", action(actions.close_activity), methods=["POST"]),
    Route("/activities/{aid}/stock", action(actions.change_activity_stock), methods=["POST"]),
    Route("/activities/{aid}/end", action(actions.change_activity_end), methods=["POST"]),
    Route("/activities/{aid}/teams/{tid}", guarded(pages.team), methods=["GET"]),
    Route(
        "/activities/{aid}/teams/{tid}/dissolve", action(actions.dissolve_team), methods=["POST"]
    ),
    Route("/redpackets", guarded(pages.packets), methods=["GET"]),
    Route("/redpackets/{pid}", guarded(pages.packet), methods=["GET"]),
    Route("/integrity", guarded(pages.integrity_page), methods=["GET"]),
    Route("/integrity/jobs/{name}/run", action(actions.run_job), methods=["POST"]),
    Route(
        "/integrity/dead-letters/{letter}/replay",
        action(actions.replay_dead_letter),
        methods=["POST"],
    ),
    Route("/webhooks", guarded(pages.webhooks), methods=["GET"]),
    Route("/webhooks/{eid}", guarded(pages.webhook), methods=["GET"]),
    Route("/webhooks/{eid}/replay", action(actions.replay_webhook), methods=["POST"]),
    Route("/webhooks/{eid}/test", action(actions.test_webhook), methods=["POST"]),
    Route("/webhooks/{eid}/enable", action(actions.enable_webhook), methods=["POST"]),
    Route("/webhooks/{eid}/disable", action(actions.disable_webhook), methods=["POST"]),
    Route("/audit", guarded(pages.audit), methods=["GET"]),
    Route("/blocked-users", guarded(pages.blocked_users), methods=["GET"]),
    Route("/blocked-users", action(actions.block_user), methods=["POST"]),
    Route("/blocked-users/{uid}/unblock", action(actions.unblock_user), methods=["POST"]),
    Route("/live", live_stream, methods=["GET"]),
    Route("/live.json", live_json, methods=["GET"]),
    Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
]


def build_console(settings: Settings, services: Services, auth: Authenticator) -> Starlette:
    """The console application (mounted at /console by `console_routes`)."""
    config = settings.console
    app = Starlette(
        routes=ROUTES,
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(
                SessionMiddleware,
                secret_key=session_secret(settings),
                session_cookie=COOKIE,
                max_age=config.session_max_age_s,
                path="/console",
                same_site="strict",
                https_only=secure_cookie(settings),
            ),
        ],
    )
    sampler = Sampler(config.live_interval_s)
    app.state.console = Context(
        services,
        Gate(auth, settings, services.redis, services.keys),
        Overview(services, sampler, config.live_interval_s),
        LiveStreams(
            config.live_connections,
            config.live_interval_s,
            config.live_stream_s,
            config.live_connections_per_session,
        ),
    )
    return app


class _AtRoot:
    """`/console` itself (a Mount matches only below it): the console's `/` route."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        root = scope.get("root_path", "") + "/console"
        await self.app({**scope, "path": root + "/", "root_path": root}, receive, send)


def console_routes(settings: Settings, services: Services, auth: Authenticator) -> list[BaseRoute]:
    """The routes the API app adds: `/console` and everything below it."""
    app = build_console(settings, services, auth)
    return [Route("/console", _AtRoot(app)), Mount("/console", app=app)]
