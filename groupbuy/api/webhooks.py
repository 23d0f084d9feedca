"""Admin routes of webhooks (SPEC §3, "Webhooks (admin) — the feed, pushed")."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from groupbuy_client import wire
from groupbuy_client.wire import ID_PATTERN
from pydantic import AfterValidator, Field, StringConstraints
from starlette.requests import Request
from starlette.responses import Response

from groupbuy import errors
from groupbuy.api.endpoints import (
    TEXT_PATTERN,
    Endpoint,
    LaxQuery,
    StrictBody,
    created_response,
    json_response,
)
from groupbuy.event_types import EVENT_TYPES
from groupbuy.webhooks.addresses import MAX_URL_LENGTH
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import ALL_TYPES, EndpointSpec

SUBSCRIBABLE = (ALL_TYPES, *EVENT_TYPES)


def _known_type(name: str) -> str:
    """An event type of the registry, or `*`: a misspelt type would never deliver."""
    if name not in SUBSCRIBABLE:
        raise ValueError(f"unknown event type {name!r}: see docs/webhooks.md#event-types")
    return name


EventType = Annotated[
    str,
    StringConstraints(max_length=64),
    AfterValidator(_known_type),
]
"""An event type such as `team.formed` (groupbuy/event_types.py), or `*` for every type."""
EventTypes = Annotated[list[EventType], Field(min_length=1, max_length=100)]
Url = Annotated[str, Field(min_length=1, max_length=MAX_URL_LENGTH)]
Description = Annotated[str, Field(max_length=500, pattern=TEXT_PATTERN)]


class CreateWebhookBody(StrictBody):
    """Body of POST /v1/admin/webhooks."""

    endpoint_id: Annotated[str, StringConstraints(pattern=ID_PATTERN)]
    url: Url = Field(
        description="https:// (http:// only with `[webhooks] allow_http`); a host on a "
        "loopback, private, link-local or multicast address is refused"
    )
    event_types: EventTypes = Field(
        description='the types to deliver (see Event types, below), or ["*"]; another is a 422'
    )
    description: Description | None = None
    ordering: Literal["feed", "entity"] = "feed"


class UpdateWebhookBody(StrictBody):
    """Body of PATCH /v1/admin/webhooks/{endpoint_id}: the fields to change."""

    url: Url | None = None
    event_types: EventTypes | None = None
    description: Description | None = None
    disabled: bool | None = Field(
        default=None, description="false enables it again: what waited is delivered"
    )


class ReplayBody(StrictBody):
    """Body of POST /v1/admin/webhooks/{endpoint_id}/replay: feed ids `after < id <= until`."""

    after: int = Field(ge=0, le=2**63 - 1)
    until: int | None = Field(default=None, ge=0, le=2**63 - 1)


class WebhooksQuery(LaxQuery):
    """Query of GET /v1/admin/webhooks."""

    limit: int = Field(default=20, ge=1, le=100, description="endpoints per page")
    cursor: str | None = Field(
        default=None, pattern=ID_PATTERN, description="the `next_cursor` of the previous page"
    )


class DeliveriesQuery(LaxQuery):
    """Query of GET /v1/admin/webhooks/{endpoint_id}/deliveries."""

    status: Literal["pending", "delivered", "failed"] | None = None
    limit: int = Field(default=20, ge=1, le=100, description="deliveries per page")
    cursor: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,18}\.[0-9]{1,18}$",
        description="the `next_cursor` of the previous page",
    )


class AttemptsQuery(LaxQuery):
    """Query of GET /v1/admin/webhooks/{endpoint_id}/deliveries/{webhook_id}/attempts."""

    limit: int = Field(default=20, ge=1, le=100, description="attempts per page")
    cursor: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,18}$",
        description="the `next_cursor` of the previous page, or a delivery's "
        "`older_attempts_cursor`",
    )


def _service(request: Request) -> WebhookService:
    service: WebhookService = request.app.state.services.webhooks
    return service


def _id(request: Request) -> str:
    return str(request.path_params["endpoint_id"])


async def create_webhook(request: Request, body: CreateWebhookBody) -> Response:
    spec = EndpointSpec(
        body.endpoint_id, body.url, tuple(body.event_types), body.description, body.ordering
    )
    return created_response(await _service(request).create(spec))


async def list_webhooks(request: Request, query: WebhooksQuery) -> Response:
    return json_response(await _service(request).page(query.cursor, query.limit))


async def get_webhook(request: Request) -> Response:
    return json_response(await _service(request).get(_id(request)))


async def update_webhook(request: Request, body: UpdateWebhookBody) -> Response:
    changes: dict[str, Any] = {name: getattr(body, name) for name in body.model_fields_set}
    for name in ("url", "event_types", "disabled"):
        if name in changes and changes[name] is None:
            raise errors.InvalidRequest(
                f"invalid body: {name}: may not be null",
                errors=[{"field": name, "message": "may not be null"}],
            )
    return json_response(await _service(request).update(_id(request), changes))


async def delete_webhook(request: Request) -> Response:
    return json_response(await _service(request).delete(_id(request)))


async def rotate_secret(request: Request) -> Response:
    return json_response(await _service(request).rotate(_id(request)))


async def list_deliveries(request: Request, query: DeliveriesQuery) -> Response:
    found = await _service(request).deliveries(
        _id(request), query.status, query.cursor, query.limit
    )
    return json_response(found)


async def list_attempts(request: Request, query: AttemptsQuery) -> Response:
    webhook_id = str(request.path_params["webhook_id"])
    found = await _service(request).attempts(_id(request), webhook_id, query.cursor, query.limit)
    return json_response(found)


def check_replay_range(body: ReplayBody) -> None:
    """422 unless `until` (when given) is not below `after` (the console's form too)."""
    if body.until is not None and body.until < body.after:
        raise errors.InvalidRequest(
            "invalid body: until: must not be below after",
            errors=[{"field": "until", "message": "must not be below after"}],
        )


async def replay(request: Request, body: ReplayBody) -> Response:
    check_replay_range(body)
    return json_response(await _service(request).replay(_id(request), body.after, body.until), 202)


async def test_webhook(request: Request) -> Response:
    return json_response(await _service(request).test(_id(request)))


_NOT_FOUND: dict[type[errors.GroupBuyError], str] = {
    errors.EndpointNotFound: "no webhook endpoint has this id"
}
_ONE = "/v1/admin/webhooks/{endpoint_id}"

ENDPOINTS = [
    Endpoint(
        "POST",
        "/v1/admin/webhooks",
        create_webhook,
        "Register a webhook endpoint: every feed event of its types from now on is POSTed "
        "to it, signed per Standard Webhooks",
        role="admin",
        body=CreateWebhookBody,
        tag="webhooks",
        responses={
            201: "Registered; `secret` is shown here only",
            200: "The same endpoint was registered before (no secret)",
        },
        answer=wire.WebhookEndpointCreated,
        problems={errors.Conflict: "the endpoint id exists with other parameters"},
        audit="webhook.create",
    ),
    Endpoint(
        "GET",
        "/v1/admin/webhooks",
        list_webhooks,
        "List the webhook endpoints",
        role="admin",
        query=WebhooksQuery,
        tag="webhooks",
        responses={200: "A page of endpoints by id"},
        answer=wire.WebhookEndpointsPage,
    ),
    Endpoint(
        "GET",
        _ONE,
        get_webhook,
        "A webhook endpoint (without its secret)",
        role="admin",
        tag="webhooks",
        responses={200: "The endpoint"},
        answer=wire.WebhookEndpoint,
        problems=_NOT_FOUND,
    ),
    Endpoint(
        "PATCH",
        _ONE,
        update_webhook,
        "Change an endpoint's url, event types, description, or disable / enable it",
        role="admin",
        body=UpdateWebhookBody,
        tag="webhooks",
        responses={200: "The endpoint as changed"},
        answer=wire.WebhookEndpoint,
        problems=_NOT_FOUND,
        audit="webhook.update",
    ),
    Endpoint(
        "DELETE",
        _ONE,
        delete_webhook,
        "Remove an endpoint with its deliveries",
        role="admin",
        tag="webhooks",
        responses={200: "Removed"},
        answer=wire.WebhookDeleted,
        problems=_NOT_FOUND,
        audit="webhook.delete",
    ),
    Endpoint(
        "POST",
        f"{_ONE}/secret/rotate",
        rotate_secret,
        "Give the endpoint a new secret; the old one also signs for `[webhooks] secret_overlap_s`",
        role="admin",
        tag="webhooks",
        responses={200: "The new secret, shown here only"},
        answer=wire.WebhookSecretRotated,
        problems=_NOT_FOUND,
        audit="webhook.rotate_secret",
    ),
    Endpoint(
        "GET",
        f"{_ONE}/deliveries",
        list_deliveries,
        "The endpoint's deliveries whose attempt has ended, newest first, each with its "
        "newest attempts",
        role="admin",
        query=DeliveriesQuery,
        tag="webhooks",
        responses={200: "A page of deliveries"},
        answer=wire.WebhookDeliveriesPage,
        problems=_NOT_FOUND,
    ),
    Endpoint(
        "GET",
        f"{_ONE}/deliveries/{{webhook_id}}/attempts",
        list_attempts,
        "A delivery's attempts, newest first",
        role="admin",
        query=AttemptsQuery,
        tag="webhooks",
        responses={200: "A page of attempts"},
        answer=wire.WebhookAttemptsPage,
        problems={
            **_NOT_FOUND,
            errors.DeliveryNotFound: "the endpoint has no delivery with this webhook id",
        },
        path_params={
            "webhook_id": {
                "pattern": r"^evt_[0-9]{1,18}$",
                "description": "the delivery's `webhook_id` (`evt_<event id>`)",
            }
        },
    ),
    Endpoint(
        "POST",
        f"{_ONE}/replay",
        replay,
        "Queue the feed's events `after < id <= until` for the endpoint again (new attempts, "
        "the same webhook-id)",
        role="admin",
        body=ReplayBody,
        tag="webhooks",
        responses={202: "Queued; the deliverer sends them"},
        answer=wire.WebhookReplayQueued,
        problems=_NOT_FOUND,
        audit="webhook.replay",
    ),
    Endpoint(
        "POST",
        f"{_ONE}/test",
        test_webhook,
        "Send a `webhook.test` message now and answer with its attempt",
        role="admin",
        tag="webhooks",
        responses={200: "The attempt: status (or error) and duration"},
        answer=wire.WebhookTestAttempt,
        problems=_NOT_FOUND,
        audit="webhook.test",
    ),
]
