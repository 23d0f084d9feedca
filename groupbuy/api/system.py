"""Endpoints that are not one engine's: health, readiness, the events feed, the OpenAPI document."""

from __future__ import annotations

import asyncio
import logging

from groupbuy_client import wire
from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from groupbuy import errors, metrics
from groupbuy.api.endpoints import Endpoint, LaxQuery, json_response
from groupbuy.ops.jobs import JOBS
from groupbuy.storage.events import read_feed
from groupbuy.storage.redis_client import every_primary

log = logging.getLogger(__name__)
# Longest a scrape of /metrics waits for the write-behind backlog's measure (a few reads of
# Redis; one per slot in use under a cluster, so longer with every slot in use).
_MEASURE_WAIT_S = 2.0


class EventsQuery(LaxQuery):
    """Query of GET /v1/events."""

    after: int = Field(default=0, ge=0, le=2**63 - 1)
    limit: int = Field(default=100, ge=1, le=1000)


class DeadLettersQuery(LaxQuery):
    """Query of GET /v1/admin/dead-letters."""

    limit: int = Field(default=100, ge=1, le=1000, description="dead letters per page")
    cursor: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,18}$",
        description="the `next_cursor` of the previous page; absent for the first page",
    )


async def healthz(_request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready means able to serve now: Redis (every primary of a cluster) and SQL answer, and
    the scripts Redis forgot (a restart, a failover, SCRIPT FLUSH) are loaded again here
    rather than reported."""
    services = request.app.state.services
    checks: dict[str, str] = {}
    try:
        await services.redis.ping(**every_primary(services.redis))
        services.reachability.answered()
        checks["redis"] = "ok"
        reloaded = await services.scripts.reload_missing()
        if reloaded:
            log.info("readiness: loaded %d Lua scripts Redis had forgotten", len(reloaded))
        checks["scripts"] = "ok"
    except Exception as exc:  # readiness reports, it never raises
        services.reachability.failed(exc)
        checks["redis"] = f"unreachable: {type(exc).__name__}"
    try:
        await services.database.ping()
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    ready = all(value == "ok" for value in checks.values()) and len(checks) == 3
    return json_response(
        {"status": "ready" if ready else "not ready", "checks": checks}, 200 if ready else 503
    )


async def openapi(request: Request) -> Response:
    return json_response(request.app.state.openapi)


async def prometheus_metrics(request: Request) -> Response:
    # The write-behind backlog is global in Redis: measured here, so that the gauges are true
    # now in whichever process answers (lease holder or not), however long a flush runs. A
    # scrape still answers when Redis does not: the gauges then keep their last values.
    services = request.app.state.services
    try:
        measures = [metrics.update_writeback(w, services.redis) for w in services.writers]
        await asyncio.wait_for(asyncio.gather(*measures), _MEASURE_WAIT_S)
    except TimeoutError:
        log.warning("the write-behind backlog took over %g s to measure", _MEASURE_WAIT_S)
    except Exception as error:
        if not services.reachability.failed(error):
            log.warning("could not measure the write-behind backlog", exc_info=True)
    try:
        backlog = services.webhooks.measure()
        metrics.update_webhooks(await asyncio.wait_for(backlog, _MEASURE_WAIT_S))
    except Exception as error:  # SQL away or slow: the gauges keep their last values
        if not services.database.reachability.failed(error):
            log.warning("could not measure the webhook backlog", exc_info=True)
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)


async def list_events(request: Request, query: EventsQuery) -> Response:
    database = request.app.state.services.database
    return json_response(await read_feed(database, query.after, query.limit))


async def run_job(request: Request) -> Response:
    runner = request.app.state.services.jobs
    return json_response(await runner.run(request.path_params["name"]))


async def last_reconcile(request: Request) -> Response:
    report = await request.app.state.services.reconciler.latest()
    if report is None:
        raise errors.NotFound("no reconciliation has run yet; POST /v1/admin/jobs/reconcile/run")
    return json_response(report)


async def list_dead_letters(request: Request, query: DeadLettersQuery) -> Response:
    dead_letters = request.app.state.services.dead_letters
    return json_response(await dead_letters.page(query.limit, query.cursor))


async def replay_dead_letter(request: Request) -> Response:
    raw = request.path_params["dead_letter_id"]
    if not raw.isdigit() or len(raw) > 18:
        raise errors.NotFound(f"no dead letter has the id {raw}")
    dead_letters = request.app.state.services.dead_letters
    return json_response(await dead_letters.replay(int(raw)))


ENDPOINTS = [
    Endpoint(
        "GET",
        "/healthz",
        healthz,
        "The process is up",
        role=None,
        responses={200: "Always, while the process serves requests"},
        answer=wire.Health,
    ),
    Endpoint(
        "GET",
        "/readyz",
        readyz,
        "Redis and SQL answer; Lua scripts Redis forgot are loaded again",
        role=None,
        responses={200: "Ready", 503: "Not ready: `checks` names what failed"},
        answer=wire.Readiness,
    ),
    Endpoint(
        "GET",
        "/openapi.json",
        openapi,
        "This OpenAPI document",
        role=None,
        responses={200: "The OpenAPI 3.1 document of the API"},
        answer=wire.OpenApiDocument,
    ),
    Endpoint(
        "GET",
        "/metrics",
        prometheus_metrics,
        "Prometheus metrics: lock and grab outcomes, latency, write-behind backlog, jobs",
        role=None,
        responses={200: "Prometheus text exposition format"},
        media_type="text/plain",
    ),
    Endpoint(
        "GET",
        "/v1/events",
        list_events,
        "Events after an id, in id order (ids are given after commit: none lands below a cursor)",
        rate_class="read",
        query=EventsQuery,
        tag="events",
        responses={200: "Up to `limit` events with ids above `after`; none when caught up"},
        answer=wire.EventsPage,
    ),
    Endpoint(
        "POST",
        "/v1/admin/jobs/{name}/run",
        run_job,
        "Run a scheduled job now and return its report",
        role="admin",
        tag="admin",
        responses={200: "The job ran; its report"},
        answer=wire.JobReport,
        problems={errors.NotFound: "no job has this name (the detail lists the jobs)"},
        path_params={
            "name": {
                "enum": list(JOBS),
                "description": "; ".join(f"`{name}`: {what}" for name, what in JOBS.items()),
            }
        },
        audit="job.run",
    ),
    Endpoint(
        "GET",
        "/v1/admin/reconcile",
        last_reconcile,
        "The last reconciliation report",
        role="admin",
        tag="admin",
        responses={200: "The newest stored report"},
        answer=wire.ReconcileReport,
        problems={errors.NotFound: "no reconciliation has run yet"},
    ),
    Endpoint(
        "GET",
        "/v1/admin/dead-letters",
        list_dead_letters,
        "Write-behind records SQL could not apply, kept with their error, oldest first",
        query=DeadLettersQuery,
        role="admin",
        tag="admin",
        responses={200: "Up to `limit` dead letters after `cursor`; `next_cursor` null at the end"},
        answer=wire.DeadLettersPage,
    ),
    Endpoint(
        "POST",
        "/v1/admin/dead-letters/{dead_letter_id}/replay",
        replay_dead_letter,
        "Apply a dead letter's record to SQL now that its cause is fixed (idempotent)",
        role="admin",
        tag="admin",
        responses={200: "Applied (or applied before): the dead letter, with `replayed_at`"},
        answer=wire.DeadLetter,
        problems={
            errors.NotFound: "no dead letter has this id",
            errors.ReplayFailed: "the record still cannot be applied; `error` says why",
        },
        audit="dead_letter.replay",
    ),
]
