"""The OpenAPI 3.1 document, generated from the same Endpoint list that builds the routes.

Answer bodies are the shapes of groupbuy_client.wire (as groupbuy.api.answers models them), under
components/schemas. Problem
answers list their stable `code`s (each with when it happens) in the schema of `code`,
taken from the error classes an Endpoint declares plus the ones every endpoint of its
kind may answer (invalid input, auth, size, a backing service down).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from groupbuy_client.wire import ID_PATTERN
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from groupbuy import __version__, errors
from groupbuy.api import answers
from groupbuy.api.access import accepted_roles
from groupbuy.api.endpoints import Endpoint
from groupbuy.settings import ROLES

_REF = "#/components/schemas/{model}"

_PROBLEM = {
    "type": "object",
    "description": "An RFC 9457 problem; errors may add fields of their own (listed per code).",
    "required": ["type", "title", "status", "code", "detail"],
    "properties": {
        "type": {"type": "string", "description": "a URI naming the problem type"},
        "title": {"type": "string", "description": "the same for every problem of one code"},
        "status": {"type": "integer", "description": "the HTTP status"},
        "code": {"type": "string", "description": "stable snake_case error code"},
        "detail": {"type": "string", "description": "this occurrence, in words"},
    },
    "additionalProperties": True,
}


# The fields of a rate-limited endpoint's answers (groupbuy/api/access.py); absent
# when [ratelimit] is off.
_RATE_FIELDS = {
    "RateLimit-Policy": {
        "description": 'the limits this request counted against, e.g. `"grab-key";q=100000;'
        'w=1, "grab-user";q=20;w=2` (draft-ietf-httpapi-ratelimit-headers-09)',
        "schema": {"type": "string"},
    },
    "RateLimit": {
        "description": 'where those limits stand, e.g. `"grab-key";r=99999;t=1, '
        '"grab-user";r=19;t=1`: `r` requests could follow now, full again in `t` seconds',
        "schema": {"type": "string"},
    },
}
_RETRY_AFTER = {
    "description": "whole seconds until the request would be let through",
    "required": True,
    "schema": {"type": "integer", "minimum": 1},
}


# Key guessing (SPEC §3, groupbuy/api/access.py): refused before the key is looked at.
_GUESSING = (
    "too many failed authentications from the client address (`[auth] guess_limit` within "
    "`guess_window_s`): every request from it is refused, whatever its key, until "
    '`Retry-After` seconds have passed; `limits` is `["auth-guesses"]`'
)


def common_problems(endpoint: Endpoint) -> dict[type[errors.GroupBuyError], str]:
    """The problems every endpoint of this kind may answer, whatever it does."""
    found: dict[type[errors.GroupBuyError], str] = {}
    checked = [
        what
        for what, present in (
            ("a path id", "{" in endpoint.path),
            ("a query parameter", endpoint.query is not None),
            ("the body", endpoint.body is not None),
        )
        if present
    ]
    if checked:
        found[errors.InvalidRequest] = (
            f"{' or '.join(checked)} is malformed, unknown, missing or out of range; "
            "`errors` lists each `field` and `message`"
            + (
                "; an integer is written without fraction or exponent (`1.0` and `1e3` are "
                "refused, though JSON Schema counts them as integers)"
                if endpoint.body is not None and _has_integer(_inlined(endpoint.body))
                else ""
            )
        )
    if endpoint.body is not None:
        found[errors.PayloadTooLarge] = "the body is over `[server] max_body_bytes`"
        found[errors.UnsupportedMediaType] = "the body is not sent as `application/json`"
        found[errors.RequestTimeout] = (
            "the body did not arrive within `[server] body_timeout_s` of the headers "
            "(nothing is applied; the connection is closed)"
        )
    if endpoint.role is not None:
        found[errors.Unauthorized] = "no `Authorization: Bearer` key, or an unknown one"
        found[errors.BadSignature] = (
            "the request must be signed (`[auth] signed_requests`, or a `+signed` key) or "
            "carries a signature, and it is missing, wrong, outside the clock skew or replayed; "
            "`reason`: missing, malformed, stale, wrong or replayed"
        )
        refused = _refused_roles(endpoint)
        if refused:
            found[errors.Forbidden] = f"the key's role is {refused}: it may not call this"
        found[errors.RedisUnavailable] = (
            "Redis did not answer (retrying is safe: every call is idempotent)"
        )
        found[errors.DatabaseUnavailable] = "the database did not answer"
        found[errors.RateLimited] = _GUESSING
        if endpoint.method != "GET":
            found[errors.RedisOutOfMemory] = (
                "Redis is over `maxmemory`: the call was refused before anything was applied"
            )
    if endpoint.rate_class is not None:
        found[errors.RateLimited] = (
            f"over a `{endpoint.rate_class}` rate limit of the API key"
            + (" or of the user" if endpoint.rate_user else "")
            + " ([ratelimit]); `Retry-After` and `retry_after_s` say when to retry, "
            "`limits` names the policies that refused; or " + _GUESSING
        )
    return found


def _has_integer(schema: Any) -> bool:
    if isinstance(schema, dict):
        return schema.get("type") == "integer" or any(_has_integer(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_integer(v) for v in schema)
    return False


def _param(name: str, where: str, required: bool, schema: dict[str, Any]) -> dict[str, Any]:
    param = {"name": name, "in": where, "required": required, "schema": schema}
    if "description" in schema:
        param["description"] = schema["description"]
    return param


def _parameters(endpoint: Endpoint) -> list[dict[str, Any]]:
    params = [
        _param(
            name,
            "path",
            True,
            {"type": "string", "pattern": ID_PATTERN, **endpoint.path_params.get(name, {})},
        )
        for name in re.findall(r"{(\w+)}", endpoint.path)
    ]
    if endpoint.query is not None:
        schema = endpoint.query.model_json_schema()
        required = set(schema.get("required", []))
        for name, prop in schema.get("properties", {}).items():
            params.append(_param(name, "query", name in required, prop))
    return params


def _problem_response(
    status: int, problems: Iterable[tuple[type[errors.GroupBuyError], str]]
) -> dict[str, Any]:
    listed = list(problems)
    codes = [{"const": cls.code, "description": when} for cls, when in listed]
    return {
        "description": "; ".join(f"{cls.code}: {when}" for cls, when in listed),
        "content": {
            "application/problem+json": {
                "schema": {
                    "allOf": [
                        {"$ref": _REF.format(model="Problem")},
                        {"properties": {"status": {"const": status}, "code": {"oneOf": codes}}},
                    ]
                }
            }
        },
    }


def _operation(endpoint: Endpoint) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for status, text in endpoint.responses.items():
        if endpoint.media_type != "application/json":
            schema: dict[str, Any] = {"type": "string"}
        elif endpoint.answer is not None:
            schema = {"$ref": _REF.format(model=answers.model(endpoint.answer).__name__)}
        else:
            raise ValueError(f"{endpoint.method} {endpoint.path}: a JSON answer needs its model")
        responses[str(status)] = {
            "description": text,
            "content": {endpoint.media_type: {"schema": schema}},
        }
    by_status: dict[int, list[tuple[type[errors.GroupBuyError], str]]] = {}
    common = common_problems(endpoint)
    # An endpoint may say what a common problem means for it (a confirm's 503).
    own = {cls: when for cls, when in endpoint.problems.items() if cls in common}
    for cls, when in {**endpoint.problems, **common, **own}.items():
        by_status.setdefault(cls.status_code, []).append((cls, when))
    for status, listed in by_status.items():
        if str(status) in responses:
            raise ValueError(f"{endpoint.path}: status {status} is both an answer and a problem")
        responses[str(status)] = _problem_response(status, listed)
    if endpoint.rate_class is not None:
        for answered, response in responses.items():
            response["headers"] = dict(_RATE_FIELDS)
            if answered == "429":
                response["headers"]["Retry-After"] = _RETRY_AFTER
    if "429" in responses:
        responses["429"].setdefault("headers", {})["Retry-After"] = _RETRY_AFTER
    operation: dict[str, Any] = {
        "summary": endpoint.summary,
        "operationId": endpoint.handler.__name__,
        "tags": [endpoint.tag],
        "parameters": _parameters(endpoint),
        "responses": dict(sorted(responses.items())),
    }
    if endpoint.role is not None:
        roles = accepted_roles(endpoint.method, endpoint.role)
        operation["x-role"] = endpoint.role
        operation["x-roles"] = list(roles)
        operation["security"] = [{"bearer": []}]
        operation["description"] = f"Accepts {_or(roles)} keys."
        if endpoint.audit is not None:
            operation["x-audit"] = endpoint.audit
            operation["description"] += (
                f" Each call that is not refused is written to the audit log as"
                f" `{endpoint.audit}`, before it runs."
            )
    else:
        operation["security"] = []
        operation["description"] = "Needs no key."
    if endpoint.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _inlined(endpoint.body)}},
        }
    return operation


def _inlined(body: type[BaseModel]) -> dict[str, Any]:
    """A request body's JSON schema with its nested models written in place (a body's
    parts are not shared, so they need no name of their own under components)."""
    schema = body.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return resolve(
                    {
                        **defs[ref.removeprefix("#/$defs/")],
                        **{k: v for k, v in node.items() if k != "$ref"},
                    }
                )
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return dict(resolve(schema))


def _answer_schemas(endpoints: list[Endpoint]) -> dict[str, Any]:
    models: list[type[BaseModel]] = []
    for endpoint in endpoints:
        if endpoint.answer is not None and answers.model(endpoint.answer) not in models:
            models.append(answers.model(endpoint.answer))
    if not models:
        return {}
    _keys, top = models_json_schema(
        [(model, "serialization") for model in models], ref_template=_REF
    )
    return dict(top.get("$defs", {}))


def build_openapi(endpoints: list[Endpoint]) -> dict[str, Any]:
    """The whole OpenAPI document."""
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "groupbuy",
            "version": __version__,
            "description": "Group-buy seat locking and red-packet grabbing, decided in Redis.",
        },
        "paths": paths,
        "components": {
            "schemas": {"Problem": _PROBLEM, **_answer_schemas(endpoints)},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _or(roles: Sequence[str]) -> str:
    named = [f"`{role}`" for role in roles]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " or " + named[-1]


def _refused_roles(endpoint: Endpoint) -> str:
    """The roles with keys that an endpoint answers 403 (empty when it accepts every one)."""
    assert endpoint.role is not None
    accepted = accepted_roles(endpoint.method, endpoint.role)
    return (
        _or([role for role in ROLES if role not in accepted]) if len(accepted) < len(ROLES) else ""
    )
