"""What every route shares: the Endpoint spec, ids, request parsing and validation, JSON answers.

JSON on the wire: answers rendered by orjson (the same bytes Starlette's JSONResponse
writes: compact, UTF-8, no NaN in our bodies, several times faster to produce), and the
checks on request bodies that the JSON parser does not make: the media type and
duplicate keys.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Self

import orjson
from groupbuy_client.wire import ID_PATTERN, Outcome
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from groupbuy import errors
from groupbuy.api import access, auditing
from groupbuy.api.access import Authenticator, actor
from groupbuy.settings import ApiKey, Settings

_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

Id = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
"""Every identifier of the API: 1-64 letters, digits, '_' or '-' (safe inside Redis keys)."""

# Free text the service keeps in SQL (an activity's name, a block's reason): any character
# but U+0000, which PostgreSQL's text types cannot hold; refused alike on every database.
TEXT_PATTERN = r"^[^\u0000]*$"


JSON_MEDIA_TYPE = "application/json"


def is_json_media_type(content_type: str) -> bool:
    """Whether a Content-Type header names JSON: `application/json`, any case, with no
    parameter but a UTF-8 charset (RFC 8259: JSON between systems is UTF-8)."""
    media_type, _, parameters = content_type.partition(";")
    if media_type.strip().lower() != JSON_MEDIA_TYPE:
        return False
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        name = name.strip().lower()
        if name and (name != "charset" or value.strip().strip('"').lower() not in _UTF8):
            return False
    return True


_UTF8 = frozenset({"utf-8", "utf8"})


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return found


def duplicate_key(raw: bytes) -> str | None:
    """The first key that appears twice in one object of the JSON text `raw`, at any depth
    (None when there is none, or when `raw` is not JSON: the validator says why)."""
    try:
        json.loads(raw, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey as exc:
        return exc.key
    except (ValueError, RecursionError):
        return None
    return None


_LEAVES = frozenset({str, int, float, bool, type(None)})


def _keys_in(value: Any) -> int:
    """How many object keys a parsed body holds: every key of a model (unknown keys are
    refused, so each key set a field), of a dict, at every depth."""
    if isinstance(value, BaseModel):
        fields = value.model_fields_set
        keys = len(fields)
        for name in fields:
            item = getattr(value, name)
            if type(item) not in _LEAVES:  # most fields: skip the checks below
                keys += _keys_in(item)
        return keys
    if isinstance(value, dict):
        return len(value) + sum(_keys_in(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(_keys_in(item) for item in value)
    return 0


def may_have_duplicate_keys(raw: bytes, parsed: BaseModel) -> bool:
    """False when `raw` certainly has no key twice in one object, cheaply (no second parse).

    With no backslash in the text, a quote is always a string's edge, so each `":` ends a
    key; when every colon of the text is such a one, the text holds exactly that many
    keys. The parser keeps one value per key, so a duplicate leaves the parsed body with
    fewer keys than the text. Any other text (escapes, a colon inside a value, a space
    before a colon) goes to the full check, duplicate_key().
    """
    if b"\\" in raw:
        return True
    key_colons = raw.count(b'":')
    return key_colons != raw.count(b":") or key_colons != _keys_in(parsed)


class FastJSONResponse(JSONResponse):
    """A JSONResponse whose body is rendered by orjson."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class StrictBody(BaseModel):
    """Base of request bodies: no unknown fields, no type coercion ("3" is not 3, and an
    integer is written as one: 1.0 and 1e3 are refused, though JSON Schema counts them as
    integers; the OpenAPI document says so in its 422 answers)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @classmethod
    def for_settings(cls, _settings: Settings) -> type[Self]:
        """This body as the running configuration bounds it; the same model unless a body
        has configured limits (it then returns a subclass with those bounds on its fields,
        so validation and the OpenAPI document both follow the settings)."""
        return cls


class LaxQuery(BaseModel):
    """Base of query-string models: values arrive as text, unknown parameters are refused."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def for_settings(cls, _settings: Settings) -> type[Self]:
        """As StrictBody.for_settings."""
        return cls


Handler = Callable[..., Awaitable[Response]]
Problems = Mapping[type[errors.GroupBuyError], str]
"""Error classes an endpoint answers, each with when it happens there."""


@dataclass(frozen=True)
class Endpoint:
    """One API operation: route, who may call it, what it takes and answers (also for OpenAPI)."""

    method: str
    path: str
    handler: Handler
    summary: str
    role: str | None = "service"
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    # Answers that are not problems, by status: what each means.
    responses: dict[int, str] = field(default_factory=dict)
    tag: str = "operations"
    media_type: str = "application/json"  # of the answers in `responses`
    # The shape of those answers' JSON body: a groupbuy_client.wire TypedDict (or OneOf union).
    answer: object | None = None
    # The problems this endpoint answers beyond the ones every endpoint of its kind does
    # (invalid_request, unauthorized, ...): each error class, and when it happens here.
    problems: Problems = field(default_factory=dict)
    # The rate limits it counts against (groupbuy/api/access.py): its class, and the
    # path parameter or body field naming the user it acts for. None: not limited.
    rate_class: str | None = None
    rate_user: str | None = None
    # JSON schemas of path parameters that are not ids (each still matches ID_PATTERN).
    path_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The audit log's name of what it does (e.g. "user.block"): the route (build_route)
    # writes its entry before the handler runs and withdraws it when the handler refuses,
    # whoever wrote the handler. None: not audited.
    audit: str | None = None
    # The handler commits its audit entry in the transaction of its own change (it reads
    # the actor from request.state.actor): the route writes none.
    audit_with_change: bool = False

    def configured(self, settings: Settings) -> Endpoint:
        """This endpoint with its body and query models bounded by the running settings."""
        return dataclasses.replace(
            self,
            body=None if self.body is None else _for_settings(self.body, settings),
            query=None if self.query is None else _for_settings(self.query, settings),
        )


def _for_settings(model: type[BaseModel], settings: Settings) -> type[BaseModel]:
    if issubclass(model, StrictBody | LaxQuery):
        return model.for_settings(settings)
    return model


def configured(endpoints: Iterable[Endpoint], settings: Settings) -> list[Endpoint]:
    """The endpoints as one app serves them: routes and OpenAPI document alike."""
    return [endpoint.configured(settings) for endpoint in endpoints]


def json_response(body: Any, status_code: int = 200) -> JSONResponse:
    """A JSON answer."""
    return FastJSONResponse(body, status_code=status_code)


def created_response(outcome: Outcome) -> JSONResponse:
    """201 with the body when the call created it, 200 when it found the same thing."""
    return json_response(outcome.body, 201 if outcome.created else 200)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) anything over `limit` bytes before reading it all."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise errors.PayloadTooLarge(f"request bodies are limited to {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise errors.PayloadTooLarge(f"request bodies are limited to {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


# pydantic's own words before a validator's message: the message alone says it.
_VALIDATOR_PREFIXES = ("Value error, ", "Assertion failed, ")


def _validation_problem(exc: ValidationError, where: str) -> errors.InvalidRequest:
    """422 naming each bad field once: `invalid body: team_size: ...`, and a fault of the
    whole body (not JSON, not an object) as `invalid body: ...`, not `body: body: ...`."""
    details, parts = [], []
    for err in exc.errors(include_url=False, include_context=False, include_input=False):
        message = str(err["msg"])
        for prefix in _VALIDATOR_PREFIXES:
            message = message.removeprefix(prefix)
        field = ".".join(str(p) for p in err["loc"])
        details.append({"field": field or where, "message": message})
        parts.append(f"{field}: {message}" if field else message)
    summary = "; ".join(parts)
    return errors.InvalidRequest(f"invalid {where}: {summary}", errors=details)


def _duplicate_problem(key: str) -> errors.InvalidRequest:
    return errors.InvalidRequest(
        f"invalid body: the key {key!r} appears twice in one object",
        errors=[{"field": key, "message": "duplicate key"}],
    )


def check_media_type(request: Request, raw: bytes) -> None:
    """A body must be declared `application/json` (415 otherwise); no body needs no type."""
    content_type = request.headers.get("content-type")
    if content_type is None and not raw:
        return  # parse_body says that a body is needed
    if content_type is None or not is_json_media_type(content_type):
        raise errors.UnsupportedMediaType(
            "request bodies must be JSON, sent with Content-Type: application/json",
            content_type=content_type,
        )


def parse_body(model: type[BaseModel], raw: bytes) -> BaseModel:
    """Validate a JSON object body strictly (422 on anything else, a key twice included)."""
    if not raw.strip():
        raise errors.InvalidRequest("the request needs a JSON object body")
    try:
        body = model.model_validate_json(raw)
    except ValidationError as exc:
        key = duplicate_key(raw)
        raise (_duplicate_problem(key) if key else _validation_problem(exc, "body")) from None
    # The parser keeps the last of two equal keys: {"amount_cents": 1, "amount_cents": 700}
    # would be read as 700 where another reader of the same bytes sees 1.
    if may_have_duplicate_keys(raw, body):
        key = duplicate_key(raw)
        if key is not None:
            raise _duplicate_problem(key)
    return body


def parse_query(model: type[BaseModel], request: Request) -> BaseModel:
    """Validate the query string (422 on unknown or bad parameters)."""
    params = request.query_params
    if any(len(params.getlist(name)) > 1 for name in params):
        raise errors.InvalidRequest("query parameters may appear once each")
    try:
        return model.model_validate(dict(params))
    except ValidationError as exc:
        raise _validation_problem(exc, "query") from None


def is_id(value: object) -> bool:
    """True when `value` is an id (SPEC §2): the whole text, a trailing newline refused."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def check_path_ids(request: Request) -> None:
    """Every path parameter is an id; refuse the rest before anything touches Redis."""
    for name, value in request.path_params.items():
        if not is_id(value):
            raise errors.InvalidRequest(
                f"{name} must match {ID_PATTERN}",
                errors=[{"field": name, "message": f"must match {ID_PATTERN}"}],
            )


def build_route(endpoint: Endpoint, auth: Authenticator, max_body_bytes: int) -> Route:
    """A Starlette route running auth, validation and then the endpoint's handler."""

    async def run(request: Request) -> Response:
        # A client address that failed too often is refused before its key is looked at.
        key = None
        if endpoint.role is not None:
            key = await access.authenticate(request, auth, endpoint.role)
        raw = await read_body(request, max_body_bytes)
        if key is not None and auth.must_check_signature(request, key):
            # Over the body bytes read once above, before any input is parsed or used.
            await access.check_signature(request, auth, key, raw)
        check_path_ids(request)
        kwargs: dict[str, Any] = {}
        if endpoint.query is not None:
            kwargs["query"] = parse_query(endpoint.query, request)
        elif request.query_params:
            raise errors.InvalidRequest("this endpoint takes no query parameters")
        if endpoint.body is not None:
            check_media_type(request, raw)
            kwargs["body"] = parse_body(endpoint.body, raw)
        ahead = None
        if endpoint.audit is not None and key is not None:
            # Who acts: the audit row's actor (a handler that writes its row itself reads it).
            request.state.actor = await actor(auth, key)
            if not endpoint.audit_with_change:
                body = kwargs.get("body")
                ahead = await auditing.record(request, endpoint.audit, request.state.actor, body)
        try:
            response = await _handled(request, endpoint, auth, key, kwargs)
        except errors.GroupBuyError as refused:
            if ahead is not None and refused.status_code < 500:
                await auditing.withdraw(request, ahead)
            raise
        if ahead is not None and not 200 <= response.status_code < 300:
            await auditing.withdraw(request, ahead)
        return response

    run.__name__ = endpoint.handler.__name__
    return Route(endpoint.path, run, methods=[endpoint.method])


async def _handled(
    request: Request,
    endpoint: Endpoint,
    auth: Authenticator,
    key: ApiKey | None,
    kwargs: dict[str, Any],
) -> Response:
    """The endpoint's handler's answer, counted against its rate limits when it has any."""
    if endpoint.rate_class is None or key is None:
        return await endpoint.handler(request, **kwargs)
    user_id = access.user_of(request, endpoint.rate_user, kwargs.get("body"))
    key_id = await auth.bucket_id(key)
    fields = await access.take(request, endpoint.rate_class, key_id, user_id)
    response = await endpoint.handler(request, **kwargs)
    response.raw_headers.extend(fields)
    return response


def build_routes(
    endpoints: Iterable[Endpoint], auth: Authenticator, max_body_bytes: int
) -> list[Route]:
    """The routes of the endpoints, in their order: one route per path, so a 405 names every
    method of the path in `Allow` (the router answers a wrong method with the first route
    whose path matched, which for a path of two routes named only its own method)."""
    by_path: dict[str, list[Route]] = {}
    for endpoint in endpoints:
        by_path.setdefault(endpoint.path, []).append(build_route(endpoint, auth, max_body_bytes))
    return [routes[0] if len(routes) == 1 else _one_route(routes) for routes in by_path.values()]


def _one_route(routes: list[Route]) -> Route:
    by_method = {method: route.endpoint for route in routes for method in route.methods or ()}

    async def dispatch(request: Request) -> Response:
        response: Response = await by_method[request.method](request)
        return response

    dispatch.__name__ = "_or_".join(route.name for route in routes)
    return Route(routes[0].path, dispatch, methods=list(by_method))
